"""Your evaluation metrics: the per-image ones are computed in step.py's eval_step for this GAN.

This file is yours: `copier update` keeps your edits here.
"""

import numpy as np


def dataset_metrics(means: dict[str, float], gathered: dict[str, np.ndarray]) -> dict[str, float]:
    """Diversity: how far apart the drawn images of a digit are, relative to real images of it.

    The mean distance between two drawn images of the same class, over that between two real
    ones, averaged over the classes: about 1 when the generator varies its digits as people do,
    near 0 when it draws one image per class (mode collapse), which the judge alone would not see.
    `quality`, class accuracy times diversity (capped at 1), picks the best checkpoint.
    """
    drawn, real, labels = gathered["drawn"].astype(np.float64), gathered["real"], gathered["label"]
    ratios = [
        _mean_pairwise_distance(drawn[labels == digit]) / _mean_pairwise_distance(real[labels == digit])
        for digit in np.unique(labels)
    ]
    diversity = float(np.mean(ratios))
    return {"diversity": diversity, "quality": means["class_accuracy"] * min(diversity, 1.0)}


def _mean_pairwise_distance(images: np.ndarray) -> float:
    count = len(images)
    distances = np.linalg.norm(images[:, None, :] - images[None, :, :], axis=-1)
    return float(distances.sum() / max(1, count * (count - 1)))

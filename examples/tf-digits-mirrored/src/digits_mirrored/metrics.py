"""Your evaluation metrics, as Keras metric objects.

This file is yours: `copier update` keeps your edits here.
"""

import keras


def build_metrics() -> dict[str, keras.metrics.Metric]:
    """Return the metrics to evaluate, by name; each is called as `update_state(targets, outputs)`.

    The engine builds them under `strategy.scope()`, so each replica updates its own copy of a
    metric's state with its own samples, and `result()` sums those copies over all replicas
    first: every validation or test sample counts exactly once, also for metrics that are not a
    mean over samples (`keras.metrics.AUC`, `keras.metrics.F1Score`). `result()` must be a scalar.
    """
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}

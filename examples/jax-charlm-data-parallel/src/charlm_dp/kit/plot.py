"""Plot a run's curves: `python -m charlm_dp.kit.plot RUN_DIR`. Managed by the looptpl template.

Writes RUN_DIR/plots/loss.png (every training and validation loss per epoch) and one PNG per
other validation metric. Needs matplotlib: `pip install -e ".[plot]"`.
"""

import argparse
import json
import sys
from pathlib import Path


def load_records(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist; pass the --run-dir of a run")
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def plot(run_dir: Path) -> list[Path]:
    """Write the PNGs and return their paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no window
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise SystemExit('error: plotting needs matplotlib; run `pip install -e ".[plot]"`') from None
    records = load_records(run_dir)
    epochs = [record["epoch"] for record in records]
    # One loss, or one per stage of a step with several models (train_generator_loss, ...).
    losses = [name for name in records[0] if name.startswith(("train_", "val_")) and name.endswith("_loss")]
    panels = {"loss": losses} if losses else {}
    for name in records[0]:
        if name.startswith("val_") and name not in losses and name != "val_samples":
            panels[name.removeprefix("val_")] = [name]
    output = run_dir / "plots"
    output.mkdir(exist_ok=True)
    written = []
    for title, names in panels.items():
        figure, axes = plt.subplots(figsize=(6, 4))
        for name in names:
            axes.plot(epochs, [record[name] for record in records], marker="o", label=name)
        axes.set(xlabel="epoch", ylabel=title, title=f"{title} ({run_dir.name})")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(output / f"{title}.png", dpi=120)
        plt.close(figure)
        written.append(output / f"{title}.png")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot the per-epoch metrics of a run.")
    parser.add_argument("run_dir", type=Path, help="The --run-dir of a training run.")
    for path in plot(parser.parse_args(argv).run_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

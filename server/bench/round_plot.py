"""The plot the paired-round benchmarks share: one line of a rate per round for each contender."""

from __future__ import annotations

from pathlib import Path


def plot_rounds(runs: dict[str, list[float]], path: Path, title: str, ylabel: str = "decode tokens/s") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in runs.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", label=name)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

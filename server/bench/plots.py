"""The figure every suite draws into: small PNGs (matplotlib, Agg), one row of panels."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def figure(path, panels: int = 1, width: float = 4.5, height: float = 3.4):
    """Yields the axes (one, or a tuple of ``panels``); saves to ``path`` at 80 dpi on exit."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels, height), squeeze=False)
    try:
        yield axes[0][0] if panels == 1 else tuple(axes[0])
        fig.tight_layout()
        fig.savefig(path, dpi=80)
    finally:
        plt.close(fig)

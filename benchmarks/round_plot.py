"""The paired-rounds plot: `maskd bench` owns it (server/bench/round_plot.py); re-exported here."""

from server.bench.round_plot import plot_rounds  # noqa: F401

"""The benchmarks' live server: `maskd bench` owns it (server/bench/live_server.py); re-exported here."""

from server.bench.live_server import live_server, metric  # noqa: F401

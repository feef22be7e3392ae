"""Time to first token of N agents sharing a ~1,500-token system-and-tools prefix, through the real
server (the `prefix` suite of `maskd bench`, server/bench/prefix.py).

    python benchmarks/prefix_bench.py [--agents 8] [--rounds 3] [--prefix-tokens 1500]

Agent 1 prefills the whole prefix, agents 2..N should reuse it. Target: every TTFT of agents 2..N
<= 0.25x agent 1's. Writes benchmarks/results/prefix.json and prefix.png.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from server.bench.context import BenchContext, Sizes
from server.bench.run import run_suite

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    sizes = dataclasses.replace(Sizes(), agents=args.agents, prefix_rounds=args.rounds, prefix_tokens=args.prefix_tokens)
    ctx = BenchContext(model=None, device="auto", models=None, quick=False, tiny=False, schemas=None, sizes=sizes)
    run_suite("prefix", ctx, RESULTS, max_tokens=args.max_tokens)


if __name__ == "__main__":
    main()

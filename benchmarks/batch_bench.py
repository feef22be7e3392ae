"""Aggregate throughput of N concurrent chat requests against one at a time, through the real
server (continuous batching): the `batch` suite of `maskd bench` (server/bench/batch.py).

    python benchmarks/batch_bench.py [--requests 8] [--tokens 64] [--rounds 2]

Every request is greedy with ignore_eos, so each yields exactly --tokens tokens, and the batched
texts must equal the ones served alone. Target: concurrent tokens/s >= 3x serial. Writes
benchmarks/results/batch.json and batch.png.
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
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sizes = dataclasses.replace(Sizes(), concurrency=(1, args.requests), batch_tokens=args.tokens)
    ctx = BenchContext(model=None, device="auto", models=None, quick=False, tiny=False, schemas=None, sizes=sizes)
    result = run_suite("batch", ctx, RESULTS, rounds=args.rounds)
    if not result["outputs_equal"]:
        raise SystemExit("batched greedy outputs differ from the ones served alone")


if __name__ == "__main__":
    main()

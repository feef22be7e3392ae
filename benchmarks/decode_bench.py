"""Decode tokens/s: maskd's engine unconstrained and constrained against transformers' generate(),
same prompt, same run (the `overhead` suite of `maskd bench`, server/bench/overhead.py).

    python benchmarks/decode_bench.py [--tokens 64] [--rounds 5] [--model NAME]

Rounds alternate the contenders so that machine noise hits all alike; the verdicts are ratios of
medians (maskd / generate() target >= 0.90; constrained / unconstrained target >= 0.97).
Writes benchmarks/results/overhead.json and overhead.png.
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
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    sizes = dataclasses.replace(Sizes(), tokens=args.tokens, rounds=args.rounds)
    ctx = BenchContext(model=args.model, device=args.device, models=None, quick=False, tiny=False, schemas=None,
                       sizes=sizes)
    run_suite("overhead", ctx, RESULTS)


if __name__ == "__main__":
    main()

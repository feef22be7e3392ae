"""The engine step (issue 13's measures), all modes in one run: forced text in one pass on BFCL tool
calls (passes per generated token, seconds per call on vs off), 8-row decode steps against a bare
StaticCache forward at 100 and 3,000 tokens, a long prompt arriving while 7 rows decode, and a soak
under a KV budget below the prompts' sum (the `engine` suite of server/bench).

    python benchmarks/engine_bench.py [--quick] [--model NAME] [--device auto]

Writes benchmarks/results/engine_step.json and engine_step.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from server.bench.context import BenchContext
from server.bench.run import run_suite

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    ctx = BenchContext(model=args.model, device=args.device, models=None, quick=args.quick, tiny=args.tiny,
                       schemas=None)
    run_suite("engine_step", ctx, RESULTS)


if __name__ == "__main__":
    main()

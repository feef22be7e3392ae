"""Grammar benchmark over the full MaskBench function-calling subsets: compile coverage and time,
cache hits, grammar memory, per-token mask cost (the `compile` suite of `maskd bench`,
server/bench/compile.py, whose docstring says what each number means).

    python benchmarks/grammar_bench.py [--quick] [--limit N] [--timeout S] [--walks 30] [--steps 120]
                                       [--model gemma3-270m] [--no-outlines]

Schemas: MaskBench BFCL, Glaiveai2K, MCPspec, JME from ../shared/data/maskbench (first --limit of
each; --quick: 10). Writes benchmarks/results/compile.json and compile.png.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from server.bench.context import BenchContext, Sizes
from server.bench.run import run_suite
from server.bench.schemas import MASKBENCH, load_rows

RESULTS = Path(__file__).resolve().parent / "results"
SUBSETS = ["BFCL", "Glaiveai2K", "MCPspec", "JME"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 schemas per subset, short walks")
    ap.add_argument("--limit", type=int, default=None, help="schemas per subset (default all)")
    ap.add_argument("--timeout", type=float, default=10.0, help="compile time limit, s")
    ap.add_argument("--walks", type=int, default=30, help="random walks for the mask cost")
    ap.add_argument("--steps", type=int, default=120, help="max tokens per walk")
    ap.add_argument("--model", default=None, help="a models.yaml name (default: the embedded model); "
                    "gemma3-270m for the 262k vocabulary (`make gemma` first)")
    ap.add_argument("--no-outlines", action="store_true",
                    help="skip outlines-core used directly (its index takes seconds per schema)")
    args = ap.parse_args()
    sizes = dataclasses.replace(Sizes(), compile_per_subset=args.limit or (10 if args.quick else 10**9),
                                walks=8 if args.quick else args.walks, steps=args.steps)
    rows = [row for name in SUBSETS for row in load_rows(MASKBENCH / f"{name}.jsonl.gz")]
    ctx = BenchContext(model=args.model, device="cpu", models=None, quick=args.quick, tiny=False, schemas=None,
                       sizes=sizes, rows=rows)
    run_suite("compile", ctx, RESULTS, timeout_s=args.timeout, outlines=not args.no_outlines)


if __name__ == "__main__":
    main()

"""Tight max_tokens over MaskBench's BFCL function schemas: the shares of valid, truncated and invalid
outputs, maskd vs the installed peers, xgrammar, outlines, llguidance and llama-cpp-python (the `budget` suite of
`maskd bench`, server/bench/budget.py,
whose docstring says how each output is judged).

    python benchmarks/budget_bench.py [--stride 26] [--limit N] [--slacks 0,5,20] [--stream-all] [--no-peers]
                                      [--free-only] [--model gemma3-270m]

Every --stride-th BFCL row of ../shared/data/maskbench, the embedded model (or --model), greedy. Writes
benchmarks/results/budget.json and budget.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from grammars.schema.free_values import mark_free_values
from server.bench.context import BenchContext, Sizes
from server.bench.run import run_suite
from server.bench.schemas import MASKBENCH, load_rows

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stride", type=int, default=26, help="take every k-th BFCL schema (default 26: 41)")
    parser.add_argument("--limit", type=int, default=None, help="at most N schemas")
    parser.add_argument("--slacks", default="0,5,20", help="tokens above the shortest valid output")
    parser.add_argument("--stream-all", action="store_true",
                        help="stream the tools task at every slack (default: at the smallest slack only)")
    parser.add_argument("--no-peers", action="store_true", help="maskd only (no peers)")
    parser.add_argument("--model", default=None, help="a models.yaml name (default: the embedded model); "
                        "`make gemma` first for gemma3-270m, the 262k vocabulary")
    parser.add_argument("--free-only", action="store_true",
                        help="only schemas with free-form values ({}, {type: object}, arrays without items: 100 of BFCL)")
    args = parser.parse_args()
    rows = load_rows(MASKBENCH / "BFCL.jsonl.gz")
    if args.free_only:
        rows = [r for r in rows if "maskdfree" in json.dumps(mark_free_values(r["schema"])[0])]
    rows = rows[::args.stride][:args.limit]
    sizes = dataclasses.replace(Sizes(), budget_schemas=len(rows), slacks=tuple(int(s) for s in args.slacks.split(",")))
    ctx = BenchContext(model=args.model, device="auto", models=None, quick=False, tiny=False, schemas=None, sizes=sizes,
                       rows=rows)
    run_suite("budget", ctx, RESULTS, no_peers=args.no_peers, stream_all=args.stream_all,
              log=lambda line: print(line, file=sys.stderr, flush=True))


if __name__ == "__main__":
    main()

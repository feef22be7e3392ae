"""`maskd bench`: runs the suites on one model and device, with a progress bar per suite, prints
their tables, and writes results.json, a PNG per suite and summary.md into --out.

In-process suites (overhead, compile, budget) run first on one loaded model; the HTTP suites
(tools, prefix, batch) then run against one `maskd serve` of the same model, started once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

SUITES = ("overhead", "compile", "languages", "budget", "speed", "tools", "prefix", "batch")  # in the order they run


def progress(name: str, total: int):
    """A bar on stderr for one suite (tqdm, a dependency of maskd)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{name:9}", file=sys.stderr, leave=True, dynamic_ncols=True,
                bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}<{remaining}]")


def add_parser(sub) -> None:
    """The `bench` subcommand of the `maskd` parser."""
    bench = sub.add_parser("bench", help="measure constrained-decoding overhead, compile, tools, budget, prefix "
                                         "reuse and batching on a model; writes JSON, PNG plots and markdown")
    bench.add_argument("--model", default=None, help="a name from models.yaml (default: its `default`)")
    bench.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:1 ...")
    bench.add_argument("--suite", default="all", choices=(*SUITES, "all"), help="which suite to run (default all)")
    bench.add_argument("--schemas", default=None,
                       help="MaskBench .jsonl.gz file or directory of them (default: the sample shipped with maskd)")
    bench.add_argument("--quick", action="store_true", help="small sizes: minutes on a CPU")
    bench.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the test's: every suite, minimal
    bench.add_argument("--out", default="bench-results", help="directory for results.json, *.png, summary.md")
    bench.add_argument("--results-md", default=None,
                       help="also refresh this device's section of a markdown file (make bench: benchmarks/RESULTS.md)")
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from server.bench import report
    from server.bench.context import BenchContext

    suites = SUITES if args.suite == "all" else (args.suite,)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = BenchContext(model=args.model, device=args.device, models=args.models, quick=args.quick, tiny=args.tiny,
                       schemas=args.schemas)
    started = time.perf_counter()
    command = f"maskd bench --suite {args.suite}" + (" --quick" if args.quick else "") + (
        f" --model {args.model}" if args.model else "") + (f" --schemas {args.schemas}" if args.schemas else "")
    results = {"command": command,
               "model": ctx.spec().name, "device": None, "quick": args.quick, "tiny": args.tiny,
               "schemas": args.schemas or "package sample", "machine": report.machine(), "suites": {}}
    failed = []
    try:
        begun = time.perf_counter()
        ctx.stack()  # every suite runs on the model loaded here (the live server's too)
        results["load_seconds"] = time.perf_counter() - begun
        for name in suites:
            module = importlib.import_module(f"server.bench.{name}")
            begun = time.perf_counter()
            entry = results["suites"][name] = {"status": "ok"}
            try:
                entry["result"] = module.run(ctx, progress)
                entry["plot"] = f"{name}.png"
                module.plot(entry["result"], out / entry["plot"])
            except Exception as exc:  # noqa: BLE001 - a failed suite is reported; the others still run
                import traceback

                traceback.print_exc()
                entry.update(status="failed", error=f"{type(exc).__name__}: {exc}", plot=None)
                failed.append(name)
            entry["seconds"] = time.perf_counter() - begun
            if entry["status"] == "ok":
                for table in entry["result"]["tables"]:
                    print("\n" + report.text_table(table))
            if ctx._stack is not None:
                results["device"] = str(ctx._stack.loaded.device)
    finally:
        ctx.close()
    if results["device"] is None:
        from engine.model_loader import pick_device
        results["device"] = str(pick_device(args.device))
    results["seconds"] = time.perf_counter() - started
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report.write(results, out)
    if args.results_md:
        report.refresh_results_md(results, Path(args.results_md), out)
    print(f"\nmaskd bench: wrote {out}/results.json, summary.md and "
          f"{len([s for s in results['suites'].values() if s.get('plot')])} plots"
          + (f"; failed suites: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


def run_suite(name: str, ctx, out_dir: Path, **options) -> dict:
    """One suite for a developer script in benchmarks/: runs it, prints its tables, ratios and notes,
    and writes <name>.json and <name>.png into ``out_dir``. ``options`` go to the suite's run()."""
    import json

    from server.bench import report

    module = importlib.import_module(f"server.bench.{name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = module.run(ctx, progress, **options)
    finally:
        ctx.close()
    module.plot(result, out_dir / f"{name}.png")
    for table in result["tables"]:
        print("\n" + report.text_table(table))
    for key, value in (result.get("ratios") or {}).items():
        print(f"{key} = {value:.3f}" if value is not None else f"{key}: -")
    for note in result.get("notes") or []:
        print(note)
    (out_dir / f"{name}.json").write_text(json.dumps({"machine": report.machine(), **result}, indent=1, default=str))
    print(f"wrote {out_dir / (name + '.json')} and {name}.png")
    return result

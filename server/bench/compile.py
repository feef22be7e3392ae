"""Suite `compile`: grammar compile coverage and time, cache hits, grammar memory, per-token mask cost.

Schemas: the run's schema set (the package's MaskBench sample, or --schemas), the first N of each
subset. Engines (server/bench/compile_engines.py), each schema compiled by each in turn: maskd
(GrammarCompiler: schema checks, normalizer, killable worker, caches: cold, warm = in memory, disk =
a fresh compiler reading the disk cache), outlines-core used directly (default whitespace, no
checks), and xgrammar / llguidance where installed (skipped otherwise; compact JSON, as maskd's).
Mask cost (server/bench/mask_walks.py): fill + apply per token along random-logit constrained walks
(a stand-in for real generations), each walk run on every engine in turn. maskd masks as the engine
does (ConstraintMasker: the per-state sparse id lists on CPU, stored at compile time), first visits
of states included; maskd-warm repeats the same walk with every state memoised; maskd-packed
repeats it with the packed-bitmask apply (fill + apply_token_bitmask_inplace, the CUDA path), its
rows memoised by an untimed run first.
"valid output": of the schemas maskd or outlines-core compiled, how many gave an output (random
logits, budget = shortest valid length + 30, so budget-aware masks close it) that validates with
jsonschema against the original schema; for outlines-core used directly, whatever constraints it
drops show up here. The peers know no shortest length to close by: their outputs under budgets
are the `budget` suite's. Grammar memory: the compiled grammars' own size estimate (nbytes).
"""

from __future__ import annotations

import torch

from server.bench.compile_engines import MaskdCompiles, OutlinesDirect, PeerCompiles
from server.bench.mask_walks import walk_llguidance, walk_maskd, walk_xgrammar
from server.bench.peers import Peers
from server.bench.stats import pct


def compile_all(stack, schemas, timeout_s, keep, tick, outlines: bool = True) -> tuple[dict, dict[str, str]]:
    """Every schema compiled by every engine in turn, then maskd's disk pass: the engines by name,
    and the peers skipped with why. ``outlines`` False: no outlines-core used directly (its index
    takes seconds per schema)."""
    tok, vocab = stack.loaded.tokenizer, stack.vocabulary
    peers = Peers(stack, names=("xgrammar", "llguidance"))
    engines = {"maskd": MaskdCompiles(vocab, timeout_s, keep, tok),
               **({"outlines-core": OutlinesDirect(vocab, timeout_s, tok)} if outlines else {}),
               **{name: PeerCompiles(peer, keep, warm=name == "xgrammar") for name, peer in peers.ready.items()}}
    try:
        for i, (_, schema) in enumerate(schemas):
            tick()
            for engine in engines.values():
                engine.compile(i, schema)
        if outlines:
            engines["outlines-core"].close()  # its worker idle beside the disk pass
        engines["maskd"].disk()
    finally:
        for engine in engines.values():
            engine.close()
    return engines, peers.skipped


def mask_walks(engines, stack, walks, steps) -> dict[str, list[float]]:
    """The first ``walks`` schemas' walks, each on every engine that compiled it, in turn."""
    tok, vocab = stack.loaded.tokenizer, stack.vocabulary
    maskd = engines["maskd"].kept
    walkers = {"maskd": lambda i: walk_maskd(maskd[i], tok, vocab, steps, i),
               "maskd-warm": lambda i: walk_maskd(maskd[i], tok, vocab, steps, i),
               "maskd-packed": lambda i: walk_maskd(maskd[i], tok, vocab, steps, i, packed=True)}
    if "xgrammar" in engines:
        walkers["xgrammar"] = lambda i: walk_xgrammar(engines["xgrammar"].kept[i], tok, vocab, steps, i)
    if "llguidance" in engines:
        llg = engines["llguidance"]
        walkers["llguidance"] = lambda i: walk_llguidance(llg.peer, llg.kept[i], tok, vocab, steps, i)
    kept = {"maskd-warm": maskd, "maskd-packed": maskd, **{name: engines[name].kept for name in walkers
                                                           if name in engines}}
    mask_us = {name: [] for name in walkers}
    for i in range(walks):
        for name, walker in walkers.items():
            if i not in kept[name]:
                continue
            if name in ("maskd-warm", "maskd-packed"):  # the same walk untimed first: every state memoised
                walker(i)
            mask_us[name] += walker(i)
    return mask_us


def summarize(name, res, total):
    row = {"engine": name, "compiled": res.get("ok"), "total": total,
           "valid_output": res["generated"].get("valid", 0) if "generated" in res else None}
    for key in ("cold_ms", "warm_us", "disk_ms"):
        vals = res.get(key) or []
        row[f"{key}_p50"] = pct(vals, 0.5)
        row[f"{key}_p90"] = pct(vals, 0.9)
    return row




def run(ctx, progress, timeout_s: float = 10.0, outlines: bool = True) -> dict:
    """The suite: compile the run's schemas (the first N of each subset) with every engine, then the
    mask walks over the first ``walks`` schemas, on each engine that compiled them (``outlines``
    False: without outlines-core used directly)."""
    from server.bench.schemas import per_subset
    from server.bench.stats import fmt

    stack = ctx.stack()
    sizes, vocab = ctx.sizes, stack.vocabulary
    rows = per_subset(ctx.rows, sizes.compile_per_subset)
    schemas = [(row["subset"], row["schema"]) for row in rows]
    n, walks, steps = len(schemas), sizes.walks, sizes.steps
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the mask runs on the engine thread, alone
    bar = progress("compile", n + 1)
    try:
        engines, skipped = compile_all(stack, schemas, timeout_s, walks, bar.update, outlines)
        mask_us = mask_walks(engines, stack, walks, steps)
        bar.update()
    finally:
        torch.set_num_threads(torch_threads)
        bar.close()
    compile_results = {name: engine.res for name, engine in engines.items()}
    maskd, outlines = compile_results["maskd"], compile_results.get("outlines-core", {"generated": "not run"})
    summary = [summarize(k, v, n) for k, v in compile_results.items()]
    mem = maskd["grammar_bytes"]
    ratios = {}
    for peer in ("xgrammar", "llguidance"):
        theirs = compile_results.get(peer, {})
        for key, label in (("cold_ms", "cold compile"), ("warm_us", "warm compile")):
            if theirs.get(key) and maskd[key]:
                ratios[f"maskd / {peer} {label} p50"] = pct(maskd[key], 0.5) / pct(theirs[key], 0.5)
        if peer in mask_us and mask_us[peer]:
            ratios[f"maskd-warm / {peer} mask p50"] = pct(mask_us["maskd-warm"], 0.5) / pct(mask_us[peer], 0.5)
    table = [[r["engine"], f"{r['compiled']}/{r['total']}", fmt(r["valid_output"], "d"),
              fmt(r["cold_ms_p50"], ".2f"), fmt(r["cold_ms_p90"], ".2f"), fmt(r["warm_us_p50"], ".1f"),
              fmt(r["disk_ms_p50"], ".2f")] for r in summary]
    table += [[name, "skipped", "-", "-", "-", "-", "-"] for name in skipped]
    masks = [[k, str(len(v)), fmt(pct(v, 0.5)), fmt(pct(v, 0.99))] for k, v in mask_us.items()]
    masks += [[name, "skipped", "-", "-"] for name in skipped]
    subsets = sorted({s for s, _ in schemas})
    return {
        "schemas": n, "subsets": subsets, "timeout_s": timeout_s, "compile": compile_results,
        "summary": summary, "mask_us": mask_us, "skipped": skipped, "ratios": ratios,
        "mask_summary": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v)} for k, v in mask_us.items()},
        "grammar_bytes": {"p50": pct(mem, 0.5), "max": max(mem) if mem else None, "total": sum(mem)},
        "notes": [f"maskd refusals by keyword: {maskd['unsupported_keywords'] or 'none'}; timeouts "
                  f"{maskd['timeout']}, errors {maskd['error']}.",
                  f"Generated outputs (random logits, budget = shortest + 30) judged by jsonschema: maskd "
                  f"{maskd['generated']}, outlines-core direct {outlines['generated']}.",
                  f"maskd grammar memory: p50 {fmt(pct(mem, 0.5) and pct(mem, 0.5) / 1024, '.0f')} KiB, max "
                  f"{fmt(max(mem) / 1024 if mem else None, '.0f')} KiB, total {sum(mem) / 2**20:.1f} MiB "
                  f"over {len(mem)} grammars."]
                 + [f"{k}: skipped ({v})." for k, v in skipped.items()],
        "tables": [
            {"title": f"Grammar compile, {n} schemas ({', '.join(subsets)}), time limit {timeout_s:g} s",
             "columns": ["engine", "compiled", "valid output", "cold p50 ms", "cold p90 ms", "warm p50 µs",
                         "disk p50 ms"], "rows": table},
            {"title": f"Per-token mask cost (fill + apply, CPU, {vocab.size} vocab), random walks",
             "columns": ["engine", "tokens", "p50 µs", "p99 µs"], "rows": masks},
        ],
    }


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    with figure(path, 2) as (ax1, ax2):
        for name, res in result["compile"].items():
            vals = sorted(res.get("cold_ms") or [])
            if vals:
                ax1.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))], label=name)
        ax1.set_xscale("log"), ax1.set_xlabel("cold compile time (ms)"), ax1.set_ylabel("CDF")
        ax1.legend(fontsize=7), ax1.set_title(f"compile time, {result['schemas']} schemas", fontsize=9)
        names = [n for n, v in result["mask_us"].items() if v]
        if names:
            ax2.boxplot([result["mask_us"][n] for n in names], showfliers=False)
            ax2.set_xticks(range(1, len(names) + 1), names, fontsize=7)
        ax2.set_ylabel("fill + apply per token (µs)"), ax2.set_title("per-token mask cost", fontsize=9)

"""Suite `compile`: grammar compile coverage and time, cache hits, grammar memory, per-token mask cost.

Schemas: the run's schema set (the package's MaskBench sample, or --schemas), the first N of each
subset. Engines: maskd (GrammarCompiler: schema checks, normalizer, killable worker, caches: cold,
warm = in memory, disk = a fresh compiler reading the disk cache), outlines-core used directly
(default whitespace, no checks), and xgrammar / llguidance where importable (skipped otherwise).
Mask cost: fill + apply per token along random-logit constrained walks (a stand-in for real
generations). maskd masks as the engine does (ConstraintMasker: the per-state sparse id lists on
CPU, stored at compile time), first visits of states included; maskd-warm repeats the same walks
with every state memoised; maskd-packed repeats them with the packed-bitmask apply (fill +
apply_token_bitmask_inplace, the CUDA path), its rows memoised by an untimed run first.
"valid output": of the schemas an engine compiled, how many gave an output (random logits, budget =
shortest valid length + 30, so budget-aware masks close it) that validates with jsonschema against
the original schema; for outlines-core used directly, whatever constraints it drops show up here.
Grammar memory: the compiled grammars' own size estimate (nbytes) where they have one.
"""

from __future__ import annotations

import json
import pickle
import tempfile
import time

import torch

from grammars import (
    CompileTimeout,
    GrammarCompiler,
    GrammarError,
    UnsupportedSchemaError,
)
from grammars.compile_worker import CompileWorker
from grammars.compiled_grammar import CompiledGrammar
from server.bench.mask_walks import mask_llguidance, mask_maskd, mask_xgrammar
from server.bench.stats import pct


def generated_verdict(grammar, schema, tok, seed, slack=30):
    """Decode one output under ``grammar`` with random logits and a budget of its shortest valid
    length + ``slack`` (budget-aware masks close it), then judge it with jsonschema."""
    import jsonschema

    gen = torch.Generator().manual_seed(seed)
    matcher, ids = grammar.matcher(), []
    budget = grammar.min_tokens(grammar.initial_state) + slack
    row = torch.zeros(grammar.width, dtype=torch.int32)
    shifts = torch.arange(32, dtype=torch.int32)
    while len(ids) < budget and not matcher.is_terminated():
        forced = matcher.forced()[:budget - len(ids)]
        for token in forced or []:
            matcher.advance(token)
        ids += forced
        if forced:
            continue
        matcher.fill(row, budget - len(ids))
        size = grammar.vocabulary.size
        allowed = ((row.unsqueeze(-1) >> shifts) & 1).flatten()[:size].bool()
        logits = torch.randn(size, generator=gen).masked_fill_(~allowed, float("-inf"))
        token = int(torch.argmax(logits))
        matcher.advance(token)
        ids.append(token)
    if not matcher.finished():
        return "unfinished"
    text = tok.decode([t for t in ids if t not in grammar.vocabulary.eos_token_ids])
    try:
        jsonschema.validate(json.loads(text), schema)
    except jsonschema.SchemaError:
        return "bad_schema"  # the schema itself is not valid JSON Schema: nothing to judge against
    except (ValueError, jsonschema.ValidationError):
        return "invalid"
    return "valid"


class OutlinesDirect:
    """outlines-core used directly: its schema-to-regex, then its Index built in a killable worker
    under the same time limit (default whitespace, no schema checks).  Each compiled index also
    decodes one output the way maskd's are (generated_verdict), to see what compiling means."""

    def __init__(self, vocab, timeout_s):
        from outlines_core.json_schema import build_regex_from_schema

        self.to_regex, self.vocab, self.timeout_s = build_regex_from_schema, vocab, timeout_s
        self.res = {"ok": 0, "timeout": 0, "error": 0, "cold_ms": [], "generated": {}}
        self.worker = CompileWorker(pickle.dumps(vocab.outlines))
        self.worker.build("a", 60)  # start-up outside the timings

    def compile(self, schema, tok):
        t = time.perf_counter()
        try:
            regex = self.to_regex(json.dumps(schema))
            index = self.worker.build(regex, self.timeout_s)
        except CompileTimeout:
            self.res["timeout"] += 1
            return
        except (ValueError, GrammarError):
            self.res["error"] += 1
            return
        self.res["cold_ms"].append((time.perf_counter() - t) * 1e3)
        self.res["ok"] += 1
        grammar = CompiledGrammar(index, regex, self.vocab, "outlines-direct")  # budget table for closing
        verdict = generated_verdict(grammar, schema, tok, seed=self.res["ok"])
        self.res["generated"][verdict] = self.res["generated"].get(verdict, 0) + 1


def bench_maskd_and_outlines(schemas, vocab, timeout_s, keep, tok, tick=lambda: None):
    """Compile every schema with outlines-core directly, then with maskd, one schema after the
    other (so both see the same load on a shared machine).  The first ``keep`` maskd grammars are
    kept for the mask walks (big indexes take hundreds of MB each: keeping them all ran a
    345-schema run out of 24 GB)."""
    res = {"ok": 0, "unsupported": 0, "timeout": 0, "error": 0, "cold_ms": [], "warm_us": [],
           "disk_ms": [], "unsupported_keywords": {}, "generated": {}, "grammar_bytes": []}
    grammars, compiled = [], []
    outlines = OutlinesDirect(vocab, timeout_s)
    with tempfile.TemporaryDirectory() as cache:
        with GrammarCompiler(vocab, cache_dir=cache, timeout_s=timeout_s, lru_size=4) as compiler:
            for _, schema in schemas:
                tick()
                outlines.compile(schema, tok)
                t = time.perf_counter()
                try:
                    g = compiler.compile_json_schema(schema)
                except UnsupportedSchemaError as e:
                    res["unsupported"] += 1
                    kw = res["unsupported_keywords"]
                    kw[e.keyword] = kw.get(e.keyword, 0) + 1
                    continue
                except CompileTimeout:
                    res["timeout"] += 1
                    continue
                except GrammarError:
                    res["error"] += 1
                    continue
                res["cold_ms"].append((time.perf_counter() - t) * 1e3)
                t = time.perf_counter()
                compiler.compile_json_schema(schema)
                res["warm_us"].append((time.perf_counter() - t) * 1e6)
                res["ok"] += 1
                if hasattr(g, "held_bytes"):
                    res["grammar_bytes"].append(g.held_bytes())
                verdict = generated_verdict(g, schema, tok, seed=len(compiled))
                res["generated"][verdict] = res["generated"].get(verdict, 0) + 1
                compiled.append(schema)
                if len(grammars) < keep:
                    grammars.append((schema, g))
                del g
        outlines.worker.kill()
        with GrammarCompiler(vocab, cache_dir=cache, timeout_s=timeout_s, lru_size=4) as fresh:
            for schema in compiled:
                t = time.perf_counter()
                fresh.compile_json_schema(schema)
                res["disk_ms"].append((time.perf_counter() - t) * 1e3)
    return res, grammars, outlines.res


def bench_xgrammar(schemas, tok, keep, vocab_size):
    try:
        import xgrammar as xgr
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"xgrammar not importable: {e}"}, None
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    res = {"ok": 0, "error": 0, "cold_ms": [], "warm_us": []}
    compiled = []
    for _, schema in schemas:
        t = time.perf_counter()
        try:
            c = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        except Exception:  # noqa: BLE001
            res["error"] += 1
            continue
        res["cold_ms"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        res["warm_us"].append((time.perf_counter() - t) * 1e6)
        res["ok"] += 1
        if len(compiled) < keep:  # the rest would only fill memory
            compiled.append(c)
    return res, (xgr, compiled)


def bench_llguidance(schemas, tok, keep, vocab_size):
    try:
        import llguidance
        import llguidance.hf
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"llguidance not importable: {e}"}, None
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab_size)
    res = {"ok": 0, "error": 0, "cold_ms": []}
    matchers = []
    for _, schema in schemas:
        t = time.perf_counter()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults={"whitespace_flexible": False})
            m = llguidance.LLMatcher(lltok, grammar)
            if m.is_error():
                raise ValueError(m.get_error())
        except Exception:  # noqa: BLE001
            res["error"] += 1
            continue
        res["cold_ms"].append((time.perf_counter() - t) * 1e3)
        res["ok"] += 1
        if len(matchers) < keep:
            matchers.append((grammar, m))
    return res, (llguidance, lltok, matchers)


def summarize(name, res, total):
    row = {"engine": name, "compiled": res.get("ok"), "total": total,
           "valid_output": res["generated"].get("valid", 0) if "generated" in res else None}
    for key in ("cold_ms", "warm_us", "disk_ms"):
        vals = res.get(key) or []
        row[f"{key}_p50"] = pct(vals, 0.5)
        row[f"{key}_p90"] = pct(vals, 0.9)
    return row




def run(ctx, progress, timeout_s: float = 10.0) -> dict:
    """The suite: compile the run's schemas (the first N of each subset) with every engine, then the
    mask walks over the first ``walks`` grammars each engine compiled."""
    from server.bench.schemas import per_subset
    from server.bench.stats import fmt

    stack = ctx.stack()
    sizes, tok, vocab = ctx.sizes, stack.loaded.tokenizer, stack.vocabulary
    rows = per_subset(ctx.rows, sizes.compile_per_subset)
    schemas = [(row["subset"], row["schema"]) for row in rows]
    n, walks, steps = len(schemas), sizes.walks, sizes.steps
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the mask runs on the engine thread, alone
    bar = progress("compile", n + 5)
    try:
        maskd, grammars, outlines = bench_maskd_and_outlines(schemas, vocab, timeout_s, walks, tok, bar.update)
        xg, xg_handle = bench_xgrammar(schemas, tok, walks, vocab.size)
        bar.update()
        llg, llg_handle = bench_llguidance(schemas, tok, walks, vocab.size)
        bar.update()
        compile_results = {"maskd": maskd, "outlines-core": outlines, "xgrammar": xg, "llguidance": llg}
        mask_us = {"maskd": mask_maskd(grammars[:walks], tok, vocab, steps)}
        # The same walks again untimed, then timed: every state memoised, as for a grammar that earlier
        # requests used (agents resend the same tools); then the packed-bitmask apply, rows memoised first.
        mask_maskd(grammars[:walks], tok, vocab, steps)
        mask_us["maskd-warm"] = mask_maskd(grammars[:walks], tok, vocab, steps)
        bar.update()
        mask_maskd(grammars[:walks], tok, vocab, steps, packed=True)
        mask_us["maskd-packed"] = mask_maskd(grammars[:walks], tok, vocab, steps, packed=True)
        bar.update()
        if xg_handle and xg_handle[1]:
            mask_us["xgrammar"] = mask_xgrammar((xg_handle[0], xg_handle[1][:walks]), tok, vocab, steps)
        if llg_handle and llg_handle[2]:
            mask_us["llguidance"] = mask_llguidance(
                (llg_handle[0], llg_handle[1], llg_handle[2][:walks]), tok, vocab, steps)
        bar.update()
    finally:
        torch.set_num_threads(torch_threads)
        bar.close()
    summary = [summarize(k, v, n) for k, v in compile_results.items() if "skipped" not in v]
    skipped = {k: v["skipped"] for k, v in compile_results.items() if "skipped" in v}
    mem = maskd["grammar_bytes"]
    ratios = {}
    for peer in ("xgrammar", "llguidance"):
        theirs = compile_results[peer].get("cold_ms")
        if theirs and maskd["cold_ms"]:
            ratios[f"maskd / {peer} cold compile p50"] = pct(maskd["cold_ms"], 0.5) / pct(theirs, 0.5)
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

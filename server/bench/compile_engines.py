"""The engines the `compile` suite compiles each schema with, one schema at a time in turn (so all
see the same load on a shared machine): maskd, outlines-core used directly, and the peers that have
a compiler of their own (xgrammar, llguidance; server/bench/peers.py starts them). Each keeps its
results in ``res`` and, in ``kept``, its grammars of the first ``keep`` schemas for the mask walks
(by schema index, so every engine walks the same schemas).
"""

from __future__ import annotations

import json
import pickle
import tempfile
import time

import torch

from grammars import CompileTimeout, GrammarCompiler, GrammarError, UnsupportedSchemaError
from grammars.compile.compile_worker import CompileWorker
from grammars.match.grammar import CompiledGrammar
from grammars.index.unit_index import from_outlines


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


def count(res: dict, key: str, verdict: str) -> None:
    res[key][verdict] = res[key].get(verdict, 0) + 1


class MaskdCompiles:
    """maskd's GrammarCompiler (schema checks, normalizer, killable worker, caches) over a fresh disk
    cache: cold, then warm (in memory); disk() compiles them all again in a fresh compiler reading
    that cache. Every compiled grammar decodes one output (generated_verdict). The work a compile
    leaves to the background (the disk write, warming the hole tables' masks) is waited for after
    each schema, outside the timings, so that it slows no other engine's timing nor the next one."""

    def __init__(self, vocab, timeout_s, keep, tok) -> None:
        self.res = {"ok": 0, "unsupported": 0, "timeout": 0, "error": 0, "cold_ms": [], "warm_us": [],
                    "disk_ms": [], "unsupported_keywords": {}, "generated": {}, "grammar_bytes": []}
        self.vocab, self.timeout_s, self.keep, self.tok = vocab, timeout_s, keep, tok
        self.cache = tempfile.TemporaryDirectory()
        self.compiler = GrammarCompiler(vocab, cache_dir=self.cache.name, timeout_s=timeout_s, lru_size=4)
        self.kept, self.compiled = {}, []  # schema index -> grammar, for the walks; every schema compiled

    def compile(self, i: int, schema) -> None:
        try:
            self._compile(i, schema)
        finally:  # its background work (disk write, warm-up) done before anything else is timed
            self.compiler.drain()

    def _compile(self, i: int, schema) -> None:
        res, t = self.res, time.perf_counter()
        try:
            g = self.compiler.compile_json_schema(schema)
        except UnsupportedSchemaError as e:
            res["unsupported"] += 1
            count(res, "unsupported_keywords", e.keyword)
            return
        except CompileTimeout:
            res["timeout"] += 1
            return
        except GrammarError:
            res["error"] += 1
            return
        res["cold_ms"].append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        self.compiler.compile_json_schema(schema)
        res["warm_us"].append((time.perf_counter() - t) * 1e6)
        res["ok"] += 1
        if hasattr(g, "held_bytes"):
            res["grammar_bytes"].append(g.held_bytes())
        count(res, "generated", generated_verdict(g, schema, self.tok, seed=len(self.compiled)))
        self.compiled.append(schema)
        if i < self.keep:  # big indexes take hundreds of MB each: keeping them all ran out of 24 GB
            self.kept[i] = g

    def disk(self) -> None:
        self.compiler.close()
        with GrammarCompiler(self.vocab, cache_dir=self.cache.name, timeout_s=self.timeout_s, lru_size=4) as fresh:
            for schema in self.compiled:
                t = time.perf_counter()
                fresh.compile_json_schema(schema)
                self.res["disk_ms"].append((time.perf_counter() - t) * 1e3)
                fresh.drain()

    def close(self) -> None:
        self.compiler.close()
        self.cache.cleanup()


class OutlinesDirect:
    """outlines-core used directly: its schema-to-regex, then its Index built in a killable worker
    under the same time limit (default whitespace, no schema checks).  Each compiled index also
    decodes one output the way maskd's are (generated_verdict), to see what compiling means."""

    def __init__(self, vocab, timeout_s, tok) -> None:
        from outlines_core.json_schema import build_regex_from_schema

        self.to_regex, self.vocab, self.timeout_s, self.tok = build_regex_from_schema, vocab, timeout_s, tok
        self.res = {"ok": 0, "timeout": 0, "error": 0, "cold_ms": [], "generated": {}}
        self.worker = CompileWorker(pickle.dumps(vocab.outlines))
        self.worker.build("a", 60)  # start-up outside the timings

    def compile(self, i: int, schema) -> None:
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
        index = from_outlines(index, self.vocab.outlines.get_eos_token_id())  # maskd's masks over its index
        grammar = CompiledGrammar(index, regex, self.vocab, "outlines-direct")  # budget table for closing
        count(self.res, "generated", generated_verdict(grammar, schema, self.tok, seed=self.res["ok"]))

    def close(self) -> None:
        self.worker.kill()


class PeerCompiles:
    """A peer's own compiler (its compile_grammar, server/bench/peers.py): cold, and warm where the
    peer caches compiled grammars (xgrammar does; llguidance has no cache to hit)."""

    def __init__(self, peer, keep, warm: bool) -> None:
        self.peer, self.keep, self.warm = peer, keep, warm
        self.res = {"ok": 0, "error": 0, "cold_ms": [], **({"warm_us": []} if warm else {})}
        self.kept = {}

    def compile(self, i: int, schema) -> None:
        t = time.perf_counter()
        try:
            grammar = self.peer.compile_grammar(schema)
        except Exception:  # noqa: BLE001 - any failure to compile is counted as one
            self.res["error"] += 1
            return
        self.res["cold_ms"].append((time.perf_counter() - t) * 1e3)
        if self.warm:
            t = time.perf_counter()
            self.peer.compile_grammar(schema)
            self.res["warm_us"].append((time.perf_counter() - t) * 1e6)
        self.res["ok"] += 1
        if i < self.keep:  # the rest would only fill memory
            self.kept[i] = grammar

    def close(self) -> None:
        pass

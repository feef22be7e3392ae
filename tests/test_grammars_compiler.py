"""GrammarCompiler: memory and disk cache hits are fast; a runaway compile times out."""

from __future__ import annotations

import asyncio
import os

import pytest

from grammar_fixtures import smollm2_vocabulary
from grammars import CompileTimeout, GrammarCompiler, GrammarError, UnsupportedSchemaError, schema_to_regex

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["q"]}
PATHOLOGICAL = r"(a|b)*a(a|b){16}"  # a DFA of ~2^16 states: tens of seconds to index


def test_memory_and_disk_cache(tmp_path):
    vocab = smollm2_vocabulary()
    with GrammarCompiler(vocab, cache_dir=str(tmp_path)) as compiler:
        first = compiler.compile_json_schema(SCHEMA)
        again = compiler.compile_json_schema(SCHEMA)  # timings are the benchmarks' business, not a test's
        assert again is first and compiler.stats["memory_hits"] == 1
        assert compiler.stats["compiles"] == 1
        assert len(os.listdir(tmp_path)) == 1
    with GrammarCompiler(vocab, cache_dir=str(tmp_path)) as fresh:
        loaded = fresh.compile_json_schema(SCHEMA)
        counts = {k: fresh.stats[k] for k in ("memory_hits", "disk_hits", "compiles", "timeouts")}
        assert counts == {"memory_hits": 0, "disk_hits": 1, "compiles": 0, "timeouts": 0}
        assert loaded.key == first.key and loaded.index.get_transitions() == first.index.get_transitions()


def test_memory_cache_is_bounded_in_bytes_and_keeps_the_newest():
    vocab = smollm2_vocabulary()
    regexes = ["[0-9]{1,3}", "(yes|no)", "[a-z]{2,5}"]
    with GrammarCompiler(vocab) as probe:
        sizes = [probe.compile_regex(r).approx_bytes for r in regexes]
    assert all(size > 0 for size in sizes)
    with GrammarCompiler(vocab, lru_bytes=sizes[1] + sizes[2]) as compiler:
        grammars = [compiler.compile_regex(r) for r in regexes]  # the first is evicted for the third
        assert compiler.compile_regex(regexes[2]) is grammars[2]
        assert compiler.compile_regex(regexes[1]) is grammars[1]
        assert compiler.stats["compiles"] == 3
        compiler.compile_regex(regexes[0])
        assert compiler.stats["compiles"] == 4  # it had to be built again
    with GrammarCompiler(vocab, lru_bytes=1) as tiny:  # smaller than any grammar: the newest stays
        grammar = tiny.compile_regex(regexes[0])
        assert tiny.compile_regex(regexes[0]) is grammar and tiny.stats["compiles"] == 1


def test_timeout_does_not_block_caller():
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60) as compiler:
        compiler.compile_regex("[0-9]")  # the worker is up (however busy the machine)
        compiler.timeout_s = 0.05  # the limit applies to the compile: the caller gets the error, the worker is killed
        with pytest.raises(CompileTimeout, match="0.05 s limit") as info:
            compiler.compile_regex(PATHOLOGICAL)
        assert "timeout_s" in str(info.value)
        compiler.timeout_s = 60
        assert compiler.compile_regex("[0-9]+").regex == "[0-9]+"  # a fresh worker serves on


def test_async_variant():
    with GrammarCompiler(smollm2_vocabulary()) as compiler:
        grammar = asyncio.run(compiler.compile_json_schema_async(SCHEMA))
        assert grammar.matcher().finished() is False


def test_invalid_regex_is_a_grammar_error():
    with GrammarCompiler(smollm2_vocabulary()) as compiler:
        with pytest.raises(GrammarError, match="could not build"):
            compiler.compile_regex("(unclosed")


def _nested_one_of(depth: int) -> dict:
    """A schema whose regex grows 4x per level (depth 12: minutes and gigabytes)."""
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"oneOf": [{"type": "object", "properties": {"a": schema, "b": schema}, "required": ["a"]},
                            {"type": "array", "items": schema}]}
    return schema


def test_turning_a_schema_into_a_regex_is_bounded_too():
    """schema -> regex runs in a worker under the limit: an exploding schema is stopped there (the
    worker is replaced), never left burning the server's cores after its client has gone."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=0.5, workers=1) as compiler:
        with pytest.raises(CompileTimeout, match="JSON schema into a regex"):
            compiler.schema_regex(_nested_one_of(11))
        assert compiler.stats["timeouts"] == 1
        assert compiler.schema_regex({"type": "integer"}) == schema_to_regex({"type": "integer"}, free_values=True)
        with pytest.raises(UnsupportedSchemaError) as info:  # the worker's refusals keep their type and words
            compiler.schema_regex({"type": "object", "not": {}})
        assert info.value.keyword == "not" and "'not'" in str(info.value)


def test_property_order_is_part_of_a_schemas_regex():
    with GrammarCompiler(smollm2_vocabulary(), workers=1) as compiler:
        ab = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
        ba = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["a", "b"]}
        assert compiler.schema_regex(ab) == schema_to_regex(ab, free_values=True)
        assert compiler.schema_regex(ba) == schema_to_regex(ba, free_values=True) != compiler.schema_regex(ab)


def test_waiting_for_a_busy_pool_counts_toward_the_limit():
    """The limit runs from when the unit was asked for: a job still queued behind another request's
    compile when it ends is a CompileTimeout that says so, and nothing is cached for it."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60, workers=1) as compiler:
        compiler.compile_regex("[0-9]")  # the worker is up
        busy = compiler._idle.get()  # the only worker, held as another request's long compile holds it
        compiler.timeout_s = 0.2
        future = compiler.submit_regex("[a-z]+")
        error = future.exception(timeout=1800)  # before the fix: it waited for the worker with no limit
        assert isinstance(error, CompileTimeout) and error.queued
        assert "0.2 s limit" in str(error) and "busy" in str(error) and "--grammar-workers" in str(error)
        with pytest.raises(CompileTimeout, match="did not start within the 0.2 s limit"):
            compiler.schema_regex({"type": "boolean"})  # schema -> regex waits for the same workers
        assert compiler.stats["timeouts"] == 2 and compiler.cached("[a-z]+") is None
        compiler._idle.put(busy)  # the other compile is done: the pool serves on, within the limit
        compiler.timeout_s = 60
        assert compiler.compile_regex("[a-z]+").regex == "[a-z]+"


def test_a_deadline_already_past_compiles_nothing():
    """A job whose limit ended while it waited (for a thread, or the same schema's compile elsewhere)
    is refused before any worker starts on it; the idle worker is kept."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60, workers=1) as compiler:
        compiler.compile_regex("[0-9]")
        with pytest.raises(CompileTimeout) as info:
            compiler.compile_regex("[a-z]+", deadline=0.0)  # time.monotonic() is past it
        assert info.value.queued and compiler.stats["compiles"] == 1 and compiler.cached("[a-z]+") is None
        assert compiler.compile_regex("[a-z]+").regex == "[a-z]+"

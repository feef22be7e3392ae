"""GrammarCompiler: memory and disk cache hits are fast; a runaway compile times out."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time

import pytest

from grammar_fixtures import smollm2_vocabulary
from grammars.compile import grammar_memory
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
        compiler.drain()  # the disk write runs in the background
        assert len(os.listdir(tmp_path)) == 1
    with GrammarCompiler(vocab, cache_dir=str(tmp_path)) as fresh:
        loaded = fresh.compile_json_schema(SCHEMA)
        counts = {k: fresh.stats[k] for k in ("memory_hits", "disk_hits", "compiles", "timeouts")}
        assert counts == {"memory_hits": 0, "disk_hits": 1, "compiles": 0, "timeouts": 0}
        assert loaded.key == first.key and loaded.index.get_transitions() == first.index.get_transitions()


def test_a_regex_holding_the_trie_walks_sentinel_is_indexed_by_outlines_core_and_converted():
    """`a\x02?`: the trie walk marks R's end with \x02, so outlines-core builds this index and maskd
    converts it into its arrays; the grammar then works like any other."""
    vocab = smollm2_vocabulary()
    a = next(t for t, b in vocab.token_bytes.items() if b == b"a")
    with GrammarCompiler(vocab, workers=1) as compiler:
        grammar = compiler.compile_regex("a\x02?")
        matcher = grammar.matcher()
        matcher.advance(a)
        assert matcher.finished() and not grammar.index.loop.any()


def test_memory_cache_is_bounded_in_bytes_and_keeps_the_newest():
    vocab = smollm2_vocabulary()
    regexes = ["[0-9]{1,3}", "(yes|no)", "[a-z]{2,5}"]
    with GrammarCompiler(vocab) as probe:
        sizes = [probe.compile_regex(r).approx_bytes for r in regexes]
    assert all(size > 0 for size in sizes)
    with GrammarCompiler(vocab, lru_bytes=sizes[1] + sizes[2]) as compiler:
        compiler.set_engine_idle(lambda: False)  # no background warm-up adds to what a grammar holds meanwhile
        grammars = [compiler.compile_regex(r) for r in regexes]  # the first is evicted for the third
        assert compiler.compile_regex(regexes[2]) is grammars[2]
        assert compiler.compile_regex(regexes[1]) is grammars[1]
        assert compiler.stats["compiles"] == 3
        compiler.compile_regex(regexes[0])
        assert compiler.stats["compiles"] == 4  # it had to be built again
    with GrammarCompiler(vocab, lru_bytes=1) as tiny:  # smaller than any grammar: the newest stays
        grammar = tiny.compile_regex(regexes[0])
        assert tiny.compile_regex(regexes[0]) is grammar and tiny.stats["compiles"] == 1


def test_a_grammar_the_cache_drops_is_freed_off_the_compiles_path():
    """Freeing a dropped grammar (one a request decoded with holds thousands of memoised masks,
    ~0.7 ms to free on a 262k vocabulary) is the background thread's work, not the compile's."""
    freed = []

    class Witness:  # freed with the grammar that holds it
        def __del__(self):
            freed.append(threading.current_thread().name)

    with GrammarCompiler(smollm2_vocabulary(), lru_size=1) as compiler:
        first = compiler.compile_regex("[0-9]{1,3}")
        first._masks["witness"] = Witness()
        compiler.drain()  # the background is done with it: the cache holds the last reference
        del first
        compiler.compile_regex("(yes|no)")  # drops the first
        compiler.drain()
        assert freed and freed[0].startswith("maskd-after")


def test_compile_workers_pipes_take_a_unit_in_one_write():
    """A unit's arrays (~0.1-1 MB) cross to the compiler in one write where Linux allows a 1 MB pipe."""
    import fcntl

    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            allowed = int(f.read())
    except OSError:
        pytest.skip("no /proc/sys/fs/pipe-max-size: pipes keep their default size")
    if allowed < 1 << 20 or not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.skip("this system allows no 1 MB pipe")
    with GrammarCompiler(smollm2_vocabulary(), workers=1) as compiler:
        proc = compiler._workers[0]._proc
        assert [fcntl.fcntl(p.fileno(), fcntl.F_GETPIPE_SZ) for p in (proc.stdin, proc.stdout)] == [1 << 20] * 2
        assert compiler.compile_regex("[0-9]{1,3}").index.n_states > 1


def test_timeout_does_not_block_caller(monkeypatch):
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60) as compiler:
        compiler.compile_regex("[0-9]")  # the worker is up (however busy the machine)
        compiler.timeout_s = 0.05  # the limit applies to the compile: the caller gets the error, the worker is killed
        with pytest.raises(CompileTimeout, match="0.05 s limit") as info:
            compiler.compile_regex(PATHOLOGICAL)
        assert "timeout_s" in str(info.value)
        compiler.timeout_s = 60
        assert compiler.compile_regex("[0-9]+").regex == "[0-9]+"  # a fresh worker serves on
        compiles = compiler.stats["compiles"]
        with pytest.raises(CompileTimeout):  # remembered: asked again, it fails at once, nothing compiles
            compiler.compile_regex(PATHOLOGICAL)
        assert isinstance(compiler.submit_regex(PATHOLOGICAL).exception(timeout=0), CompileTimeout)
        assert compiler.stats["compiles"] == compiles
        compiler.timeout_s = 0.05
        monkeypatch.setattr(grammar_memory, "FAILURE_MEMORY_S", 0.0)  # remembered a while, then tried again
        with pytest.raises(CompileTimeout):
            compiler.compile_regex(PATHOLOGICAL)
        assert compiler.stats["compiles"] == compiles + 1


def test_async_variant():
    with GrammarCompiler(smollm2_vocabulary()) as compiler:
        grammar = asyncio.run(compiler.compile_regex_async(compiler.schema_regex(SCHEMA)))
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


def test_waiting_for_a_busy_pool_does_not_count_toward_the_limit():
    """The limit is a unit's own compile time: a unit queued behind others (25 new tools at ~1 s each
    on a 262k vocabulary) is compiled when a worker frees, however long that took. Before the fix the
    limit ran from the ask, and such a request failed with a 400 on an idle server."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60, workers=1) as compiler:
        compiler.compile_regex("[0-9]")  # the worker is up
        busy = compiler._pool.take(priority=0)  # the only worker, held as another compile holds it
        compiler.timeout_s = 0.05
        future = compiler.submit_regex("[a-z]+")
        while not compiler._pool._waiting:  # the unit waits for the worker
            time.sleep(0.01)
        time.sleep(0.2)  # longer than the limit in force while it waits
        compiler.timeout_s = 60  # the limit when its compile starts is the one that applies
        compiler._pool.give(busy)
        assert future.result(timeout=1800).regex == "[a-z]+"
        assert compiler.stats["timeouts"] == 0


def test_a_preferred_unit_is_compiled_before_those_queued_ahead_of_it():
    """prefer(regex): a request now waits on that unit (its tool was chosen), so it takes the next
    free worker, ahead of units asked for earlier."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60, workers=1) as compiler:
        compiler.compile_regex("[0-9]")
        busy = compiler._pool.take(priority=0)
        done: list[str] = []
        futures = []
        for regex in ("a[a-z]+", "b[a-z]+", "c[a-z]+"):
            futures.append(compiler.submit_regex(regex))
            futures[-1].add_done_callback(lambda f: done.append(f.result().regex))
        while len(compiler._pool._waiting) < 3:
            time.sleep(0.01)
        compiler.prefer("c[a-z]+")
        compiler._pool.give(busy)
        concurrent.futures.wait(futures, timeout=1800)
        assert done[0] == "c[a-z]+" and sorted(done) == ["a[a-z]+", "b[a-z]+", "c[a-z]+"]


def test_background_units_wait_for_the_engines_idle_time_and_needed_ones_do_not():
    """A unit submitted in the background (a tool the request has not called) starts only while the
    engine is idle; one a request needs starts at once; prefer() moves a background one up, even
    before it has queued for a worker."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60, workers=1) as compiler:
        compiler.compile_regex("[0-9]")
        busy = {"engine": True}
        compiler.set_engine_idle(lambda: not busy["engine"])
        background = compiler.submit_regex("x[a-z]+", background=True)
        needed = compiler.submit_regex("y[a-z]+")
        assert needed.result(timeout=1800).regex == "y[a-z]+"
        assert not background.done()  # needed went first; the background one waits for idle time
        preferred = compiler.submit_regex("z[a-z]+", background=True)
        compiler.prefer("z[a-z]+")
        assert preferred.result(timeout=1800).regex == "z[a-z]+" and not background.done()
        busy["engine"] = False
        assert background.result(timeout=1800).regex == "x[a-z]+"


def test_a_chosen_unit_is_compiled_while_background_ones_hold_every_thread_the_engine_busy():
    """Background compiles wait for the engine's idle time, each on a thread. With more of them than
    the pool had threads (4 a worker), a unit that a request then waited on (its tool chosen:
    prefer) queued behind them for a thread and, the engine busy, was never compiled (mask_bench's
    cold replay hung). Now it, and a unit a request needs, compile while those still wait."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60, workers=1) as compiler:
        compiler.compile_regex("[0-9]")
        compiler.set_engine_idle(lambda: False)
        background = [compiler.submit_regex(f"{c}[a-z]+", background=True) for c in "abcdefgh"]
        while len(compiler._pool._waiting) < 4:  # every background thread waits for idle time
            time.sleep(0.01)
        chosen = compiler.submit_regex("z[a-z]+", background=True)
        compiler.prefer("z[a-z]+")
        assert chosen.result(timeout=1800).regex == "z[a-z]+"
        assert compiler.submit_regex("y[a-z]+").result(timeout=1800).regex == "y[a-z]+"
        assert not any(f.done() for f in background)
        compiler.close()
        assert all(isinstance(f.exception(timeout=1800), GrammarError) for f in background)


def test_one_asker_giving_up_does_not_cancel_a_unit_for_the_others():
    """Requests asking for the same unit share one future and one compile; a client that hangs up
    (asyncio's wrap_future then cancels what it awaited) cannot cancel it for the rest."""
    with GrammarCompiler(smollm2_vocabulary(), timeout_s=60, workers=1) as compiler:
        compiler.compile_regex("[0-9]")
        compiles = compiler.stats["compiles"]
        busy = compiler._pool.take(priority=0)
        first, second = compiler.submit_regex("[a-z]+"), compiler.submit_regex("[a-z]+")
        assert not first.cancel() and not second.cancelled()
        compiler._pool.give(busy)
        assert second.result(timeout=1800).regex == first.result(timeout=1800).regex == "[a-z]+"
        assert compiler.stats["compiles"] == compiles + 1


def test_narrowed_lists_are_made_in_the_background_while_the_engine_idles():
    """grammars/match/narrowed_ahead.py warm_budget_cuts, and for a grammar with free-value holes
    grammars/match/narrowed_ahead.py warm_narrowed, run after the compile, on the background thread, only
    while the engine has nothing to compute (the compile itself does not wait on them)."""
    engine_busy = threading.Event()
    engine_busy.set()
    with GrammarCompiler(smollm2_vocabulary()) as compiler:
        compiler.set_engine_idle(lambda: not engine_busy.is_set())
        grammar = compiler.compile_regex(r'\{"city":"[a-z]{1,12}","days":[0-9]{1,2}\}')
        holes = compiler.compile_json_schema({"type": "object", "properties": {
            "city": {"type": "string"}, "meta": {"type": "object"}}, "required": ["city", "meta"]})
        assert holes.has_holes
        assert not grammar._kept and not _narrowed_made(holes.hole_tables())  # the engine computes
        engine_busy.clear()
        compiler.drain()
        assert len(grammar._kept) > 5 and _narrowed_made(holes.hole_tables()) > 50


def _narrowed_made(tables) -> int:
    """A grammar's narrowed lists made: its unit states' (per budget) and its values' (per rung,
    grammars/json_value/value_rungs.py: the masks of each position's record)."""
    rungs = [record[4] for key, record in tables.memo.items() if key[0] == "rungs"]
    return len(tables.narrowed._memo) + sum(len(masks) for masks in rungs)


def test_a_units_disk_write_waits_for_the_engines_idle_time_and_close_makes_it(tmp_path):
    """The disk write (np.savez's Python, ~2 ms a unit) runs on the background thread only while the
    engine has nothing to compute; closing the compiler writes what waits at once."""
    asked, engine_busy = threading.Event(), threading.Event()
    engine_busy.set()

    def idle():
        if threading.current_thread().name.startswith("maskd-after"):
            asked.set()  # the write's first ask comes before anything else the background does
        return not engine_busy.is_set()

    for close_busy in (False, True):
        cache = tmp_path / str(close_busy)
        asked.clear()
        engine_busy.set()
        with GrammarCompiler(smollm2_vocabulary(), cache_dir=str(cache)) as compiler:
            compiler.set_engine_idle(idle)
            grammar = compiler.compile_regex("[0-9]{1,3}")
            path = compiler._disk.path(grammar.key)
            assert asked.wait(timeout=1800)
            assert not os.path.exists(path)  # it waits while the engine computes
            if not close_busy:
                engine_busy.clear()
                compiler.drain()
                assert os.path.exists(path)
        assert os.path.exists(path)


def test_a_compile_worker_boots_from_the_folder_holding_the_grammars_package():
    """The worker process puts that folder first on its path (not grammars/ itself, whose layer
    folders would then shadow top-level modules of the same names)."""
    from grammars.compile import compile_worker

    assert os.path.isfile(os.path.join(compile_worker._ROOT, "grammars", "__init__.py"))

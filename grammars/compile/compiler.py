"""GrammarCompiler: regex / JSON schema -> CompiledGrammar, cached in memory and on disk.

Cache key: sha256 of CACHE_VERSION (the versions of outlines-core, interegular and numpy, and of
maskd's code that builds a unit: grammars/files/cache_version.py), the vocabulary fingerprint and
the regex. The memory cache is an LRU bounded in entries and in bytes (grammar_memory.py); the disk
cache, in a folder of this user's alone, holds each unit's TokenIndex and BudgetTable as plain
arrays, never a pickle (``<cache_dir>/<key>.unit.npz``, unit_file.py).
Misses are compiled in a pool of CompileWorker child processes (one per core by default) with a
time limit per grammar (see there for why a process and not a thread). The limit is the unit's own
compile time, from when a worker takes it: a request with many new tools queues its units behind
each other (and behind other requests'), and a unit must not fail for the time its siblings
took. The request's deadline (--request-timeout) bounds how long its client waits. Workers are
handed out by priority, then in order of asking: ``prefer`` moves a unit a request now waits on
ahead of the others. ``submit_regex`` starts a compile and returns a future at once (one per
unit, shared by its askers: compile_futures.py), so a request's units compile side by side, and
beside its prefill; a memory hit is a future done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import pickle
import threading
import time
from collections import OrderedDict
from typing import Iterable

from grammars.compile.background import Background
from grammars.files.cache_version import UNIT_VERSION
from grammars.compile.compile_futures import CompileFutures
from grammars.compile.compile_worker import CompileWorker, default_workers
from grammars.match.grammar import CompiledGrammar
from grammars.errors import CompileTimeout, GrammarError
from grammars.compile.grammar_memory import FailureMemory, GrammarLRU
from grammars.match.narrowed_ahead import warm_budget_cuts, warm_narrowed
from grammars.files.private_dir import private_dir
from grammars.compile.unit_file import UnitFolder
from grammars.index.vocabulary import TokenVocabulary
from grammars.compile.worker_turns import BACKGROUND, NEEDED, NOW, SCHEMA, WorkerTurns


CACHE_VERSION = UNIT_VERSION  # what shapes a cached unit besides its regex and vocabulary


class GrammarCompiler:
    """Compiles and caches grammars for one vocabulary; safe to call from many threads."""

    def __init__(
        self,
        vocabulary: TokenVocabulary,
        cache_dir: str | None = None,
        timeout_s: float = 10.0,
        lru_size: int = 256,
        lru_bytes: int = 2 << 30,
        workers: int | None = None,
        ignore_keywords: Iterable[str] = (),
        free_values: bool = True,
    ) -> None:
        if timeout_s <= 0:
            raise GrammarError(f"timeout_s must be positive, got {timeout_s}")
        self.vocabulary = vocabulary
        self.cache_dir = cache_dir
        self.timeout_s = timeout_s
        self.lru_size = lru_size
        self._lru = GrammarLRU(lru_size, lru_bytes)
        self.ignore_keywords = tuple(ignore_keywords)
        self.free_values = free_values  # free-form values as holes for the JSON-value automaton
        self._json = None  # the JSON-value automaton, once asked for
        self._failed = FailureMemory(lru_size)
        self._schema_regex: OrderedDict[tuple, str] = OrderedDict()  # (schema, ignored, free values) -> regex
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Lock] = {}
        blob = pickle.dumps((vocabulary.outlines, vocabulary.token_bytes, vocabulary.size))  # trie walks
        workers = default_workers() if workers is None else max(1, workers)
        self._workers = [CompileWorker(blob, vocabulary.size, vocabulary.eos_token_ids) for _ in range(workers)]
        # threads that each wait for an idle worker: compiles queue here, memory hits never do
        self._threads = concurrent.futures.ThreadPoolExecutor(4 * workers, thread_name_prefix="maskd-compile")
        # what follows a compile that nothing waits on: the disk write, its narrowed lists made ahead
        self._after = Background(lambda: self._pool.engine_idle())
        for w in self._workers:
            w.start()  # start now so the first compile does not pay the process start
        self._pool = WorkerTurns(self._workers)
        self._units = CompileFutures(self._threads, 4 * workers, self.compile_regex, self._pool.prefer)
        if cache_dir and not private_dir(cache_dir):
            self.cache_dir = None
        self._disk = UnitFolder(self.cache_dir, vocabulary.size, CACHE_VERSION)
        self._counts = {"disk_hits": 0, "compiles": 0, "timeouts": 0, "compile_seconds": 0.0,
                        "json_automaton_seconds": 0.0}

    # -- public API ---------------------------------------------------------------------

    def compile_regex(self, regex: str, priority: int = NEEDED) -> CompiledGrammar:
        """CompiledGrammar for ``regex`` (cached); raises CompileTimeout if its compile takes longer
        than the limit. ``priority``: its turn for a worker (grammars/compile/worker_turns.py)."""
        key = self._key(regex)
        hit = self._lru.get(key)
        if hit is not None:
            return hit
        failed = self._failed.get(key)
        if failed is not None:  # it failed a moment ago (past the limit, or refused): it would again
            raise failed
        lock = self._key_lock(key)
        if not lock.acquire(blocking=False):  # another request compiles it (bounded by the limit) ...
            self._pool.prefer(key, priority)  # ... perhaps in the background: this one waits on it
            lock.acquire()
        try:  # one compile per key even under concurrent requests
            hit = self._lru.get(key)
            if hit is not None:
                return hit
            failed = self._failed.get(key)
            if failed is not None:
                raise failed
            built = self._disk.get(key)
            if built is None:
                try:
                    built = self._build(regex, key, priority)
                except GrammarError as exc:  # remembered, so that a request retrying it fails at once
                    self._failed.put(key, exc)
                    raise
                self._after.later(self._disk_put, key, built)
            else:
                self._counts["disk_hits"] += 1
            index, budget = built
            grammar = CompiledGrammar(index, regex, self.vocabulary, key, budget)
            if grammar.has_holes:  # the free values' tables, here rather than at the first token
                self.json_automaton()
                grammar.hole_tables()
            self._after.later(self._narrowed_ahead, grammar)
            dropped = self._lru.put(key, grammar)
            if dropped:  # freed on the background thread, off this path
                self._after.later(list.clear, dropped)
            with self._lock:
                self._inflight.pop(key, None)
            return grammar
        finally:
            lock.release()

    def _narrowed_ahead(self, grammar: CompiledGrammar) -> None:
        """In the background, while the engine idles: the grammar's narrowed id lists made ahead
        (grammars/match/narrowed_ahead.py), then its bytes counted again, here rather than by the next
        compile's memory bound, on its request's path."""
        warm_budget_cuts(grammar, self._after.pause)
        if grammar.has_holes:
            warm_narrowed(grammar, grammar.hole_tables(), pause=self._after.pause)
        grammar.held_bytes()

    def cached(self, regex: str) -> CompiledGrammar | None:
        """The grammar of ``regex`` if it is in the memory cache (no compile, no disk read)."""
        return self._lru.get(self._key(regex))

    def submit_regex(self, regex: str, background: bool = False) -> concurrent.futures.Future:
        """A future of compile_regex(regex): done at once on a memory hit, else compiled in the pool.
        ``background``: no request waits on it yet: it compiles while the engine is idle, unless
        ``prefer`` moves it up."""
        key = self._key(regex)
        hit = self._lru.get(key)
        failed = self._failed.get(key) if hit is None else None
        if hit is None and failed is None:
            return self._units.submit(key, regex, BACKGROUND if background else NEEDED)
        future: concurrent.futures.Future = concurrent.futures.Future()
        if failed is None:
            future.set_result(hit)
        else:
            future.set_exception(failed)
        return future

    def prefer(self, regex: str, now: bool = True) -> None:
        """Serve the compile of ``regex``, if it waits for a worker, before the others waiting (a row
        waits on it right now), or (``now`` False) as a compile a request needs, not a background one."""
        self._units.hurry(self._key(regex), regex, NOW if now else NEEDED)

    def set_engine_idle(self, idle) -> None:
        """``idle()``: whether the engine has nothing to compute (background compiles run then)."""
        self._pool.engine_idle = idle

    def _key(self, regex: str) -> str:
        return hashlib.sha256(f"{CACHE_VERSION}\0{self.vocabulary.fingerprint}\0{regex}".encode()).hexdigest()

    def compile_json_schema(self, schema: dict | str) -> CompiledGrammar:
        """CompiledGrammar for a JSON schema (compact whitespace, see json_schema.py)."""
        return self.compile_regex(self.schema_regex(schema, self.ignore_keywords, self.free_values))

    def schema_regex(self, schema: dict | str, ignore_keywords: Iterable[str] = (), free_values: bool = True) -> str:
        """schema_to_regex(schema), cached, run in a worker process under the time limit: turning a
        schema into a regex can explode too (nested oneOf), and a thread could not be stopped."""
        text = schema if isinstance(schema, str) else json.dumps(schema)  # key order kept: it orders properties
        key = (text, tuple(sorted(ignore_keywords)), free_values)
        with self._lock:
            regex = self._schema_regex.get(key)
            if regex is not None:
                self._schema_regex.move_to_end(key)
                return regex
        worker = self._pool.take(priority=SCHEMA)  # a request waits on it before anything else
        try:
            regex = worker.schema_regex(text, key[1], free_values, self.timeout_s)
        except CompileTimeout as e:
            self._timed_out(e)
        finally:
            worker.start()  # respawn at once if the limit killed it
            self._pool.give(worker)
        with self._lock:
            self._schema_regex[key] = regex
            while len(self._schema_regex) > self.lru_size:
                self._schema_regex.popitem(last=False)
        return regex

    async def schema_regex_async(self, schema: dict | str, ignore_keywords: Iterable[str] = (),
                                 free_values: bool = True) -> str:
        return await asyncio.wrap_future(self._threads.submit(self.schema_regex, schema, ignore_keywords,
                                                              free_values))

    def json_automaton(self):
        """The vocabulary's JSON-value automaton (grammars/json_value/json_value.py): built, or read from the
        disk cache, on first call (the server calls it at startup), then shared."""
        from grammars.json_value.json_value_cache import json_value_automaton, warm_json

        if self._json is None:
            started = time.perf_counter()
            self._json = json_value_automaton(self.vocabulary, cache_dir=self.cache_dir)
            self._counts["json_automaton_seconds"] = time.perf_counter() - started
            # its masks and the holes' exits, while the engine idles
            self._after.later(warm_json, self._json, self.vocabulary, self._after.pause)
        return self._json

    def json_object_matcher(self):
        """A matcher of one JSON object of any depth (OpenAI ``response_format={"type": "json_object"}``):
        the shared automaton, never a regex."""
        from grammars.json_value.json_value_matcher import JsonValueMatcher

        return JsonValueMatcher(self.json_automaton(), top="object")

    async def compile_regex_async(self, regex: str) -> CompiledGrammar:
        return await asyncio.to_thread(self.compile_regex, regex)

    def tool_call(self, tokenizer, tool_format: str, tools: list[dict], regex_of, mode: str, name: str | None,
                  parallel: bool, on_compiled=None):
        """A request's tool-call constraint, its units submitted (grammars/tools/tool_call.py)."""
        from grammars.tools.tool_call import build_tool_call

        return build_tool_call(self, tokenizer, tool_format, tools, regex_of, mode, name, parallel, on_compiled)

    def close(self) -> None:
        """Stop the worker processes (after the disk writes queued; warm-ups stop)."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._units.close()
        self._pool.close()
        self._after.close()
        for w in self._workers:
            w.kill()

    def __enter__(self) -> "GrammarCompiler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _build(self, regex: str, key: str, priority: int):
        worker = self._pool.take(priority, key=key)
        started = time.perf_counter()
        try:
            self._counts["compiles"] += 1
            return worker.build(regex, self.timeout_s, with_table=True)
        except CompileTimeout as e:
            self._timed_out(e)
        finally:
            self._counts["compile_seconds"] += time.perf_counter() - started
            worker.start()  # respawn at once if the compile killed it
            self._pool.give(worker)

    def drain(self) -> None:
        """Wait until the background work queued so far (disk writes, warm-ups) is done."""
        self._after.drain()

    def _timed_out(self, error: CompileTimeout):
        self._counts["timeouts"] += 1
        raise error from None

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._inflight.setdefault(key, threading.Lock())

    @property
    def stats(self) -> dict:
        """Counts: hits by tier, compiles, timeouts, and seconds spent compiling (for /metrics)."""
        return {"memory_hits": self._lru.hits, **self._counts}

    def memory_report(self) -> dict:
        """Grammars in memory and the bytes they hold now (for /metrics)."""
        return {**self._lru.report(), "workers": len(self._workers)}

    def _disk_put(self, key: str, built) -> None:
        if self._disk.folder is None:
            return
        self._after.wait_idle()  # its Python would share the GIL with a decoding engine's
        self._disk.put(key, built)

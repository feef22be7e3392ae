"""CompileWorker: a child process that builds token indexes, killable on timeout.

A Python thread cannot be stopped, and although outlines-core releases the GIL while
it builds an index (measured: the caller keeps running), a runaway compile in a thread
would keep burning a core and memory forever.  So compiles run in a child process
(``python -c`` running ``serve()``; a plain subprocess rather than multiprocessing's
spawn, which would re-import the caller's ``__main__``): on timeout the child is killed
and a fresh one started.  The child also builds the grammar's BudgetTable (distances, and each
state's sparse mask for the CPU apply; grammars/index/budget.py).  Frames on the pipes are an 8-byte length
plus a pickle; a TokenIndex comes back as its arrays.

This module imports only the standard library, outlines_core and numpy (no torch), so the
child starts in well under a second.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import select
import struct
import subprocess
import sys
import time

from grammars.errors import CompileTimeout, GrammarError, UnsupportedSchemaError


_STARTUP_TIMEOUT_S = 60.0
_PIPE_BYTES = 1 << 20  # the default /proc/sys/fs/pipe-max-size
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder holding grammars/
_BOOT = f"import sys; sys.path.insert(0, {_ROOT!r}); from grammars.compile.compile_worker import serve; serve()"


def default_workers() -> int:
    """Compile processes when not configured: one per core the process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores)


def _write(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read(fd: int, deadline: float | None):
    (size,) = struct.unpack("<Q", _read_exact(fd, 8, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


def _widen(fd: int) -> None:
    """A pipe of _PIPE_BYTES where Linux allows it (a unit's ~0.1-1 MB of arrays then crosses in one
    write, not in 64 KB turns of writer and reader: 1 MB each way 3.9 -> 2.2 ms here); else as it is."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    except OSError:  # over /proc/sys/fs/pipe-max-size, or not Linux
        pass


def serve() -> None:  # runs in the child
    import outlines_core

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the frame stream
    inp = sys.stdin.buffer.fileno()
    vocabulary = _read(inp, None)
    from grammars.index.budget import _library, build_budget_table
    from grammars.index.plain_tokens import PlainTokens
    from grammars.index.token_index import TokenTrie
    from grammars.index.unit_index import from_outlines

    _library()  # numpy and the C routines (compiled on first use) load before "ready"
    trie = None
    if isinstance(vocabulary, tuple):  # (Vocabulary, token id -> bytes, logits width): TokenIndex by trie walk
        vocabulary, token_bytes, size = vocabulary
        trie = TokenTrie(token_bytes, PlainTokens(token_bytes, size))
    _write(out, ("ready", None))
    from grammars.errors import UnsupportedSchemaError
    from grammars.schema.json_schema import schema_to_regex

    while True:
        try:
            job = _read(inp, None)
        except EOFError:
            return
        try:
            if job[0] == "schema":  # ("schema", schema text, ignored keywords, free values) -> regex
                _write(out, ("ok", schema_to_regex(job[1], ignore_keywords=job[2], free_values=job[3])))
                continue
            _, regex, with_table, vocab_size, eos_ids = job
            if trie is None:  # a bare Vocabulary: outlines-core's own Index
                index = outlines_core.Index(regex, vocabulary)
            else:
                index = trie.index(regex)
                if index is None:  # no C library, or the regex holds the trie walk's sentinel byte
                    index = from_outlines(outlines_core.Index(regex, vocabulary), vocabulary.get_eos_token_id())
                    index.attach(trie.plain)
            if with_table:
                index = (index, build_budget_table(index, vocab_size, eos_ids))
            _write(out, ("ok", index))
        except UnsupportedSchemaError as e:
            _write(out, ("unsupported", (e.keyword, e.path, str(e))))
        except GrammarError as e:
            _write(out, ("invalid", str(e)))
        except Exception as e:  # noqa: BLE001 - report any compile failure to the parent
            _write(out, ("error", f"{type(e).__name__}: {e}"))


class CompileWorker:
    """One child process holding the vocabulary; ``build(regex, timeout_s)`` -> index.

    ``vocabulary_blob``: a pickled outlines-core Vocabulary (the child builds outlines-core Indexes), or
    (Vocabulary, token id -> bytes, logits width), with which it builds TokenIndexes
    (grammars/index/unit_index.py) by walking a token trie (grammars/index/token_index.py), not outlines-core's walk
    of every token from every state; they arrive without their plain tokens (TokenIndex.attach).

    ``vocab_size`` (logits width) and ``eos_ids``: budget tables also hold each state's sparse mask.
    """

    def __init__(self, vocabulary_blob: bytes, vocab_size: int | None = None, eos_ids=()) -> None:
        self._blob = vocabulary_blob  # pickled outlines_core.Vocabulary
        self._table_args = (vocab_size, tuple(sorted(eos_ids)))
        self._proc: subprocess.Popen | None = None
        self._ready = False

    def start(self) -> None:
        """Start the child if none runs (returns at once; readiness is awaited on build)."""
        if self._proc is not None:
            return
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for pipe in (self._proc.stdin, self._proc.stdout):
            _widen(pipe.fileno())
        self._proc.stdin.write(struct.pack("<Q", len(self._blob)) + self._blob)
        self._proc.stdin.flush()
        self._ready = False

    def build(self, regex: str, timeout_s: float, with_table: bool = False):
        """Compile ``regex`` in the child; kill it and raise CompileTimeout past the limit.

        Returns the index, or (TokenIndex, BudgetTable) with ``with_table`` (grammars/index/budget.py).
        """
        status, payload = self._run(("index", regex, with_table, *self._table_args), timeout_s, "grammar")
        if status != "ok":
            raise GrammarError(
                f"outlines-core could not build a token index for the regex: {payload}; "
                f"check the regex/schema is valid and satisfiable with this vocabulary"
            )
        return payload

    def schema_regex(self, schema_text: str, ignore_keywords: tuple, free_values: bool, timeout_s: float) -> str:
        """schema_to_regex in the child, under the same limit: a schema
        whose expansion explodes (nested oneOf, huge bounds) is killed with the child, never left
        burning a core."""
        status, payload = self._run(("schema", schema_text, tuple(ignore_keywords), free_values), timeout_s,
                                    "JSON schema into a regex")
        if status == "unsupported":
            keyword, path, message = payload
            error = UnsupportedSchemaError(keyword, path)
            error.args = (message,)
            raise error
        if status != "ok":
            raise GrammarError(payload)
        return payload

    def _run(self, job: tuple, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        self.start()
        fd = self._proc.stdout.fileno()
        try:
            if not self._ready:  # a fresh child (one killed by a limit is replaced at once): its start
                started = time.monotonic()  # has its own limit, and does not count toward the job's
                _read(fd, started + _STARTUP_TIMEOUT_S)
                self._ready = True
                deadline += time.monotonic() - started
            _write(self._proc.stdin, job)
            status, payload = _read(fd, deadline)
        except TimeoutError:
            was_ready = self._ready
            self.kill()
            if not was_ready:
                raise GrammarError(
                    f"the grammar compile worker did not start within {_STARTUP_TIMEOUT_S:g} s;"
                    f" check that `{sys.executable} -c 'import outlines_core'` works"
                ) from None
            raise CompileTimeout(timeout_s, what) from None
        except (EOFError, BrokenPipeError, OSError):
            self.kill()
            raise GrammarError(
                "the grammar compile worker died while compiling (out of memory?); "
                "simplify the schema or retry"
            ) from None
        return status, payload

    def kill(self) -> None:
        """Stop the child now (used on timeout and on close)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=5)
            self._proc.stdin.close()
            self._proc.stdout.close()
        self._proc, self._ready = None, False


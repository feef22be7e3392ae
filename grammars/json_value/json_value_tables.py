"""JsonValueTables: what every token does from every lexical state of compact JSON, as numpy arrays.

A token read from lexical state q (grammars/json_value/json_value_lexer.py) is rejected, or accepted with an
*effect* that does not depend on the stack below the containers it touches: it reads the
innermost containers (its *pattern*, innermost first: the ones it closes, plus the one a "," after
them continues), pops ``pops`` of them, pushes the containers it leaves open (outermost first),
ends in lexical state q2, and on the way rises at most ``rise`` levels above the depth it started
at (``[]`` rises 1, ``}{`` 0).  A token whose bytes reach a "," with no container of its own open
has two effects, one per type of the container it continues (``},"`` after an object in an object,
``},`` + value after an object in an array); a stack matches at most one of them.

Building: one regex call classifies each token inside a string (``STRING_RUN``: most of a
vocabulary stays in the string whole), and from the other states only the tokens whose first byte
that state allows are walked byte by byte (a dozen first bytes at most), so a 262k vocabulary
takes a few seconds of Python and a 49k one well under one.

Layout, all numpy (saved in an .npz without pickle): per state q, ``tok[off[q]:off[q+1]]`` the
accepted token ids (ascending) and ``res`` their result ids; a result is the alternative ids
``alt_of[res_off[r]:res_off[r+1]]``; an alternative is (pattern id, pops, push id, q2, rise);
patterns and pushes are container-type sequences in CSR form.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from grammars.json_value.json_value_lexer import (
    ARRAY, COMMA, FIRST_BYTES, KEY, NUM_STATES, OBJECT, POP, PUSH, STEP, STRING_BODIES, STRING_RUN,
    TRANSITIONS, VALUE,
)

ARRAY_NAMES = ("off", "tok", "res", "res_off", "alt_of", "alt_pat", "alt_pops", "alt_push", "alt_q", "alt_rise",
               "pat_off", "pat_types", "push_off", "push_types")


def simulate(q: int, data: bytes, pos: int = 0) -> list[tuple[tuple, int, tuple, int, int]]:
    """The effects of reading ``data[pos:]`` from lexical state ``q``: [] if rejected, else one or
    two (pattern, pops, pushes, q2, rise) tuples (see the module docstring)."""
    out: list = []
    _walk(q, data, pos, [], [], 0, 0, out)
    return out


def _walk(q: int, data: bytes, pos: int, local: list, pattern: list, pops: int, rise: int, out: list) -> None:
    n = len(data)
    while pos < n:
        if q in STRING_BODIES:
            pos = STRING_RUN.match(data, pos).end()
            if pos == n:
                break
        op, arg, q2 = TRANSITIONS[q][data[pos]]
        pos += 1
        if op == STEP:
            q = q2
        elif op == PUSH:
            local.append(arg)
            rise = max(rise, len(local) - pops)
            q = q2
        elif op == POP:
            if local:  # closes a container this token opened
                if local.pop() != arg:
                    return
            elif pops < len(pattern):  # closes the container a "," of this token continued
                if pattern[pops] != arg:
                    return
                pops += 1
            else:
                pattern.append(arg)
                pops += 1
            q = q2
        elif op == COMMA:
            known = local[-1] if local else pattern[pops] if pops < len(pattern) else None
            if known is None:  # the stack decides: one effect per container type
                for kind in (OBJECT, ARRAY):
                    _walk(KEY if kind == OBJECT else VALUE, data, pos, list(local), pattern + [kind], pops, rise, out)
                return
            q = KEY if known == OBJECT else VALUE
        else:
            return
    out.append((tuple(pattern), pops, tuple(local), q, rise))


class JsonValueTables:
    """The effect arrays of one vocabulary (immutable; see the module docstring)."""

    __slots__ = ARRAY_NAMES + ("size",)

    def __init__(self, size: int, arrays: dict[str, np.ndarray]) -> None:
        object.__setattr__(self, "size", int(size))
        for name in ARRAY_NAMES:
            object.__setattr__(self, name, arrays[name])
        if len(self.off) != NUM_STATES + 1 or self.off[-1] != len(self.tok) or len(self.tok) != len(self.res):
            raise ValueError("inconsistent JSON value tables: state offsets do not cover the token arrays")
        if self.tok.size and (self.tok.min() < 0 or self.tok.max() >= self.size):
            raise ValueError(f"JSON value tables name tokens outside the vocabulary of {self.size}")
        for ids, table, what in ((self.res, self.res_off, "results"), (self.alt_of, self.alt_q, "alternatives"),
                                 (self.alt_pat, self.pat_off, "patterns"), (self.alt_push, self.push_off, "pushes")):
            bound = len(table) - (1 if table is not self.alt_q else 0)
            if ids.size and (ids.min() < 0 or ids.max() >= bound):
                raise ValueError(f"inconsistent JSON value tables: ids of {what} out of range")
        if self.alt_q.size and (self.alt_q.min() < 0 or self.alt_q.max() >= NUM_STATES):
            raise ValueError("inconsistent JSON value tables: lexical states out of range")

    def __setattr__(self, name, value):
        raise AttributeError("JsonValueTables is immutable")

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAY_NAMES}

    def alternative(self, alt: int) -> tuple[tuple, int, tuple, int, int]:
        """(pattern, pops, pushes, q2, rise) of alternative ``alt``."""
        p, u = int(self.alt_pat[alt]), int(self.alt_push[alt])
        return (tuple(self.pat_types[self.pat_off[p]:self.pat_off[p + 1]].tolist()), int(self.alt_pops[alt]),
                tuple(self.push_types[self.push_off[u]:self.push_off[u + 1]].tolist()), int(self.alt_q[alt]),
                int(self.alt_rise[alt]))


class _Interner:
    def __init__(self) -> None:
        self.ids: dict = {}

    def __call__(self, key) -> int:
        got = self.ids.get(key)
        if got is None:
            got = self.ids[key] = len(self.ids)
        return got

    def items(self) -> list:
        return list(self.ids)  # insertion order = id order


def build_tables(token_bytes: dict[int, bytes], size: int) -> JsonValueTables:
    """Classify every token of ``token_bytes`` (id -> bytes, text tokens only) from every state."""
    tokens = sorted((t, b) for t, b in token_bytes.items() if b and 0 <= t < size)
    by_first: dict[int, list[tuple[int, bytes]]] = {}
    for t, b in tokens:
        by_first.setdefault(b[0], []).append((t, b))
    run_end = [STRING_RUN.match(b).end() for _, b in tokens]  # string content from byte 0
    results, alternatives, patterns, pushes = _Interner(), _Interner(), _Interner(), _Interner()
    patterns(())
    pushes(())

    def result_of(alts) -> int:
        return results(tuple(alternatives((patterns(p), k, pushes(u), q2, r)) for p, k, u, q2, r in alts))

    off, tok_parts, res_parts = [0], [], []
    for q in range(NUM_STATES):
        ids: list[int] = []
        res: list[int] = []
        if q in STRING_BODIES:
            stay = result_of([((), 0, (), q, 0)])
            for (t, b), end in zip(tokens, run_end):
                if end == len(b):
                    ids.append(t)
                    res.append(stay)
                else:
                    alts = simulate(q, b, end)
                    if alts:
                        ids.append(t)
                        res.append(result_of(alts))
        else:
            for first in FIRST_BYTES[q]:
                for t, b in by_first.get(first, ()):
                    alts = simulate(q, b)
                    if alts:
                        ids.append(t)
                        res.append(result_of(alts))
        ids_a, res_a = np.asarray(ids, dtype=np.int32), np.asarray(res, dtype=np.int32)
        order = np.argsort(ids_a, kind="stable")
        tok_parts.append(ids_a[order])
        res_parts.append(res_a[order])
        off.append(off[-1] + len(ids))
    return JsonValueTables(size, _pack(off, tok_parts, res_parts, results, alternatives, patterns, pushes))


def _csr(seqs: list[tuple], dtype) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    flat = np.fromiter((x for s in seqs for x in s), dtype=dtype, count=int(offsets[-1]))
    return offsets, flat


def _pack(off, tok_parts, res_parts, results, alternatives, patterns, pushes) -> dict[str, np.ndarray]:
    res_off, alt_of = _csr(results.items(), np.int32)
    alts = alternatives.items()
    pat_off, pat_types = _csr(patterns.items(), np.int8)
    push_off, push_types = _csr(pushes.items(), np.int8)
    empty = np.zeros(0, dtype=np.int32)
    return {
        "off": np.asarray(off, dtype=np.int64),
        "tok": np.concatenate(tok_parts) if tok_parts else empty,
        "res": np.concatenate(res_parts) if res_parts else empty,
        "res_off": res_off, "alt_of": alt_of,
        "alt_pat": np.asarray([a[0] for a in alts], dtype=np.int32),
        "alt_pops": np.asarray([a[1] for a in alts], dtype=np.int16),
        "alt_push": np.asarray([a[2] for a in alts], dtype=np.int32),
        "alt_q": np.asarray([a[3] for a in alts], dtype=np.int16),
        "alt_rise": np.asarray([a[4] for a in alts], dtype=np.int16),
        "pat_off": pat_off, "pat_types": pat_types, "push_off": push_off, "push_types": push_types,
    }


def save_tables(tables: JsonValueTables, path: str) -> None:
    """Write ``tables`` to ``path`` (.npz, numpy arrays only), atomically: a temp file, then os.replace."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, size=np.asarray(tables.size, dtype=np.int64), **tables.arrays())
    os.replace(tmp, path)


def load_tables(path: str) -> JsonValueTables:
    """Tables saved by ``save_tables``; ValueError (or OSError) if the file is unreadable or inconsistent."""
    with np.load(path, allow_pickle=False) as data:
        missing = [name for name in ARRAY_NAMES + ("size",) if name not in data.files]
        if missing:
            raise ValueError(f"{path} lacks arrays {missing}")
        return JsonValueTables(int(data["size"]), {name: data[name] for name in ARRAY_NAMES})

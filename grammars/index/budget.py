"""Token budgets: how few tokens each state of a compiled grammar needs to reach acceptance.

``BudgetTable`` holds, for every state of a unit's TokenIndex (grammars/index/unit_index.py), ``distance``
(the fewest tokens that reach a final state: a BFS backwards from the finals over the token-level
transitions). With
``n`` tokens left after the current one, a token is allowed iff the state it leads to has distance
<= n. To build that mask without walking every token, the table also keeps per state ``far`` (the
farthest successor's distance: n >= far rules nothing out), ``mode`` (the most common successor
distance; inside a JSON string, that of the ~48k tokens that stay in the string) and the *odd*
tokens whose successor distance is not the mode: a budget mask is the state's full mask minus odd
tokens (n >= mode) or the odd tokens alone (n < mode).

With the logits width and EOS ids, the same pass also stores every state's mask in the short form
grammars/masks/sparse_mask.py applies on CPU (``sparse``: a kind per state, 0 none / 1 allowed ids / 2
banned ids, and CSR int32 ids) and its token count, so that a state's first visit, like every
later one, needs no bitmask (CompiledGrammar.state_sparse_mask). A grammar whose lists would
exceed ``SPARSE_IDS_CAP`` ids keeps none (its states are then masked lazily).

The table is built once per grammar at compile time (in the compile worker) and cached with it.
The table is computed by a small C routine (``_index_table.c``) straight from the index's arrays
(grammars/index/unit_index.py), a loop state's plain tokens counted without being listed; it is compiled
with the system C compiler on first use and cached. Where no compiler is available, a pure-Python
path over ``get_transitions()`` gives the same table, slowly.
"""

from __future__ import annotations

import ctypes
import logging
from bisect import bisect_right
from collections import Counter, deque

import numpy as np

from grammars.index import native
from grammars.index.native import copied

log = logging.getLogger("maskd.grammars")

# The rule of a short form (grammars/masks/sparse_mask.py imports it from here: this module, loaded by the
# compile worker, imports no torch): banned ids when at most DISALLOWED_MAX and no more than the
# allowed ones, else allowed ids when at most ALLOWED_MAX, else none.
ALLOWED_MAX = 4096  # longest allowed-id list kept (32 KB of int64; apply ~17 us)
DISALLOWED_MAX = 8192  # longest disallowed-id list kept (64 KB; apply ~16 us)
NEVER_NARROWED = -(1 << 62)  # a safe budget below any budget: no budget narrows the mask
SPARSE_IDS_CAP = 16 << 20  # int32 ids kept per grammar at most (64 MB); above: no precomputed forms
NONE, ALLOWED, BANNED = 0, 1, 2  # sparse kinds
FEW_ODD = 32  # restriction reads a state's odd tokens as Python ints up to this many (most states have under 8)


class BudgetTable:
    """Per-state distances to acceptance and odd tokens of one index (immutable, picklable)."""

    __slots__ = ("keys", "distance", "far", "mode", "odd_off", "odd_tok", "odd_dist", "count", "sparse", "_dense",
                 "_safe", "_rows", "_distances")

    def __init__(self, keys, distance, far, mode, odd_off, odd_tok, odd_dist, count=None, sparse=None) -> None:
        self.keys = np.asarray(keys, dtype=np.uint32)  # [S] state ids
        self.distance = np.asarray(distance, dtype=np.int32)  # [S]; -1: no final state reachable
        self.far = np.asarray(far, dtype=np.int32)  # [S] farthest successor's distance
        self.mode = np.asarray(mode, dtype=np.int32)  # [S] most common successor distance
        self.odd_off = np.asarray(odd_off, dtype=np.int64)  # [S + 1]
        self.odd_tok = np.asarray(odd_tok, dtype=np.int32)  # [T] successor distance != mode; a state's by distance
        self.odd_dist = np.asarray(odd_dist, dtype=np.int32)  # [T]
        # [S] the state's tokens, EOS not counted (CompiledGrammar._build's count), or None
        self.count = None if count is None else np.asarray(count, dtype=np.int32)
        # (vocab_size, kind int8 [S], off int32 [S + 1], ids int32 [N]), or None: masks built lazily
        self.sparse = None
        if sparse is not None:
            size, kind, off, ids = sparse
            self.sparse = (int(size), np.asarray(kind, dtype=np.int8), np.asarray(off, dtype=np.int32),
                           np.asarray(ids, dtype=np.int32))
        self._dense = {int(k): i for i, k in enumerate(self.keys)}
        self._safe: dict[int, int] = {}  # state -> safe_budget(state)
        self._rows: dict[int, tuple] = {}  # state -> restriction's (far, mode, odd tokens, their distances)
        self._distances: dict[int, int] = {}  # state -> distance_of(state)

    def __getstate__(self):
        return (self.keys, self.distance, self.far, self.mode, self.odd_off, self.odd_tok, self.odd_dist,
                self.count, self.sparse)

    def __setstate__(self, state) -> None:
        self.__init__(*state)

    def distance_of(self, state: int) -> int:
        """Fewest tokens from ``state`` to a final state (0 in a final state). Memoised as a Python int:
        the matchers ask at narrowed steps, and numpy's scalar read costs µs with the caches cold."""
        got = self._distances.get(state)
        if got is None:
            got = self._distances[state] = int(self.distance[self._dense[state]])
        return got

    def safe_budget(self, state: int) -> int:
        """The least budget (tokens left, this one included) at which a Matcher's mask in ``state``
        is not narrowed, nor at any larger one: its limit max(budget - 1, distance - 1) then reaches
        ``far`` (restriction None). NEVER_NARROWED where even budget 0 does. Memoised: the engine asks
        at every step."""
        got = self._safe.get(state)
        if got is None:
            i = self._dense[state]
            far, distance = int(self.far[i]), int(self.distance[i])
            got = self._safe[state] = far + 1 if distance < far + 1 else NEVER_NARROWED
        return got

    def restriction(self, state: int, limit: int) -> tuple[str, list[int] | np.ndarray] | None:
        """Which tokens of ``state`` a budget of ``limit`` tokens after this one rules in or out.

        None: none ruled out. ("drop", ids): the state's tokens except ids. ("only", ids): ids alone.
        The ids are a slice of the state's odd tokens, which are ordered by distance (a prefix for
        "only", a suffix for "drop"; not by id): a list where the state has at most ``FEW_ODD`` odd
        tokens (most states; read as Python ints, memoised per state: numpy's calls cost several µs
        each at a state's first narrowed visit, cache-cold after a forward pass), else an int32 array
        (a view). Inside a string thousands are odd, and a budget near the end of max_tokens is a new
        limit at each token: picking them by a mask of their distances took 46-69 µs of such a step's
        lookup under cProfile, where a slice takes one search.
        """
        row = self._rows.get(state)
        if row is None:
            i = self._dense[state]
            lo, hi = int(self.odd_off[i]), int(self.odd_off[i + 1])
            tokens, dist = self.odd_tok[lo:hi], self.odd_dist[lo:hi]
            if hi - lo <= FEW_ODD:
                tokens, dist = tokens.tolist(), dist.tolist()
            row = self._rows[state] = (int(self.far[i]), int(self.mode[i]), tokens, dist)
        far, mode, tokens, dist = row
        if limit >= far:
            return None
        cut = bisect_right(dist, limit) if isinstance(dist, list) else int(dist.searchsorted(limit, "right"))
        return ("drop", tokens[cut:]) if limit >= mode else ("only", tokens[:cut])

    def state_count(self, state: int) -> int | None:
        """The state's tokens, EOS not counted (None: not stored, or not a state here)."""
        i = self._dense.get(state)
        return None if i is None or self.count is None else int(self.count[i])

    def sparse_ids(self, state: int, vocab_size: int) -> tuple[int, np.ndarray] | None:
        """(kind, int32 ascending ids) of the state's mask over ``vocab_size`` tokens; None if not
        stored (no forms, another width, or not a state here). Kind NONE: both sides are long."""
        i = self._dense.get(state)
        if i is None or self.sparse is None or self.sparse[0] != vocab_size:
            return None
        _, kind, off, ids = self.sparse
        return int(kind[i]), ids[off[i]:off[i + 1]]


def build_budget_table(index, vocab_size: int | None = None, eos_ids=(), ids_cap: int = SPARSE_IDS_CAP) -> BudgetTable:
    """The BudgetTable of a TokenIndex (grammars/index/unit_index.py; C path, or the slow Python path).

    ``vocab_size`` (the logits width) and ``eos_ids`` (every EOS id, allowed in final states):
    also store each state's sparse mask, if they total at most ``ids_cap`` ids.
    """
    library = _library()
    if library is None:
        return budget_table_from_transitions(index, vocab_size, eos_ids, ids_cap)
    eos = np.array(sorted(set(eos_ids)), dtype=np.int32)
    plain = index.plain.ids if index.plain is not None else np.zeros(0, dtype=np.int32)
    if index.loop.any() and index.plain is None:
        raise ValueError("an index with loop states needs its vocabulary's plain tokens (TokenIndex.attach)")
    fits = index.plain is not None and index.plain.size == vocab_size  # its packed row, made once per vocabulary
    bits = index.plain.words if fits else np.zeros(0, dtype=np.uint32)
    table = _Table()
    arrays = [np.ascontiguousarray(a) for a in (index.off, index.tok, index.nxt, index.final, index.loop, plain, bits, eos)]
    off, tok, nxt, final, loop, plain, bits, eos = arrays  # held here while the C routine reads them
    rc = library.index_table(index.n_states, *(a.ctypes.data_as(ctypes.c_void_p) for a in (off, tok, nxt, final, loop,
                                                                                          plain)),
                             len(plain), bits.ctypes.data_as(ctypes.c_void_p) if fits else None, vocab_size or 0,
                             eos.ctypes.data_as(ctypes.c_void_p), len(eos), ALLOWED_MAX, DISALLOWED_MAX, ids_cap,
                             ctypes.byref(table))
    if rc != 0:
        log.warning("index_table failed (%d); using the Python path", rc)
        return budget_table_from_transitions(index, vocab_size, eos_ids, ids_cap)
    try:
        s, t, n = table.n_states, table.n_odd, table.n_sparse
        sparse = None
        if n >= 0:
            sparse = (vocab_size, copied(table.sp_kind, s, np.int8), copied(table.sp_off, s + 1, np.int32),
                      copied(table.sp_ids, n, np.int32))
        return BudgetTable(
            copied(table.keys, s, np.uint32), copied(table.dist, s, np.int32), copied(table.far, s, np.int32),
            copied(table.mode, s, np.int32), copied(table.odd_off, s + 1, np.int64),
            copied(table.odd_tok, t, np.int32), copied(table.odd_dist, t, np.int32),
            copied(table.count, s, np.int32), sparse)
    finally:
        library.index_table_free(ctypes.byref(table))


def budget_table_from_transitions(index, vocab_size: int | None = None, eos_ids=(),
                                  ids_cap: int = SPARSE_IDS_CAP) -> BudgetTable:
    """The same table through ``get_transitions()`` (reference and fallback; slow on big indexes)."""
    transitions = index.get_transitions()
    keys = list(transitions)
    dense = {k: i for i, k in enumerate(keys)}
    incoming: list[list[int]] = [[] for _ in keys]
    for s, row in transitions.items():
        for nxt in row.values():
            incoming[dense[nxt]].append(dense[s])
    distance = [-1] * len(keys)
    queue = deque()
    for f in index.get_final_states():
        if f in dense and distance[dense[f]] < 0:
            distance[dense[f]] = 0
            queue.append(dense[f])
    while queue:
        u = queue.popleft()
        for s in incoming[u]:
            if distance[s] < 0:
                distance[s] = distance[u] + 1
                queue.append(s)
    far, mode, off, tok, dist = [], [], [0], [], []
    for s, row in transitions.items():
        ds = {t: distance[dense[n]] for t, n in row.items()}
        far.append(max(ds.values(), default=-1))
        counts = Counter(d for d in ds.values() if d >= 0)
        common = max(counts, key=lambda d: (counts[d], -d), default=-1)  # ties: the nearer distance
        mode.append(common)
        odd = [(t, d) for t, d in ds.items() if d >= 0 and d != common]
        for t, d in sorted(odd, key=lambda item: item[1]):  # by distance, as _index_table.c orders them
            tok.append(t)
            dist.append(d)
        off.append(len(tok))
    count = [len(row) for row in transitions.values()] if eos_ids else None
    sparse = None
    if vocab_size:
        sparse = _sparse_forms(transitions, set(index.get_final_states()), vocab_size, eos_ids, ids_cap)
    return BudgetTable(keys, distance, far, mode, off, tok, dist, count, sparse)


def _sparse_forms(transitions, finals, vocab_size: int, eos_ids, ids_cap: int):
    """(vocab_size, kind, off, ids) as _index_table.c writes them, or None over ``ids_cap`` ids."""
    extra = np.array(sorted({e for e in eos_ids if 0 <= e < vocab_size}), dtype=np.int64)
    kinds, off, lists = [], [0], []
    for state, row in transitions.items():
        allowed = np.fromiter(row, dtype=np.int64, count=len(row))
        allowed = allowed[(allowed >= 0) & (allowed < vocab_size)]
        if state in finals:
            allowed = np.union1d(allowed, extra)
        allowed = np.unique(allowed)
        banned = vocab_size - len(allowed)
        if banned <= DISALLOWED_MAX and banned <= len(allowed):
            kinds.append(BANNED)
            lists.append(np.setdiff1d(np.arange(vocab_size), allowed, assume_unique=True))
        elif len(allowed) <= ALLOWED_MAX:
            kinds.append(ALLOWED)
            lists.append(allowed)
        else:
            kinds.append(NONE)
            lists.append(allowed[:0])
        off.append(off[-1] + len(lists[-1]))
        if off[-1] > ids_cap:
            return None
    ids = np.concatenate(lists) if lists else np.zeros(0, dtype=np.int64)
    return vocab_size, kinds, off, ids


class _Table(ctypes.Structure):
    _fields_ = [
        ("n_states", ctypes.c_int64), ("n_trans", ctypes.c_int64), ("n_odd", ctypes.c_int64),
        ("keys", ctypes.POINTER(ctypes.c_uint32)), ("dist", ctypes.POINTER(ctypes.c_int32)),
        ("far", ctypes.POINTER(ctypes.c_int32)), ("mode", ctypes.POINTER(ctypes.c_int32)),
        ("odd_off", ctypes.POINTER(ctypes.c_int64)), ("odd_tok", ctypes.POINTER(ctypes.c_int32)),
        ("odd_dist", ctypes.POINTER(ctypes.c_int32)),
        ("n_sparse", ctypes.c_int64), ("count", ctypes.POINTER(ctypes.c_int32)),
        ("sp_kind", ctypes.POINTER(ctypes.c_int8)), ("sp_off", ctypes.POINTER(ctypes.c_int32)),
        ("sp_ids", ctypes.POINTER(ctypes.c_int32)),
    ]


_DECLARED: list = []


def _library():
    """The C library with index_table declared, or None (grammars/index/native.py)."""
    library = native.library()
    if library is not None and not _DECLARED:
        library.index_table.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 6 + [
            ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p] + [ctypes.c_int64] * 4 + [
            ctypes.POINTER(_Table)]
        library.index_table.restype = ctypes.c_int
        library.index_table_free.argtypes = [ctypes.POINTER(_Table)]
        library.index_table_free.restype = None
        _DECLARED.append(True)
    return library

"""JsonValueAutomaton: one token-level pushdown automaton per vocabulary for any compact JSON value.

OpenAI's ``json_object`` and the schemas ``{}`` / ``true`` accept any JSON value of any depth; a
regex can only unroll a fixed depth (depth 3 compiles in 11 s on a 49k vocabulary, 26 s on a
262k one).  This automaton is built once per vocabulary in well under a second (a few seconds of
Python at most) and shared by every request (grammars/json_value/json_value_cache.py, with its disk cache);
JsonValueMatcher (grammars/json_value/json_value_matcher.py) is its per-request cursor.

A state is (q, stack): a lexical state (grammars/json_value/json_value_lexer.py) and the open containers,
held as immutable ``Frame`` chains so that a state can be snapshotted and rolled back for free.
As in xgrammar, most of a token's effect does not depend on the stack: the tables
(grammars/json_value/json_value_tables.py) give, per lexical state, each token's *alternatives* (the innermost
container types it reads, how many it closes, what it opens, where it ends).  A token is allowed
in (q, stack) iff one of its alternatives' patterns matches the innermost containers and it does
not open more than MAX_DEPTH containers; so the mask depends on q, the innermost ``reads[q]``
types, whether the stack is empty (EOS) and the head-room below the cap, and is memoised per that
key as a packed int32 row (grammars/masks/bitmask.py) and a SparseMask: a step is a dict lookup and a
copy.  Distances to completion (budgets, ``min_tokens``) come from JsonValueDistance's interned
stack profiles, memoised per (q, profiles of the innermost ``pops[q] + 1`` depths, head-room).

Over 300 lines: the automaton is one idea, its state, step and mask read together.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from grammars.masks.bitmask import words_on
from grammars.index.budget import ALLOWED_MAX, DISALLOWED_MAX, NEVER_NARROWED
from grammars.json_value.json_value_distance import INF, JsonValueDistance
from grammars.json_value.json_value_lexer import COMPLETE, MAX_DEPTH, NUM_STATES, TOP_OBJECT, VALUE, scan
from grammars.json_value.json_value_tables import JsonValueTables
from grammars.masks.second_ask import SecondAsk
from grammars.masks.sparse_mask import SparseMask, allowed_sparse, changed, sparse_mask


class Frame:
    """One open container (or the empty stack: ``kind`` None) and its distance profile; immutable."""

    __slots__ = ("parent", "kind", "depth", "top", "pids", "base", "kinds")

    def __init__(self, parent, kind, depth: int, top: tuple, pids: tuple, base: int) -> None:
        self.parent, self.kind, self.depth = parent, kind, depth
        self.top = top  # container types, innermost first (at most the automaton's max_read)
        self.pids = pids  # distance profiles of this depth and those below (at most max_pops + 1)
        self.base = base  # fewest tokens to close every container from right after a value
        # container types, outermost first: made once, as masks key on it per token
        self.kinds = () if parent is None else parent.kinds + (kind,)


class Entry(NamedTuple):
    """The memoised mask of one (q, innermost types, empty stack, head-room) key."""
    row: torch.Tensor  # int32 [ceil(size/32)]
    sparse: SparseMask | None
    chunks: tuple  # ((alternative id, int32 token ids), ...) allowed here
    count: int  # allowed tokens, EOS not counted
    single: int  # the only allowed token when count == 1 and EOS is not allowed, else -1
    final: bool  # the value is complete: EOS allowed


class JsonValueAutomaton:
    """Per-vocabulary tables and memoised masks; thread-safe, shared by every JsonValueMatcher."""

    def __init__(self, tables: JsonValueTables, eos_token_ids, fingerprint: str = "") -> None:
        self.tables = tables
        self.size = tables.size
        self.width = (self.size + 31) // 32
        self.fingerprint = fingerprint
        self.eos_token_ids = frozenset(int(e) for e in eos_token_ids)
        self._eos_ids = np.array(sorted(e for e in self.eos_token_ids if 0 <= e < self.size), dtype=np.int64)
        self._eos_words = np.zeros(self.width, dtype=np.uint32)
        words_on(self._eos_words, self._eos_ids.tolist())
        self.distance = JsonValueDistance(tables)
        self._alts = [tables.alternative(a) for a in range(len(tables.alt_q))]
        self._results = [tuple(tables.alt_of[tables.res_off[r]:tables.res_off[r + 1]].tolist())
                         for r in range(len(tables.res_off) - 1)]
        several = np.array([len(alts) > 1 for alts in self._results], dtype=bool)
        # per q: token -> result id; ((alt, tokens), ...); {token with several alternatives: their ids}
        self._lookup, self._chunks, self._multi = [], [], []
        for q in range(NUM_STATES):
            toks, res = tables.tok[tables.off[q]:tables.off[q + 1]], tables.res[tables.off[q]:tables.off[q + 1]]
            if len(toks) > self.size // 16:
                lookup = np.full(self.size, -1, dtype=np.int32)
                lookup[toks] = res
            else:
                lookup = dict(zip(toks.tolist(), res.tolist()))
            self._lookup.append(lookup)
            by_alt: dict[int, list[np.ndarray]] = {}
            for r in np.unique(res).tolist():
                for alt in self._results[r]:
                    by_alt.setdefault(alt, []).append(toks[res == r])
            self._chunks.append(tuple((alt, np.concatenate(parts)) for alt, parts in by_alt.items()))
            multi = several[res]  # a few dozen tokens in all
            self._multi.append({t: self._results[r] for t, r in zip(toks[multi].tolist(), res[multi].tolist())})
        alts_of = [[self._alts[a] for a, _ in self._chunks[q]] for q in range(NUM_STATES)]
        self.reads = [max((len(a[0]) for a in alts), default=0) for alts in alts_of]  # innermost types read
        self.pops = [max((a[1] for a in alts), default=0) for alts in alts_of]
        self.rise = [max((a[4] for a in alts), default=0) for alts in alts_of]
        self.max_read, self.max_pops = max(self.reads), max(max(self.pops), self.distance.max_pops)
        self.root = Frame(None, None, 0, (), (self.distance.root,), 0)
        self._words: dict[tuple[int, int], np.ndarray] = {}  # (q, alt) -> uint32 [width]
        self._entries: dict[tuple, Entry] = {}
        self._costs: dict[tuple, tuple[int, tuple[int, ...], int]] = {}  # -> (cur - base, deltas per chunk, far)
        self._cuts: dict[tuple, tuple[int, tuple[int, ...]]] = {}  # the same keys -> (cur - base, distinct deltas)
        self._budget_rows: dict[tuple, torch.Tensor] = {}
        self._budget_sparse = SecondAsk(self.size)  # budget_rows' keys -> their SparseMasks
        self._kept: dict[tuple, SparseMask | None] = {}  # (entry id, chunks kept) -> _budget_ids' mask
        self._shared: dict[tuple, object] = {}  # what every grammar's free values read alike: kept()
        with torch.inference_mode(False):
            self.nothing_allowed = SparseMask(True, torch.empty(0, dtype=torch.int64), self.size)

    def kept(self, key: tuple, make):
        """The entry at ``key`` of a memo shared by every grammar's free values (grammars/json_value/hole_ids.py,
        grammars/json_value/value_rungs.py: masks that read nothing of a unit), made by ``make()`` on its first ask
        (one made meanwhile by another thread is the one kept and read)."""
        if key not in self._shared:
            self._shared.setdefault(key, make())
        return self._shared[key]

    def initial(self, top: str = "object") -> tuple[int, Frame]:
        """The initial (q, frame): ``top`` "object" (one JSON object) or "value" (any JSON value)."""
        return (TOP_OBJECT if top == "object" else VALUE), self.root

    def scan(self, state: tuple[int, tuple[int, ...]], data: bytes):
        """grammars.json_value.json_value_lexer.scan: (new (q, stack) or None, bytes consumed)."""
        return scan(state, data)

    def frame_of(self, stack: tuple[int, ...]) -> Frame:
        """The Frame of a stack of container types (outermost first), e.g. from ``scan``."""
        frame = self.root
        for kind in stack:
            frame = self.push(frame, kind)
        return frame

    def push(self, frame: Frame, kind: int) -> Frame:
        """``frame`` with one more container of type ``kind`` open."""
        pid, rise = self.distance.push(frame.pids[0], kind)
        return Frame(frame, kind, frame.depth + 1, ((kind,) + frame.top)[:self.max_read],
                     ((pid,) + frame.pids)[:self.max_pops + 1], frame.base + rise)

    def step(self, q: int, frame: Frame, token: int) -> tuple[int, Frame] | None:
        """(q, frame) after a text token, or None if the token is not allowed (EOS never is here)."""
        lookup = self._lookup[q]
        if isinstance(lookup, dict):
            res = lookup.get(token)
        else:
            res = int(lookup[token]) if 0 <= token < self.size else -1
        if res is None or res < 0:
            return None
        for alt in self._results[res]:
            pattern, pops, pushes, q2, rise = self._alts[alt]
            if frame.top[:len(pattern)] == pattern and frame.depth + rise <= MAX_DEPTH:
                for _ in range(pops):
                    frame = frame.parent
                for kind in pushes:
                    frame = self.push(frame, kind)
                return q2, frame
        return None

    def is_final(self, q: int, frame: Frame) -> bool:
        return frame.depth == 0 and q in COMPLETE

    def entry(self, q: int, frame: Frame) -> Entry:
        """The memoised mask of (q, frame)."""
        room = min(MAX_DEPTH - frame.depth, self.rise[q])
        key = (q, frame.top[:self.reads[q]], frame.depth == 0, room)
        got = self._entries.get(key)
        if got is None:
            got = self._entries.setdefault(key, self._make_entry(q, frame, room))
        return got

    def _make_entry(self, q: int, frame: Frame, room: int) -> Entry:
        final = self.is_final(q, frame)
        words = self._eos_words.copy() if final else np.zeros(self.width, dtype=np.uint32)
        chunks = []
        for alt, tokens in self._chunks[q]:
            pattern, _, _, _, rise = self._alts[alt]
            if rise <= room and frame.top[:len(pattern)] == pattern:
                chunks.append((alt, tokens))
                words |= self._chunk_words(q, alt, tokens)
        count = sum(len(t) for _, t in chunks)
        single = int(chunks[0][1][0]) if count == 1 and not final else -1
        with torch.inference_mode(False):  # read both inside and outside the engine's step
            row = torch.from_numpy(words.view(np.int32))  # [width]
            return Entry(row, sparse_mask(row, self.size), tuple(chunks), count, single, final)

    def _chunk_words(self, q: int, alt: int, tokens: np.ndarray) -> np.ndarray:
        """uint32 [width]: the packed bits of ``tokens`` (memoised per state and alternative)."""
        words = self._words.get((q, alt))
        if words is None:
            bits = np.zeros(self.width * 32, dtype=bool)
            bits[tokens] = True
            words = self._words.setdefault((q, alt), np.packbits(bits, bitorder="little").view(np.uint32))
        return words

    def min_tokens(self, q: int, frame: Frame) -> int:
        """Fewest tokens from (q, frame) to a complete value (EOS not counted)."""
        cost = self.distance.row(frame.pids[0])[q]
        if cost < INF:
            return frame.base + cost
        return frame.base + self._costs_of(q, frame)[0]

    def after(self, alt: int, frame: Frame) -> int:
        """min_tokens after taking alternative ``alt`` from a state whose stack is ``frame``."""
        _, pops, pushes, q2, _ = self._alts[alt]
        for _ in range(pops):
            frame = frame.parent
        pid, base = frame.pids[0], frame.base
        for kind in pushes:
            pid, rise = self.distance.push(pid, kind)
            base += rise
        cost = self.distance.row(pid)[q2]
        return base + cost if cost < INF else INF

    def _costs_of(self, q: int, frame: Frame) -> tuple[int, tuple[int, ...], int]:
        """(min_tokens - frame.base, min_tokens after each allowed chunk - min_tokens, the largest)."""
        key = self._costs_key(q, frame)
        got = self._costs.get(key)
        if got is None:
            entry = self.entry(q, frame)
            after = [self.after(alt, frame) for alt, _ in entry.chunks]
            cost = self.distance.row(frame.pids[0])[q]
            cur = frame.base + cost if cost < INF else 1 + min(after, default=INF)
            deltas = tuple(a - cur for a in after)
            got = self._costs.setdefault(key, (cur - frame.base, deltas, max(deltas, default=-1)))
        return got

    def _costs_key(self, q: int, frame: Frame) -> tuple:
        """What _costs_of reads of the stack at q: the key of its memo, and budget keys' start."""
        return q, frame.pids[:self.pops[q] + 1], min(MAX_DEPTH - frame.depth, self.rise[q])

    def safe_budget(self, q: int, frame: Frame) -> int:
        """The least budget at which budget_row(q, frame, budget) is None, and at every larger one."""
        rel, _, far = self._costs_of(q, frame)
        return frame.base + rel + far + 1 if far >= 0 else NEVER_NARROWED

    def budget_row(self, q: int, frame: Frame, budget: int) -> torch.Tensor | None:
        """int32 [width]: the tokens after which a complete value is at most ``budget - 1`` tokens
        away (if none, those that get nearest; EOS where complete); None if that rules out nothing."""
        key = self.budget_key(q, frame, budget)
        return None if key is None else self._budget_row(key, q, frame)

    def budget_sparse(self, q: int, frame: Frame, budget: int) -> SparseMask | None:
        """budget_row's SparseMask: on the first ask where few tokens are allowed (from the allowed
        chunks' ids), else from the second ask on (grammars/masks/second_ask.py); otherwise None.
        Only where budget_row is not None."""
        key = self.budget_key(q, frame, budget)
        return self._budget_sparse.get(key, lambda: self._budget_row(key, q, frame),
                                       lambda: self._budget_ids(q, frame, key[-1]))

    def sparse_at(self, q: int, frame: Frame, budget: int) -> SparseMask | None:
        """entry(q, frame).sparse where ``budget`` narrows nothing (from safe_budget on), else
        budget_sparse's mask: the costs read once for both (a state's first narrowed visit asks here,
        its caches cold after a forward pass, where each read costs µs)."""
        key = self._costs_key(q, frame)
        rel, deltas, far = self._costs.get(key) or self._costs_of(q, frame)
        slack = self._slack(frame.base + rel, budget)
        if slack >= far:
            return self.entry(q, frame).sparse
        key += (slack,)
        return self._budget_sparse.get(key, lambda: self._budget_row(key, q, frame),
                                       lambda: self._budget_ids(q, frame, slack))

    def budget_cuts(self, q: int, frame: Frame) -> tuple[int, tuple[int, ...], tuple]:
        """(min_tokens(q, frame); the distinct costs its allowed chunks add, ascending; the key of those
        costs): budget_sparse's mask at a budget depends on it only through how many of these costs
        the slack (``_slack``) reaches, all of them from safe_budget on."""
        key = self._costs_key(q, frame)
        got = self._cuts.get(key)
        if got is None:
            rel, deltas, _ = self._costs_of(q, frame)
            got = self._cuts.setdefault(key, (rel, tuple(sorted(set(deltas)))))
        return frame.base + got[0], got[1], key

    def budget_key(self, q: int, frame: Frame, budget: int) -> tuple | None:
        """The key budget_row(q, frame, budget) is memoised under (what it reads of the stack), or None
        where the budget narrows nothing."""
        rel, _, far = self._costs_of(q, frame)
        slack = self._slack(frame.base + rel, budget)
        return None if slack >= far else self._costs_key(q, frame) + (slack,)

    @staticmethod
    def _slack(cur: int, budget: int) -> int:
        """How many tokens more than the fewest (``cur``) a token may leave to write at ``budget``."""
        return max(budget - 1, cur - 1) - cur

    def make_budget_masks(self, q: int, frame: Frame) -> None:
        """budget_sparse's masks of (q, frame) made ahead at every cut a budget can make, where they
        can be made without a row (warm_automaton, at startup): a state's first narrowed visit then
        reads one memo, where making it there cost 15-25 µs with the caches cold."""
        key, (_, _, far) = self._costs_key(q, frame), self._costs_of(q, frame)
        for slack in range(-1, far):
            self._budget_sparse.put(key + (slack,), lambda: self._budget_ids(q, frame, slack))

    def _budget_ids(self, q: int, frame: Frame, slack: int) -> SparseMask | None:
        """budget_row's SparseMask at a key's ``slack``, made from id lists, no row: the allowed
        chunks' ids where they are few; else the entry's banned ids and the ruled-out chunks' where
        those are (a token in two chunks, one kept, stays allowed); else None."""
        entry = self.entry(q, frame)
        keep = tuple(map(slack.__ge__, self._costs_of(q, frame)[1]))  # each chunk's delta <= slack
        chosen = (id(entry), keep)  # many keys keep the same chunks of one entry
        if chosen not in self._kept:  # one made meanwhile by another thread is the one kept and read
            self._kept.setdefault(chosen, self._kept_ids(q, entry, keep))
        return self._kept[chosen]

    def _kept_ids(self, q: int, entry: Entry, keep: tuple[bool, ...]) -> SparseMask | None:
        """_budget_ids' mask of ``entry`` (at lexical state ``q``) with the chunks ``keep`` marks."""
        kept = [tokens for (_, tokens), k in zip(entry.chunks, keep) if k]
        if entry.final:
            kept.append(self._eos_ids)
        if sum(len(tokens) for tokens in kept) <= ALLOWED_MAX:
            return allowed_sparse(np.concatenate(kept) if kept else self._eos_ids[:0], self.size)
        dropped = [tokens for (_, tokens), k in zip(entry.chunks, keep) if not k]
        if entry.sparse is None or entry.sparse.allowed or sum(len(t) for t in dropped) > DISALLOWED_MAX:
            return None
        banned = np.concatenate(dropped) if dropped else self._eos_ids[:0]
        alts = {alt for (alt, _), k in zip(entry.chunks, keep) if k}
        both = [token for token, its in self._multi[q].items() if not alts.isdisjoint(its)]
        return changed(entry.sparse, both, banned)  # ``both`` are allowed in the entry: not among its banned

    def _budget_row(self, key: tuple, q: int, frame: Frame) -> torch.Tensor:
        got = self._budget_rows.get(key)
        if got is None:
            entry, slack = self.entry(q, frame), key[-1]
            words = self._eos_words.copy() if entry.final else np.zeros(self.width, dtype=np.uint32)
            for (alt, tokens), delta in zip(entry.chunks, self._costs_of(q, frame)[1]):
                if delta <= slack:
                    words |= self._chunk_words(q, alt, tokens)
            with torch.inference_mode(False):
                got = self._budget_rows.setdefault(key, torch.from_numpy(words.view(np.int32)))
        return got

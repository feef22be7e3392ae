"""GrammarCore: an immutable token index for one regex over one vocabulary, with its masks.

grammars/match/grammar.py's CompiledGrammar is this with its matchers (the cursors sit above it, so
nothing here imports them).

Shared by every request using the same grammar.  Per-state allowed-token bitmasks are
memoised here on first use (one int32 row of ceil(size/32) words per visited state),
so a matcher's fill is one 6 KB copy; a loop state's row is a copy of the vocabulary's plain
tokens plus its few listed ones (grammars/index/unit_index.py).
Under a token budget, masks of (state, tokens left) come from the grammar's BudgetTable
(grammars/index/budget.py), memoised the same way.
The CPU apply skips the bitmask with the state's SparseMask (its allowed or its banned token
ids, when one side is short; grammars/masks/sparse_mask.py): the budget table stores every state's
from compile time, so even a state's first visit needs no row, only its list as int64 (grammars
whose lists would be too big to keep build it from the row on a state's second visit instead).
"""

from __future__ import annotations

import numpy as np
import torch

from grammars.index.budget import ALLOWED, NONE, BudgetTable, build_budget_table
from grammars.schema.free_values import HOLE_REGEX
from grammars.index.plain_tokens import plain_tokens
from grammars.masks.second_ask import SecondAsk
from grammars.masks.sparse_mask import SparseMask, allowed_sparse, changed, sparse_mask
from grammars.index.unit_index import NO_TOKEN, IndexCursor, TokenIndex
from grammars.index.vocabulary import TokenVocabulary

_UNSEEN, _SEEN_ONCE = object(), object()  # states whose SparseMask is not built yet


class GrammarCore:
    """Index + regex + vocabulary, and the masks of its states."""

    __slots__ = ("index", "regex", "vocabulary", "key", "width", "budget", "_masks", "_sparse", "_single",
                 "_count", "_budget_masks", "_budget_sparse", "_kept", "nothing_allowed", "approx_bytes", "_holes",
                 "_held", "_eos")

    def __init__(
        self, index: TokenIndex, regex: str, vocabulary: TokenVocabulary, key: str,
        budget: BudgetTable | None = None,
    ) -> None:
        self.index = index.attach(plain_tokens(vocabulary))
        if budget is None:
            budget = build_budget_table(index, vocabulary.size, vocabulary.eos_token_ids)
        self.budget = budget
        self.regex = regex
        self.vocabulary = vocabulary
        self.key = key
        self.width = (vocabulary.size + 31) // 32
        self._masks: dict[int, torch.Tensor] = {}  # state -> int32 [width]
        self._sparse: dict[int, object] = {}  # state -> SparseMask | None | _SEEN_ONCE
        self.approx_bytes = index.nbytes + _approx_bytes(budget)
        self._single: dict[int, int] = {}  # state -> the only allowed token (not final), or -1
        self._count: dict[int, int] = {}  # state -> number of allowed non-EOS tokens
        self._budget_masks: dict[tuple[int, int], torch.Tensor | None] = {}  # (state, limit) -> mask
        self._budget_sparse = SecondAsk(vocabulary.size)  # (state, limit) -> its SparseMask
        self._kept: dict[tuple, SparseMask] = {}  # (state, rule kind, ids in it) -> _budget_ids' mask
        with torch.inference_mode(False):
            empty = torch.empty(0, dtype=torch.int64)  # [0]
        self.nothing_allowed = SparseMask(True, empty, vocabulary.size)  # after EOS
        self._eos = np.array(sorted(vocabulary.eos_token_ids), dtype=np.int64)  # allowed in final states
        self._holes: list = []  # [HoleTables] once a matcher is asked for, where the regex has free values
        self._held: list = [None, 0]  # [the memos' sizes, their bytes] at held_bytes' last count

    def __setattr__(self, name, value):
        if name in GrammarCore.__slots__ and hasattr(self, name):
            raise AttributeError(f"a compiled grammar is immutable; {name} cannot be reassigned")
        object.__setattr__(self, name, value)

    def held_bytes(self) -> int:
        """approx_bytes plus the per-state memos made since (packed rows, budget masks and their id
        lists, those made ahead by grammars/match/narrowed_ahead.py included)."""
        holes = self._holes[0].held_bytes() if self._holes else 0
        sizes = (len(self._masks), len(self._budget_masks), len(self._budget_sparse), len(self._kept))
        if self._held[0] != sizes:  # recounted once entries were added (as HoleTables.held_bytes)
            rows = len(self._masks) + sum(mask is not None for mask in list(self._budget_masks.values()))
            counted: set[int] = set()  # a list held under several keys, once
            lists = self._budget_sparse.held_bytes(counted)
            for mask in list(self._kept.values()):
                if id(mask) not in counted:
                    counted.add(id(mask))
                    lists += mask.array.nbytes
            self._held[:] = [sizes, 4 * self.width * rows + lists]
        return self.approx_bytes + self._held[1] + holes

    @property
    def has_holes(self) -> bool:
        """Whether the regex has free-value holes (grammars/schema/free_values.py)."""
        return HOLE_REGEX in self.regex

    def hole_tables(self):
        """The grammar's HoleTables, made and prepared once (GrammarCompiler does it in the compile
        thread, beside the request's prefill, and makes their narrowed id lists ahead in the background:
        grammars/match/narrowed_ahead.py)."""
        if not self._holes:
            from grammars.json_value.hole_tables import HoleTables
            from grammars.json_value.json_value_cache import json_value_automaton

            tables = HoleTables(self, json_value_automaton(self.vocabulary))
            tables.prepare()
            self._holes.append(tables)
        return self._holes[0]

    @property
    def initial_state(self) -> int:
        return self.index.get_initial_state()

    def is_final(self, state: int) -> bool:
        return self.index.is_final_state(state)

    def min_tokens(self, state: int) -> int:
        """Fewest tokens from ``state`` to a complete match (EOS not counted)."""
        return self.budget.distance_of(state)

    def budget_mask(self, guide: IndexCursor, limit: int) -> torch.Tensor | None:
        """int32 [width] mask of the tokens after which a complete match is at most ``limit`` tokens
        away, or None when that rules out nothing in ``guide``'s state (memoised per state, limit)."""
        state = guide.get_state()
        key = (state, limit)
        if key in self._budget_masks:
            return self._budget_masks[key]
        rule = self.budget.restriction(state, limit)
        mask = None
        if rule is not None:
            kind, ids = rule
            ids = np.asarray(ids, dtype=np.int64)
            words = np.zeros(self.width, dtype=np.uint32)
            np.bitwise_or.at(words, ids >> 5, np.left_shift(np.uint32(1), (ids & 31).astype(np.uint32)))
            if kind == "drop":
                words = self.state_mask(guide).numpy().view(np.uint32) & ~words
            elif self.index.is_final_state(state):
                for eos_id in self.vocabulary.eos_token_ids:
                    words[eos_id >> 5] |= np.uint32(1 << (eos_id & 31))
            mask = torch.from_numpy(words.view(np.int32))
        self._budget_masks[key] = mask
        return mask

    def budget_sparse(self, guide: IndexCursor, limit: int) -> SparseMask | None:
        """budget_mask(guide, limit) as a SparseMask: on the first ask where made from id lists
        (``_budget_ids``), else from the second ask on (grammars/masks/second_ask.py); None on
        that first ask and where both sides are long. Only where the limit narrows the
        mask (budget_mask is not None)."""
        key = (guide.get_state(), limit)
        return self._budget_sparse.get(key, lambda: self.budget_mask(guide, limit),
                                       lambda: self._budget_ids(guide, limit))

    def _budget_ids(self, guide: IndexCursor, limit: int) -> SparseMask | None:
        """budget_mask's SparseMask made from id lists (no row) where one side is short: the budget
        table's kept ids (EOS where final), or the state's id list less the ruled-out ids."""
        state = guide.get_state()
        rule = self.budget.restriction(state, limit)
        if rule is None:
            return None
        kind, ids = rule
        key = (state, kind, len(ids))  # many limits rule the same tokens in or out: their ids nest
        got = self._kept.get(key)
        if got is None:
            if kind == "drop":  # None until the state's own id list is made: not kept
                got = changed(self.state_sparse_mask(guide), [], ids)
            else:  # the ids merged into the EOS ids where final, in one call (sparse_mask.py _merged)
                eos = self._eos if self.index.is_final_state(state) else None
                got = allowed_sparse(ids, self.vocabulary.size, base=eos)
            if got is not None:
                got = self._kept.setdefault(key, got)  # one made meanwhile by another thread is the one read
        return got

    def state_mask(self, guide: IndexCursor) -> torch.Tensor:
        """int32 [width] bitmask of the tokens allowed in ``guide``'s state (memoised)."""
        mask = self._masks.get(guide.get_state())
        if mask is None:
            mask = self._build(guide)
        return mask

    def state_mask_of(self, state: int) -> torch.Tensor:
        """int32 [width] bitmask of ``state``'s allowed tokens (EOS where final), without a guide;
        memoised with state_mask's rows."""
        mask = self._masks.get(state)
        if mask is None:
            with torch.inference_mode(False):
                words = np.zeros(self.width, dtype=np.uint32)
                self.index.fill_words(state, words)
                if self.index.is_final_state(state):
                    for eos_id in self.vocabulary.eos_token_ids:
                        if eos_id < self.vocabulary.size:
                            words[eos_id >> 5] |= np.uint32(1 << (eos_id & 31))
                mask = self._masks.setdefault(state, torch.from_numpy(words.view(np.int32)))
        return mask

    def state_sparse_mask(self, guide: IndexCursor) -> SparseMask | None:
        """The SparseMask of ``guide``'s state (same tokens as ``state_mask``), or None: mid-sized,
        or (without stored forms) asked for the first time.

        Made on a state's first visit from the budget table's stored ids (an int64 copy, a few us);
        without stored ids, built from the state's row on the second ask (20-35 us), so that a
        state visited once keeps the packed-bitmask apply and never pays for it; nor does CUDA.
        """
        state = guide.get_state()
        sparse = self._sparse.get(state, _UNSEEN)
        if sparse is _UNSEEN or sparse is _SEEN_ONCE:
            stored = self.budget.sparse_ids(state, self.vocabulary.size)
            if stored is not None:
                kind, ids = stored
                sparse = None if kind == NONE else SparseMask.of_sorted(
                    kind == ALLOWED, ids.astype(np.int64), self.vocabulary.size)
            elif sparse is _UNSEEN:
                self._sparse[state] = _SEEN_ONCE
                return None
            else:
                sparse = sparse_mask(self.state_mask(guide), self.vocabulary.size)
            self._sparse[state] = sparse
        return sparse

    def single_token(self, guide: IndexCursor) -> int:
        """The only allowed token in ``guide``'s state if exactly one (EOS counts), else -1."""
        single = self._single.get(guide.get_state())
        if single is None:
            self._summarise(guide)
            single = self._single[guide.get_state()]
        return single

    def allowed_count(self, guide: IndexCursor) -> int:
        """Number of tokens allowed in ``guide``'s state, EOS not counted."""
        count = self._count.get(guide.get_state())
        if count is None:
            self._summarise(guide)
            count = self._count[guide.get_state()]
        return count

    def _summarise(self, guide: IndexCursor) -> None:
        """Memoise the state's count and single token: from the budget table's stored count and
        sparse ids when it has them (no mask written), else from the state's row (``_build``)."""
        state = guide.get_state()
        count = self.budget.state_count(state)
        stored = self.budget.sparse_ids(state, self.vocabulary.size) if count is not None else None
        if stored is None:
            self._build(guide)
            return
        final = self.index.is_final_state(state)
        kind, ids = stored
        if count == 1 and not final and (kind != ALLOWED or len(ids) != 1):  # a token past the logits
            self._build(guide)
            return
        self._count[state] = count
        self._single[state] = int(ids[0]) if count == 1 and not final else NO_TOKEN

    def _build(self, guide: IndexCursor) -> torch.Tensor:
        """Memoise the state's mask (once per state)."""
        state, vocab = guide.get_state(), self.vocabulary
        mask = torch.zeros(self.width, dtype=torch.int32)  # [width]
        words = mask.numpy().view(np.uint32)  # shares memory with mask
        self.index.fill_words(state, words)
        count = int(np.bitwise_count(words).sum())
        final = self.index.is_final_state(state)
        if final:
            for eos_id in vocab.eos_token_ids:
                words[eos_id >> 5] |= np.uint32(1 << (eos_id & 31))
        single = NO_TOKEN
        if count == 1 and not final:
            word = int(np.flatnonzero(words)[0])
            single = word * 32 + (int(words[word]).bit_length() - 1)
        self._count[state] = count
        self._single[state] = single
        self._masks[state] = mask
        return mask


def _approx_bytes(budget: BudgetTable) -> int:
    """Memory the grammar's table holds: its arrays and the int64 copies of the stored sparse ids
    (made per state on first visit, counted in full; the index's arrays and the rows memoised come
    on top)."""
    arrays = [budget.keys, budget.distance, budget.far, budget.mode, budget.odd_off, budget.odd_tok,
              budget.odd_dist]
    if budget.count is not None:
        arrays.append(budget.count)
    if budget.sparse is not None:
        arrays.extend(budget.sparse[1:])
    ids64 = 8 * len(budget.sparse[3]) if budget.sparse is not None else 0
    return sum(a.nbytes for a in arrays) + ids64

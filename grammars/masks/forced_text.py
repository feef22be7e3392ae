"""Forced text: the run of text a constraint allows alone, in the tokens the model's tokenizer writes.

A grammar often allows several tokens where only one text can follow. After `{"` in an object whose
next key is required, `location": ` is the only continuation, yet `l`, `lo`, `loc`, `location` ...
are all allowed, so no single token is forced and jump-forward by singletons (`forced()`) stops.
Here the next bytes are walked one at a time: a byte is forced when every allowed token starts with
it and EOS is not allowed; the walk advances by that byte's own one-byte token. The forced text is
then encoded by the tokenizer (its own tokens for that text, not the one-byte walk), each token
checked against the constraint, and all but the last returned: in the tokenizer's encoding of the
whole output the last one may merge with what the model writes next, so it is left to the model
(under the mask).

The joint before the run is split in context too (`joined()`): the token the model has just sampled
and the forced text after it are encoded together, and where the tokenizer merges them, that split
replaces the sampled token (a string's closing `"` and the forced `,"unit":"` are `","` `unit`; even
one forced byte joins: `":` then `"` is `":"`). The text is the same; only its tokens change, before
the model has seen any of them. Looking one token back is the approximation: a merge that would
reach further back is not redone.

Exact: a byte counts as forced only if no allowed token begins otherwise, so the text returned is
text the masked model would have had to write; only its split into tokens is the tokenizer's.
Reads a constraint (engine/constraint.py) by sparse_mask() or fill(), advance() and rollback().
"""

from __future__ import annotations

import numpy as np

from grammars.masks.bitmask import allocate_token_bitmask
from grammars.masks.sparse_mask import sparse_mask as sparse_of_row

LIMIT = 96  # bytes walked at most per call: a key, a delimiter, a name


class ForcedText:
    def __init__(self, vocabulary, tokenizer, limit: int = LIMIT):
        self.tokenizer = tokenizer
        self.limit = limit
        self.vocabulary = vocabulary
        size = vocabulary.size
        self.first = np.full(size, -1, dtype=np.int16)  # [V] first byte of each token's text; -1: none
        self.single: dict[int, int] = {}  # byte -> the token whose text is that byte alone
        for token, piece in vocabulary.token_bytes.items():
            if piece and token < size:
                self.first[token] = piece[0]
                if len(piece) == 1:
                    self.single.setdefault(piece[0], token)
        self.first[list(vocabulary.eos_token_ids)] = -1
        self._row = allocate_token_bitmask(1, size)[0]  # [W] scratch for constraints without a sparse mask

    def __call__(self, constraint, budget: int | None = None) -> list[int]:
        """Tokens to append now (possibly none); the constraint is left as it was. With ``budget``
        (the tokens the request may still generate), the run stops before a token after which the
        output could no longer close within it: the tokenizer's split may be longer than the
        shortest, and near the end of the budget the masked model then picks the shorter one."""
        text = self._walk(constraint)
        return self._tokens(constraint, text, budget) if len(text) > 1 else []

    def joined(self, constraint, sampled: int, budget: int | None = None) -> list[int]:
        """What to append for the token the model just sampled (not yet given to ``constraint``):
        its text and the text forced after it, in the tokens the tokenizer writes for both together
        (less the last, as in ``__call__``, unless that last token holds the sampled token's text);
        [sampled] where nothing is forced after it. Where that split does not cover the sampled
        token's text (a split the constraint refuses), the sampled token stays and the forced run
        after it is split on its own. The constraint is left as it was."""
        constraint.advance(sampled)  # a refused token raises here, as appending it would
        try:
            text = self._walk(constraint)
        finally:
            constraint.rollback(1)
        head = self.vocabulary.token_bytes.get(sampled, b"")
        if not text or not head:
            return [sampled]
        encoded = self._encode(head + text)
        together = self._take(constraint, *encoded, budget, keep_last=False)
        if len(self._spell(together)) < len(head):  # `":` then `"`: the tokenizer writes one token,
            together = self._take(constraint, *encoded, budget, keep_last=True)  # `":"`: take it whole
        if len(self._spell(together)) >= len(head):
            return together
        constraint.advance(sampled)
        try:
            after = self._tokens(constraint, text, budget - 1 if budget is not None else None)
        finally:
            constraint.rollback(1)
        return [sampled, *after]

    def _walk(self, constraint) -> bytes:
        """The bytes the constraint allows alone from here, walked one byte token at a time (at most
        ``limit``); the constraint is left as it was."""
        text, steps = bytearray(), 0
        try:
            while len(text) < self.limit:
                allowed = self._allowed(constraint)
                byte = self._forced_byte(allowed)
                token = self.single.get(byte)
                if token is None or not _contains(allowed, token):  # refuses the one-byte split: stop here
                    break
                constraint.advance(token)
                steps += 1
                text.append(byte)
        finally:
            constraint.rollback(steps)
        return bytes(text)

    def _spell(self, tokens: list[int]) -> bytes:
        return b"".join(self.vocabulary.token_bytes.get(token, b"") for token in tokens)

    def _allowed(self, constraint) -> np.ndarray | None:
        """The ids the constraint allows next (int64, ascending) when they are few, else None."""
        sparse = constraint.sparse_mask(None)
        if sparse is None:
            self._row.zero_()
            constraint.fill(self._row, None)
            sparse = sparse_of_row(self._row, self.vocabulary.size)
        return sparse.array if sparse is not None and sparse.allowed and len(sparse.array) else None

    def _allows(self, constraint, token: int) -> bool:
        """Whether the constraint allows ``token`` next (by its mask without a budget; inside a
        string most tokens are, and the short side of the mask is the banned one)."""
        sparse = constraint.sparse_mask(None)
        if sparse is not None:
            return _contains(sparse.array, token) == sparse.allowed
        self._row.zero_()
        constraint.fill(self._row, None)
        return bool(int(self._row[token >> 5]) >> (token & 31) & 1)

    def _forced_byte(self, allowed: np.ndarray | None) -> int | None:
        if allowed is None:
            return None
        firsts = self.first[allowed]
        byte = int(firsts[0])
        if byte < 0 or not (firsts == byte).all():  # EOS or a special token allowed, or two first bytes
            return None
        return byte

    def _tokens(self, constraint, text: bytes, budget: int | None, keep_last: bool = False) -> list[int]:
        """The tokenizer's tokens for ``text`` that the constraint accepts in turn (and that leave
        the output room to close within ``budget``), less the last (unless ``keep_last``)."""
        return self._take(constraint, *self._encode(text), budget, keep_last)

    def _encode(self, text: bytes) -> tuple[bytes, list[int]]:
        """``text`` cut to whole characters (a walk may end inside one: that one is left to the
        model) and the tokenizer's ids for it."""
        while text:
            try:
                return text, self.tokenizer.encode(text.decode("utf-8"), add_special_tokens=False)
            except UnicodeDecodeError:
                text = text[:-1]
        return b"", []

    def _take(self, constraint, text: bytes, ids: list[int], budget: int | None, keep_last: bool) -> list[int]:
        """``_tokens`` for ``text`` already encoded as ``ids``."""
        taken, spelled = [], b""
        try:
            for token in ids:
                spelled += self.vocabulary.token_bytes.get(token, b"\0")
                if not text.startswith(spelled) or not self._allows(constraint, token):
                    break  # e.g. a tokenizer that adds a leading space, or a split the automaton refuses
                constraint.advance(token)
                taken.append(token)
                if budget is not None and constraint.min_tokens() > budget - len(taken):
                    taken.pop()  # this split no longer fits the budget: stop before it
                    constraint.rollback(1)
                    return taken
        finally:
            constraint.rollback(len(taken))
        return taken[:-1] if not keep_last and spelled == text and len(taken) == len(ids) else taken


def _contains(ids: np.ndarray | None, token: int) -> bool:
    """Whether ascending ``ids`` hold ``token``."""
    if ids is None:
        return False
    at = int(np.searchsorted(ids, token))
    return at < len(ids) and int(ids[at]) == token

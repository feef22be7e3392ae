"""Free text that may end in a trigger (a tool call's opening delimiter), but never runs past it.

The state is how much of the trigger the text ends with (0..len-1, as in KMP). A token is banned
in a state when the trigger would complete strictly inside it: then the text after the trigger
would escape the grammar that the trigger arms. A token that completes the trigger exactly at its
end arms the grammar. Masks are built once per (vocabulary, trigger) and shared, and so are
their sparse forms (the few banned token ids; grammars/masks/sparse_mask.py).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from grammars.masks.sparse_mask import SparseMask, sparse_mask
from grammars.index.vocabulary import TokenVocabulary

_CACHE: dict[tuple[str, bytes, tuple[int, ...]], "TriggerMasks"] = {}
_LOCK = threading.Lock()


class TriggerMasks:
    def __init__(self, vocabulary: TokenVocabulary, trigger: bytes, trigger_ids: tuple[int, ...]):
        self.vocabulary = vocabulary
        self.trigger = trigger
        self.trigger_ids = frozenset(trigger_ids)  # tokens that are the whole trigger by themselves
        width = (vocabulary.size + 31) // 32
        self.masks = [self._mask(vocabulary, trigger, k, width) for k in range(len(trigger))]
        self._arming: dict[int, tuple[int, ...]] = {}
        self.sparse: list[SparseMask | None] = [sparse_mask(m, vocabulary.size) for m in self.masks]

    @staticmethod
    def _mask(vocabulary: TokenVocabulary, trigger: bytes, k: int, width: int) -> torch.Tensor:
        """int32 [width]: every token allowed except those the trigger would complete inside."""
        words = np.full(width, 0xFFFFFFFF, dtype=np.uint32)  # [width]
        extra = (width * 32) - vocabulary.size
        if extra:
            words[-1] &= np.uint32((1 << (32 - extra)) - 1)
        prefix = trigger[:k]
        for tid, piece in vocabulary.token_bytes.items():
            text = prefix + piece
            at = text.find(trigger)
            if 0 <= at and at + len(trigger) < len(text):
                words[tid >> 5] &= ~np.uint32(1 << (tid & 31))
        return torch.from_numpy(words.view(np.int32))

    def arming(self, state: int) -> tuple[int, ...]:
        """The tokens that complete the trigger from ``state`` (each at its very end); memoised."""
        tokens = self._arming.get(state)
        if tokens is None:
            prefix = self.trigger[:state]
            tokens = tuple(sorted(self.trigger_ids | {
                tid for tid, piece in self.vocabulary.token_bytes.items()
                if (prefix + piece).endswith(self.trigger) and (prefix + piece).find(self.trigger)
                == len(prefix + piece) - len(self.trigger)}))
            self._arming[state] = tokens
        return tokens

    def step(self, state: int, token_id: int) -> tuple[int, bool]:
        """(next state, armed) after token_id; special tokens other than the trigger reset to 0."""
        if token_id in self.trigger_ids:
            return 0, True
        piece = self.vocabulary.token_bytes.get(token_id)
        if piece is None:
            return 0, False
        text = self.trigger[:state] + piece
        if text.endswith(self.trigger):
            return 0, True
        for n in range(min(len(self.trigger) - 1, len(text)), 0, -1):
            if text.endswith(self.trigger[:n]):
                return n, False
        return 0, False


def trigger_masks(vocabulary: TokenVocabulary, trigger: str, trigger_ids: tuple[int, ...]) -> TriggerMasks:
    key = (vocabulary.fingerprint, trigger.encode(), tuple(trigger_ids))
    with _LOCK:
        masks = _CACHE.get(key)
        if masks is None:
            masks = _CACHE[key] = TriggerMasks(vocabulary, key[1], key[2])
        return masks

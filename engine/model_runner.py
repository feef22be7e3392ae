"""Forward passes: prefill a newcomer's prompt, then decode one token for every running row."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from engine.sequence import Sequence


def cache_kwarg(model: torch.nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x; use whichever the model takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.forward_passes = 0
        self._cache_kwarg = cache_kwarg(model)

    @torch.inference_mode()
    def _forward(self, seq: Sequence) -> torch.Tensor:
        """Runs seq.next_input through the model on seq's cache; returns logits [V] of the last."""
        if seq.cache is None:
            seq.cache = DynamicCache()
        ids = torch.tensor([seq.next_input], device=self.device)  # [1, T]
        kwargs = {self._cache_kwarg: seq.cache}
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **kwargs)
        seq.next_input = []
        self.forward_passes += 1
        return out.logits[0, -1]  # [V]

    def prefill(self, seq: Sequence) -> torch.Tensor:
        """Returns logits [1, V] for the token after seq's prompt."""
        return self._forward(seq).unsqueeze(0)

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One step for every row; returns logits [B, V].

        Rows keep separate caches for now; one padded forward over all rows replaces this loop
        when continuous batching lands."""
        return torch.stack([self._forward(seq) for seq in seqs])

    def release(self, seq: Sequence) -> None:
        seq.cache = None

"""Forward passes: a chunk of one newcomer's prompt, or one token for every running row at once."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from engine.batch_cache import BatchCache


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
    def prefill(self, cache: DynamicCache, token_ids: list[int]) -> torch.Tensor:
        """Runs token_ids [T] on top of a batch-size-1 cache (no padding; positions continue from its
        length); returns logits [1, V] of the last token."""
        ids = torch.tensor([token_ids], device=self.device)  # [1, T]
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        self.forward_passes += 1
        return out.logits[:, -1]  # [1, V]

    @torch.inference_mode()
    def decode(self, batch: BatchCache, token_ids: list[int]) -> torch.Tensor:
        """Feeds one token per row (token_ids [B], row order); returns logits [B, V]."""
        ids = torch.tensor(token_ids, device=self.device).unsqueeze(1)  # [B, 1]
        inputs = batch.step_inputs()
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1,
                         **{self._cache_kwarg: batch.cache}, **inputs)
        batch.advance(inputs["attention_mask"])
        self.forward_passes += 1
        return out.logits[:, -1]  # [B, V]

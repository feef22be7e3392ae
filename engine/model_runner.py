"""Forward passes over a list of row slots, each slot feeding its own number of new tokens."""

from __future__ import annotations

import inspect

import torch

from engine.host_logits import HostLogits
from engine.slot_attention import use_slot_attention
from engine.slot_cache import SlotCache


def cache_kwarg(model: torch.nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x; use whichever the model takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = device
        self.forward_passes = 0
        self._cache_kwarg = cache_kwarg(model)
        use_slot_attention(model)
        self.host = HostLogits.install(model) if device.type == "cpu" else None  # logits the step reads without torch

    @torch.inference_mode()
    def forward(self, slots: SlotCache, rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        """Feeds tokens[b] to slot rows[b] (prompt chunks, one sampled token, or a sampled token and
        the run the grammar forced after it; [] for a slot that does not step), all in one packed
        pass. Returns logits [B, V] of each slot's last new token (rows that fed nothing get
        meaningless logits). On CPU these are the engine's own rows (engine/host_logits.py), which
        the next pass overwrites: read within the step."""
        inputs = slots.begin(rows, tokens)
        host = self.host
        if host is not None:
            host.arm(True)
        try:
            out = self.model(**inputs, use_cache=True, **{self._cache_kwarg: slots})
        except BaseException:
            slots.end(completed=False)
            raise
        finally:
            if host is not None:
                host.arm(False)
        slots.end()
        self.forward_passes += 1
        return out.logits[0] if host is None else host.rows(out.logits)  # [B, V]

"""KVSegment: the key/value states of a run of tokens, detached from any batch.

A segment is the payload the prefix cache (`engine.radix_cache`) stores on each edge. It holds,
for every decoder layer, the keys and values of `n` consecutive tokens of one sequence, in one
tensor so that slicing and concatenation are one op each:

    data: [num_layers, 2, kv_heads, n_tokens, head_dim]      (index 0 = keys, 1 = values)

Keys are stored after the rotary embedding was applied, exactly as transformers caches them, so a
segment is only valid at the absolute positions it was computed at. The radix tree guarantees
that: a segment on an edge at depth d always covers positions [d, d + n).

The engine cuts segments out of its SlotCache (engine/slot_cache.py), which keeps every layer's
tokens, sliding-window layers too (the attention mask holds the window), so every model's prefix
can be cached. `from_cache` / `to_cache` convert to and from transformers' DynamicCache of
full-attention `DynamicLayer`s (for tests and tools: a sliding layer cache has dropped tokens, so
`from_cache` refuses it). Tensors stay on the device and dtype they came from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


# Set on rank 0 of a tensor-parallel server (engine/tensor_parallel.py): told of each segment
# sliced or joined from others, by their `tp_id`s, so that the other ranks derive theirs alike.
on_derived: Callable[..., None] | None = None


@dataclass(frozen=True, eq=False)
class KVSegment:
    """Per-token KV of a run of tokens of one sequence; immutable once built."""

    data: torch.Tensor  # [num_layers, 2, kv_heads, n_tokens, head_dim]

    def __post_init__(self) -> None:
        if self.data.ndim != 5 or self.data.shape[1] != 2:
            raise ValueError(
                f"KVSegment.data must have shape [num_layers, 2, kv_heads, n_tokens, head_dim], got "
                f"{tuple(self.data.shape)}; build segments with KVSegment.from_cache or KVSegment.concat"
            )

    # ---- sizes ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.data.shape[3]

    @property
    def num_tokens(self) -> int:
        return self.data.shape[3]

    @property
    def nbytes(self) -> int:
        """Bytes held by this segment (its data is always a compact tensor of its own)."""
        return self.data.numel() * self.data.element_size()

    @property
    def bytes_per_token(self) -> int:
        layers, _, heads, _, head_dim = self.data.shape
        return layers * 2 * heads * head_dim * self.data.element_size()

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    # ---- slicing and joining ----------------------------------------------------------------

    def slice(self, start: int, end: int) -> KVSegment:
        """Tokens [start, end) of this segment, as a compact copy that owns its memory.

        A copy rather than a view, so that the bytes the prefix cache accounts for are the bytes
        actually held: a view would keep the whole parent tensor alive after the rest is evicted.
        """
        n = len(self)
        if not 0 <= start <= end <= n:
            raise IndexError(f"KVSegment.slice({start}, {end}) is out of range for a segment of {n} tokens")
        out = KVSegment(self.data[:, :, :, start:end, :].clone())  # [L, 2, H, end-start, D]
        if on_derived is not None:
            on_derived(out, "slice", self.tp_id, start, end)
        return out

    @staticmethod
    def concat(segments: Sequence[KVSegment]) -> KVSegment:
        """Join segments along the token axis, in order."""
        if not segments:
            raise ValueError("KVSegment.concat needs at least one segment; a zero-length match has no KV")
        if len(segments) == 1:
            return segments[0]
        _check_same_model(segments)
        out = KVSegment(torch.cat([s.data for s in segments], dim=3))  # [L, 2, H, sum n, D]
        if on_derived is not None:
            on_derived(out, "concat", [s.tp_id for s in segments])
        return out

    # ---- to and from transformers caches ----------------------------------------------------

    @classmethod
    def from_cache(cls, cache: Cache, row: int, start: int, end: int) -> KVSegment:
        """Copy the KV of cache positions [start, end) of batch row `row` out of a DynamicCache.

        `start`/`end` index the cache's sequence axis. The result is detached and owns its memory,
        so the cache can be freed or grow afterwards.
        """
        layers = getattr(cache, "layers", None)
        if not layers:
            raise TypeError(
                f"KVSegment.from_cache needs a transformers 5.x DynamicCache with filled layers, got "
                f"{type(cache).__name__}; run a forward pass with use_cache=True first"
            )
        keys, values = [], []
        for i, layer in enumerate(layers):
            if type(layer) is not DynamicLayer:  # sliding, quantized, linear-attention layers subclass it
                raise TypeError(
                    f"layer {i} of the cache is a {type(layer).__name__}; only full-attention DynamicLayer "
                    f"caches can be cut into prefix segments. Disable the prefix cache for this model"
                )
            if not layer.is_initialized or layer.keys is None:
                raise ValueError(f"layer {i} of the cache is empty; run a forward pass with use_cache=True first")
            k, v = layer.keys, layer.values  # [B, H, S, D] each
            if not 0 <= row < k.shape[0]:
                raise IndexError(f"row {row} is out of range for a cache of batch size {k.shape[0]}")
            if not 0 <= start <= end <= k.shape[2]:
                raise IndexError(f"positions [{start}, {end}) are out of range for a cache of {k.shape[2]} tokens")
            keys.append(k[row, :, start:end, :])  # [H, n, D]
            values.append(v[row, :, start:end, :])  # [H, n, D]
        shapes = {t.shape for t in keys}
        if len(shapes) != 1:
            raise ValueError(
                f"cache layers have different KV shapes {sorted(map(tuple, shapes))}; models with per-layer "
                f"head counts are not supported by the prefix cache. Disable it for this model"
            )
        data = torch.stack([torch.stack(keys), torch.stack(values)], dim=1)  # [L, 2, H, n, D], a fresh copy
        return cls(data.detach())

    def to_cache(self) -> DynamicCache:
        """A fresh batch-size-1 DynamicCache holding this segment, ready for
        `model(input_ids=rest, cache=cache)` where `rest` continues at position len(self).

        The cache gets its own copies of the tensors (DynamicLayer.update concatenates), so the
        model writing to it never touches the segment stored in the prefix cache.
        """
        per_layer = [(layer[0].unsqueeze(0), layer[1].unsqueeze(0)) for layer in self.data]  # [1, H, n, D] each
        return DynamicCache(per_layer)


def _check_same_model(segments: Sequence[KVSegment]) -> None:
    """Segments can be joined only if layers, heads, head_dim, dtype and device all agree."""
    first = segments[0].data
    for seg in segments[1:]:
        d = seg.data
        same_shape = d.shape[:3] == first.shape[:3] and d.shape[4] == first.shape[4]
        if not same_shape or d.dtype != first.dtype or d.device != first.device:
            raise ValueError(
                f"cannot join KV segments of different models: {tuple(first.shape)} {first.dtype} {first.device} "
                f"vs {tuple(d.shape)} {d.dtype} {d.device}; keep one prefix cache per loaded model"
            )

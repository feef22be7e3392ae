"""BatchCache: the left-padded KV cache of the running batch, which rows join and leave.

Every running row's KV lives in one transformers `DynamicCache` of batch size B. Rows have
different lengths, so each row's tokens sit right-aligned and the columns before them are padding:

    mask:      [B, S]  1 = a real token, 0 = padding (always a run of zeros, then a run of ones)
    positions: [B]     real tokens of each row = the position id of its next token

A decode step feeds one token per row with `attention_mask = [mask | 1]` and
`position_ids = positions`, which is how transformers itself decodes a left-padded batch, so it
works with any decoder-only model whose cache is made of full-attention `DynamicLayer`s.
A row joins by padding the shorter side on the left and concatenating on the batch axis; rows
leave by `index_select`, after which columns that are padding in every remaining row are trimmed.

Only the engine thread touches a BatchCache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from engine.kv_segment import KVSegment


class BatchCache:
    def __init__(self, device: torch.device):
        self.device = device
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=device)  # [B, S]
        self.positions = torch.zeros(0, dtype=torch.long, device=device)  # [B]

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def _kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.cache.layers]  # [B, H, S, D] each

    def _set_kv(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (k, v) in zip(self.cache.layers, kv):
            layer.keys, layer.values = k, v

    # ---- membership -------------------------------------------------------------------------

    def join(self, row_cache: DynamicCache) -> int:
        """Append a batch-size-1 cache of n real tokens (no padding) as the last row; returns its index."""
        n = row_cache.get_seq_length()
        if n == 0:
            raise ValueError("a row joins the batch only after its prompt was prefilled; its cache is empty")
        if self.cache is None:
            self.cache = row_cache
            self.mask = torch.ones(1, n, dtype=torch.long, device=self.device)  # [1, n]
            self.positions = torch.tensor([n], dtype=torch.long, device=self.device)  # [1]
            return 0
        width = max(self.width, n)
        grow, pad = width - self.width, width - n  # new padding on the left of the batch / of the row
        joined = []
        for (k, v), layer in zip(self._kv(), row_cache.layers):
            rk, rv = layer.keys, layer.values  # [1, H, n, D]
            if grow:
                k, v = F.pad(k, (0, 0, grow, 0)), F.pad(v, (0, 0, grow, 0))  # [B, H, width, D]
            if pad:
                rk, rv = F.pad(rk, (0, 0, pad, 0)), F.pad(rv, (0, 0, pad, 0))  # [1, H, width, D]
            joined.append((torch.cat([k, rk]), torch.cat([v, rv])))  # [B+1, H, width, D]
        self._set_kv(joined)
        row_mask = F.pad(torch.ones(1, n, dtype=torch.long, device=self.device), (pad, 0))  # [1, width]
        self.mask = torch.cat([F.pad(self.mask, (grow, 0)), row_mask])  # [B+1, width]
        self.positions = torch.cat([self.positions, self.positions.new_tensor([n])])  # [B+1]
        return self.batch_size - 1

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in this order); drop the rest and trim all-padding leading columns."""
        if not rows:
            self.__init__(self.device)
            return
        if rows == list(range(self.batch_size)):
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)  # [B']
        mask = self.mask.index_select(0, index)  # [B', S]
        start = int(self.width - int(self.positions.index_select(0, index).max()))
        self._set_kv([(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
                      for k, v in self._kv()])  # [B', H, S - start, D]
        self.mask = mask[:, start:]
        self.positions = self.positions.index_select(0, index)

    # ---- decoding ---------------------------------------------------------------------------

    def step_inputs(self) -> dict:
        """attention_mask [B, S+1] and position_ids [B, 1] for feeding one more token per row."""
        ones = torch.ones(self.batch_size, 1, dtype=torch.long, device=self.device)
        return {"attention_mask": torch.cat([self.mask, ones], dim=1), "position_ids": self.positions.unsqueeze(1)}

    def advance(self, attention_mask: torch.Tensor) -> None:
        """After the forward pass of step_inputs(): every row holds one more real token."""
        self.mask = attention_mask  # [B, S+1]
        self.positions += 1

    # ---- reading ----------------------------------------------------------------------------

    def row_length(self, row: int) -> int:
        return int(self.positions[row])

    def segment(self, row: int, start: int, end: int) -> KVSegment:
        """KV of tokens [start, end) of `row` (token positions, not columns)."""
        pad = self.width - self.row_length(row)
        return KVSegment.from_cache(self.cache, row, pad + start, pad + end)

    def nbytes(self) -> int:
        if self.cache is None:
            return 0
        return sum(k.numel() * k.element_size() * 2 for k, _ in self._kv())

    def check_integrity(self) -> None:
        b, s = self.mask.shape
        assert self.positions.shape == (b,), f"positions {tuple(self.positions.shape)} for a batch of {b}"
        if b == 0:
            assert self.cache is None, "an empty batch holds no cache"
            return
        assert torch.equal(self.mask.sum(1), self.positions), "positions != real tokens per row"
        assert int(self.positions.max()) == s, "a leading column is padding in every row; it should be trimmed"
        padding = s - self.positions  # [B]
        columns = torch.arange(s, device=self.device).unsqueeze(0)  # [1, S]
        assert torch.equal(self.mask, (columns >= padding.unsqueeze(1)).long()), "mask is not left padding"
        for i, (k, v) in enumerate(self._kv()):
            assert k.shape[0] == b and k.shape[2] == s and v.shape == k.shape, (
                f"layer {i} holds KV {tuple(k.shape)}, the mask says [{b}, *, {s}, *]")

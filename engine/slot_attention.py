"""Attention over the slot cache for a packed pass: every row's new tokens side by side in one
sequence, so that prompt chunks, forced runs and single decode tokens share one forward pass
without padding.

The model sees input_ids [1, N] (N = all rows' new tokens) and position_ids [1, N]; its linear
layers run once over the N tokens. The slot cache writes each token's KV where it belongs and
hands back the whole layer; this module's attention then splits the queries by row:

- the decode group: rows feeding one token each, over a run of consecutive slots [lo, lo + M)
  (the running rows), one batched attention call over the view keys[lo:lo + M, :, :W]; slots in
  the run that do not feed a single token here (free, held, extending, prefilling) are holes
  whose zero query sees column 0 only and whose output is dropped;
- every other row (a prompt chunk, a sampled token plus its forced run, a lone token outside the
  run) alone over its own slot's view, causal within its new tokens.

Masks come from each row's real length and the layer's sliding window (if any), so a row never
sees another's KV, padding or columns past its length. No KV is copied: each group reads views.
A fresh prompt chunk with no window in the way runs as plain causal attention (flash kernels).

Registered with transformers as the attention implementation `maskd_slots`, with sdpa's mask
builder: a forward outside a packed pass (no plan on this thread) is exactly sdpa.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "maskd_slots"
_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)  # enable_gqa
_local = threading.local()  # the plan of the pass this thread is running, if any


@dataclass
class Run:
    """A row attending alone: packed tokens [a, b) of slot `slot`, the first at position `start`."""

    a: int
    b: int
    slot: int
    start: int


@dataclass
class Plan:
    """Where a pass's queries go (built by SlotCache.begin, on the host, then one copy)."""

    windows: tuple[int | None, ...]  # each layer's sliding window (None: full attention)
    device: torch.device
    lo: int = 0  # the decode group: slots [lo, lo + M)
    M: int = 0
    width: int = 0  # columns the decode group reads
    dec_tokens: torch.Tensor | None = None  # [r] packed index of each single token in the group
    dec_rows: torch.Tensor | None = None  # [r] its row in the group
    dec_pos: torch.Tensor | None = None  # [M] each row's position (-1: a hole)
    runs: list[Run] = field(default_factory=list)
    _masks: dict = field(default_factory=dict)

    def decode_mask(self, window: int | None) -> torch.Tensor:
        """[M, 1, 1, W]: row r sees columns <= its position (and within the window); holes column 0.
        The same for each of a row's query heads (they are its query positions, see slot_attention)."""
        key = ("decode", window)
        if key not in self._masks:
            columns = torch.arange(self.width, device=self.device)  # [W]
            p = self.dec_pos.unsqueeze(1)  # [M, 1]
            see = columns <= p
            if window is not None:
                see = see & (columns > p - window)
            self._masks[key] = torch.where(p >= 0, see, columns == 0)[:, None, None, :]
        return self._masks[key]

    def run_mask(self, run: Run, window: int | None) -> torch.Tensor | None:
        """[1, 1, t, W] causal over the row's new tokens (None: plain causal attention will do)."""
        t = run.b - run.a
        if run.start == 0 and (window is None or window >= t):
            return None
        key = (run.a, window)
        if key not in self._masks:
            width = run.start + t
            columns = torch.arange(width, device=self.device)  # [W]
            p = (run.start + torch.arange(t, device=self.device)).unsqueeze(1)  # [t, 1]
            see = columns <= p
            if window is not None:
                see = see & (columns > p - window)
            self._masks[key] = see[None, None]
        return self._masks[key]


def active(plan: Plan | None) -> None:
    """Sets (or clears) the plan this thread's next forward pass attends by."""
    _local.plan = plan


def _sdpa(q, k, v, mask, scale, causal=False) -> torch.Tensor:
    if q.shape[1] != k.shape[1]:
        if _GQA:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal,
                                                  enable_gqa=True)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal)


def slot_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [1, H, N, D]; key, value: the layer's whole slot tensors [S, Hkv, C, D]. Returns
    ([1, N, H, D], None) as transformers' attention functions do."""
    plan: Plan | None = getattr(_local, "plan", None)
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("attention logit softcapping is not supported by maskd's slot attention")
    window = plan.windows[module.layer_idx]
    q = query[0].transpose(0, 1)  # [N, H, D]
    out = torch.empty_like(q)  # [N, H, D]
    if plan.dec_tokens is not None:
        # The query heads that share a KV head become its query positions ([M, Hkv, G, D]), as
        # transformers' sdpa does for one-token queries: no copy of K/V per query head.
        kv_heads = key.shape[1]
        rows = q.new_zeros(plan.M, kv_heads, q.shape[1] // kv_heads, q.shape[2])  # [M, Hkv, G, D]
        rows[plan.dec_rows] = q[plan.dec_tokens].view(-1, kv_heads, q.shape[1] // kv_heads, q.shape[2])
        span = slice(plan.lo, plan.lo + plan.M)
        o = F.scaled_dot_product_attention(rows, key[span, :, :plan.width], value[span, :, :plan.width],
                                           attn_mask=plan.decode_mask(window), scale=scaling)  # [M, Hkv, G, D]
        out[plan.dec_tokens] = o[plan.dec_rows].reshape(-1, q.shape[1], q.shape[2])
    for run in plan.runs:
        width = run.start + run.b - run.a
        mask = plan.run_mask(run, window)
        o = _sdpa(query[:, :, run.a:run.b], key[run.slot:run.slot + 1, :, :width],
                  value[run.slot:run.slot + 1, :, :width], mask, scaling, causal=mask is None)  # [1, H, t, D]
        out[run.a:run.b] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


def use_slot_attention(model: torch.nn.Module) -> None:
    """Makes `maskd_slots` the model's attention (outside packed passes it is sdpa)."""
    AttentionInterface.register(ATTENTION, slot_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)

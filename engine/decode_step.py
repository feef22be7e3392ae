"""DecodeStep: the pass where every row feeds exactly one token, written lean over the model's own
modules and the SlotCache tensors, so that it can be compiled (torch.compile) a group of layers at a
time: every group of a model runs the same compiled code over its own layers' weights, so no Python
runs inside a group, and the compile is paid for one group, not for the whole model. Groups of up
to GROUP layers: each call of a compiled region costs Python (its guards, gathering its inputs),
which one layer per call paid 30 times a SmolLM2 step; a whole model per call compiles for minutes.

The packed pass (engine/slot_attention.py, through transformers' forward) serves every pass; this
one only the decode passes, which are most of a generation's passes. It reads the transformers
model's embedding, norms, projections, MLPs and rotary tables (so quantized layers and every
family's details come with them) and does the rest itself: the layer's residual wiring, rotary
embedding, the KV write into each row's slot, and attention over the first `width` columns of the
rows' slots, masked by each row's position (and the layer's sliding window).

Families whose layers it knows: Llama, Mistral, Qwen2, Qwen3 (q/k norms) and Gemma 3 text (the
norms around attention and MLP, a rotary table per layer type). Any other model, or one with
attention logit soft-capping, gets None from `of` and runs every pass packed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
GROUP = 6  # the most layers per compiled call


def group_size(kinds: tuple, most: int = GROUP) -> int:
    """The most layers per group, at most `most`, that cut `kinds` (each layer's attention kind)
    into groups all alike, so that one compiled region serves them all."""
    n = len(kinds)
    for size in range(min(most, n), 0, -1):
        if n % size == 0 and all(kinds[i:i + size] == kinds[:size] for i in range(0, n, size)):
            return size
    return 1


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecodeStep(torch.nn.Module):
    """forward(ids [B], positions [B], slots [B], keys, values, width) -> hidden [B, H] after the
    final norm (the output head is the caller's). keys[l], values[l]: [S, Hkv, C, D], written in
    place at (slots[b], :, positions[b]). Rows must be distinct slots, except that a padding row may
    repeat another row exactly (it writes the same values to the same place)."""

    def __init__(self, model: torch.nn.Module, windows: tuple[int | None, ...]):
        super().__init__()
        inner = model.model
        config = model.config
        self.embed, self.norm, self.rotary = inner.embed_tokens, inner.norm, inner.rotary_emb
        self.layers = inner.layers
        self.windows = windows
        self.layer_types = tuple(getattr(config, "layer_types", None) or ("full_attention",) * len(self.layers))
        self.by_type = config.model_type == "gemma3_text"  # a rotary table per layer type
        self.sandwich = hasattr(self.layers[0], "pre_feedforward_layernorm")  # Gemma's norms around each block
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.fused = model.device.type == "cuda"  # attention in one sdpa call (see _attend)
        kinds = tuple(zip(self.layer_types, windows))
        self.group = group_size(kinds, GROUP)
        self.spans = [range(start, start + self.group) for start in range(0, len(self.layers), self.group)]
        self.grouped_layers = [tuple(self.layers[i] for i in span) for span in self.spans]

    @staticmethod
    def of(model: torch.nn.Module, windows: tuple[int | None, ...]) -> DecodeStep | None:
        config = getattr(model, "config", None)
        if getattr(config, "model_type", None) not in FAMILIES or not hasattr(model, "model"):
            return None
        if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
            return None
        return DecodeStep(model, windows)

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict:
        """layer type -> (cos, sin) [B, 1, D] at each row's position."""
        at = positions[None]  # [1, B]
        if not self.by_type:
            cos, sin = self.rotary(hidden, at)
            table = (cos[0, :, None], sin[0, :, None])
            return {kind: table for kind in set(self.layer_types)}
        out = {}
        for kind in set(self.layer_types):
            cos, sin = self.rotary(hidden, at, kind)
            out[kind] = (cos[0, :, None], sin[0, :, None])
        return out

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                keys: list[torch.Tensor], values: list[torch.Tensor], width: int, group_fn=None) -> torch.Tensor:
        """group_fn: what runs each group of layers (the compiled `run_group`, engine/step_compiler.py);
        eager by default."""
        run = group_fn or self.run_group
        h = self.embed(ids)  # [B, H]
        tables = self._rotary(h[None], positions)
        columns = torch.arange(width, device=ids.device)  # [W]
        seen = columns[None, :] <= positions[:, None]  # [B, W]
        masks = {}
        for window in set(self.windows):
            see = seen if window is None else seen & (columns[None, :] > positions[:, None] - window)
            masks[window] = see[:, None, None, :]  # [B, 1, 1, W]
        for span, layers in zip(self.spans, self.grouped_layers):
            h = run(layers, h, tuple(tables[self.layer_types[i]] for i in span),
                    tuple(masks[self.windows[i]] for i in span), keys[span.start:span.stop],
                    values[span.start:span.stop], slots, positions, width)
        return self.norm(h)  # [B, H]

    def run_group(self, layers: tuple, h, tables: tuple, masks: tuple, keys: list[torch.Tensor],
                  values: list[torch.Tensor], slots, positions, width: int) -> torch.Tensor:
        """The layers of one group, each with its (cos, sin), mask and KV."""
        for i, layer in enumerate(layers):
            cos, sin = tables[i]
            h = self._layer(layer, h, cos, sin, masks[i], keys[i], values[i], slots, positions, width)
        return h

    def _layer(self, layer, h, cos, sin, mask, cache_k, cache_v, slots, positions, width: int) -> torch.Tensor:
        """One decoder layer for h [B, H]; writes the rows' KV into cache_k, cache_v [S, Hkv, C, D]."""
        B = h.shape[0]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        if hasattr(attn, "maskd_qkv"):  # engine/quantized_linear.py's fused copy: one call
            q, k, v = attn.maskd_qkv(x).split(self._qkv_sizes(attn), dim=-1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = q.view(B, -1, self.head_dim)  # [B, Hq, D]
        k = k.view(B, -1, self.head_dim)  # [B, Hkv, D]
        v = v.view(B, -1, self.head_dim)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        cache_k[slots, :, positions] = k.to(cache_k.dtype)
        cache_v[slots, :, positions] = v.to(cache_v.dtype)
        kv_heads = k.shape[1]
        K = cache_k[:, :, :width][slots]  # [B, Hkv, W, D]: sliced first, so only W columns are copied
        V = cache_v[:, :, :width][slots]
        # the query heads sharing a KV head become its query positions: no copy of K/V per head
        grouped = q.view(B, kv_heads, -1, self.head_dim).to(K.dtype)  # [B, Hkv, G, D]
        o = self._attend(grouped, K, V, mask)  # [B, Hkv, G, D]
        o = attn.o_proj(o.reshape(B, -1).to(h.dtype))  # [B, H]
        if self.sandwich:
            h = h + layer.post_attention_layernorm(o)
            return h + layer.post_feedforward_layernorm(self._mlp(layer.mlp, layer.pre_feedforward_layernorm(h)))
        h = h + o
        return h + self._mlp(layer.mlp, layer.post_attention_layernorm(h))

    @staticmethod
    def _qkv_sizes(attn) -> list[int]:
        return [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]

    @staticmethod
    def _mlp(mlp, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(mlp, "maskd_gate_up"):
            return mlp(x)
        gate, up = mlp.maskd_gate_up(x).chunk(2, dim=-1)  # engine/quantized_linear.py's fused copy
        return mlp.down_proj(mlp.act_fn(gate) * up)

    def _attend(self, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, Hkv, G, D] over K, V [B, Hkv, W, D] where mask [B, 1, 1, W]. On CUDA one fused kernel;
        on CPU written out, which inductor fuses into a few loops (the CPU flash kernel's setup
        costs more than a decode row's attention)."""
        if self.fused:
            return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, scale=self.scaling)
        scores = (q.float()[:, :, :, None, :] * K.float()[:, :, None]).sum(-1) * self.scaling  # [B, Hkv, G, W]
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # [B, Hkv, G, W]
        return (weights[..., None] * V.float()[:, :, None]).sum(-2).to(V.dtype)  # [B, Hkv, G, D]

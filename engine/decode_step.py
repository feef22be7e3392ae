"""DecodeStep: the pass where every row feeds exactly one token, written lean over the model's own
modules and the SlotCache tensors, so that its layer can be compiled (torch.compile): every layer
of a model runs the same compiled code over its own weights, so no Python runs inside a layer, and
the compile is paid for one layer, not for all of them (17 s against 61 s for SmolLM2's 30 layers
on 2 cores, at the same step time).

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
                keys: list[torch.Tensor], values: list[torch.Tensor], width: int, layer_fn=None) -> torch.Tensor:
        """layer_fn: what runs each layer (the compiled `_layer`, engine/step_compiler.py); eager by default."""
        run = layer_fn or self._layer
        h = self.embed(ids)  # [B, H]
        tables = self._rotary(h[None], positions)
        columns = torch.arange(width, device=ids.device)  # [W]
        seen = columns[None, :] <= positions[:, None]  # [B, W]
        masks = {}
        for window in set(self.windows):
            see = seen if window is None else seen & (columns[None, :] > positions[:, None] - window)
            masks[window] = see[:, None, None, :]  # [B, 1, 1, W]
        for i, layer in enumerate(self.layers):
            cos, sin = tables[self.layer_types[i]]
            h = run(layer, h, cos, sin, masks[self.windows[i]], keys[i], values[i], slots, positions, width)
        return self.norm(h)  # [B, H]

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

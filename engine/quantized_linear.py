"""Linear layers for the CPU whose weights are read in fewer bytes (what bounds a batch-1 decode step):
int8 per output channel and int4 in groups of 32, computed by the kernels that ship in torch
(`aten._weight_int8pack_mm`, `aten._weight_int4pack_mm_for_cpu`, the ones torchao's CPU layouts
dispatch to), and dense bfloat16. Each computes in its `compute` dtype (bfloat16: the kernels are
fast only there) and hands back the input's dtype, so the model around them (residual stream,
norms, attention, KV cache) stays float32: measured on SmolLM2, all-bfloat16 kept the first 16
greedy tokens of float32 on 4 of 10 prompts, bfloat16 matmuls in a float32 model on 7.

int4 is asymmetric (a scale and a zero per group, min-max), the form of GGUF's Q4_0 / Q4_1 blocks:
a model dequantized from such a file is requantized almost exactly (`quantize_model`).
"""

from __future__ import annotations

import torch

INT4_GROUP = 32  # GGUF's block size: a Q4 block maps onto one group


class Int8Linear(torch.nn.Module):
    """y = x @ (q * scale).T + bias, q int8 [N, K], scale [N] per output channel (symmetric)."""

    def __init__(self, linear: torch.nn.Linear, compute: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()  # [N, K]
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [N]
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(compute))
        self.bias = _bias(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scale.dtype)  # [M, K]
        y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scale).to(x.dtype)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]  # [N, K]

    def share(self, whole: Int8Linear, start: int) -> None:
        """Reads its weight from `whole`'s rows [start, ...) where they hold the same numbers."""
        view = whole.qweight[start:start + self.out_features]
        if torch.equal(view, self.qweight) and torch.equal(whole.scale[start:start + self.out_features], self.scale):
            self.qweight = view


def int4_parts(weight: torch.Tensor, compute: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] in groups of 32 along K, min-max: (packed for the kernel, scale and zero
    [G, N, 2] in `compute`, and the weight [N, K] float32 as the kernel reads it back)."""
    n, k = weight.shape
    w = weight.detach().float().view(n, k // INT4_GROUP, INT4_GROUP)  # [N, G, 32]
    low, high = w.amin(dim=-1), w.amax(dim=-1)  # [N, G]
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = ((w - low[..., None]) / scale[..., None]).round().clamp(0, 15)  # [N, G, 32]
    zero = low + 8 * scale  # the kernel reads (q - 8) * scale + zero
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).view(n, k), 1)
    scale_zero = torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(compute)  # [G, N, 2]
    scale, zero = scale_zero[..., 0].t().float(), scale_zero[..., 1].t().float()  # rounded as the kernel reads them
    return packed, scale_zero, ((q - 8) * scale[..., None] + zero[..., None]).view(n, k)


class Int4Linear(torch.nn.Module):
    """y = x @ W.T + bias with W[n, g*32 + i] = (q - 8) * scale[g, n] + zero[g, n], q in 0..15."""

    def __init__(self, linear: torch.nn.Linear, compute: torch.dtype, parts=None):
        super().__init__()
        packed, scale_zero, _ = parts or int4_parts(linear.weight, compute)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", packed)
        self.register_buffer("scale_zero", scale_zero)
        self.bias = _bias(linear)

    @staticmethod
    def fits(linear: torch.nn.Linear) -> bool:
        n, k = linear.weight.shape
        return k % INT4_GROUP == 0 and n % 16 == 0  # the packing's own bound

    def share(self, whole: Int4Linear, start: int) -> None:
        """Reads its packed weight from `whole`'s rows [start, ...) where they hold the same bytes (the
        packing interleaves rows in blocks: a part whose rows do not start and end on a block's
        edges packs differently)."""
        view = whole.packed[start:start + self.out_features]
        if torch.equal(view, self.packed):
            self.packed = view

    def dequantized(self) -> torch.Tensor:
        """W [N, K] as the kernel reads it, in float32 (its scales and zeros are exact there)."""
        eye = torch.eye(self.in_features)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, INT4_GROUP, self.scale_zero.float()).t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scale_zero.dtype)  # [M, K]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, INT4_GROUP, self.scale_zero).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class Int4PairLinear(torch.nn.Module):
    """The output head: an int4 layer of W and a second int4 layer of what it missed (W minus its
    dequantized self), summed. About int8's precision (each group's error is cut 15-fold again) in
    two int4 reads, which cost SmolLM2's 49,152 x 576 head 2x ~0.5 ms against 2.7 ms for torch's
    int8 kernel on 2 cores."""

    def __init__(self, linear: torch.nn.Linear, compute: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        plain = torch.nn.utils.skip_init(torch.nn.Linear, linear.in_features, linear.out_features,
                                         bias=False)  # only its sizes are read; the bias is added once, here
        coarse = int4_parts(linear.weight, compute)
        self.coarse = Int4Linear(plain, compute, coarse)
        self.fine = Int4Linear(plain, compute, int4_parts(linear.weight.detach().float() - coarse[2], compute))
        self.bias = _bias(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.coarse(x) + self.fine(x)
        return y if self.bias is None else y + self.bias


class DenseLinear(torch.nn.Module):
    """y = x @ W.T + bias with W held (and multiplied) in the compute dtype."""

    def __init__(self, linear: torch.nn.Linear, compute: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to(compute))
        self.bias = _bias(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def share(self, whole: DenseLinear, start: int) -> None:
        """Reads its weight from `whole`'s rows [start, ...) (the same numbers)."""
        self.weight = whole.weight[start:start + self.out_features]


def _bias(linear: torch.nn.Linear) -> torch.nn.Parameter | None:
    """The bias, added in the layer's output dtype (the model's)."""
    return None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)


class BlockInt8Embedding(torch.nn.Module):
    """An embedding whose rows are int8 in blocks of 32 with a float32 scale each, the form of GGUF's
    Q8_0 blocks; only made where it holds the table exactly (`of`), so a lookup gives the same
    float32 numbers in about a quarter of the bytes."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.num_embeddings, self.embedding_dim = q.shape
        self.register_buffer("q", q)  # [V, H] int8
        self.register_buffer("scale", scale)  # [V, H / 32] float32

    @staticmethod
    def of(embedding: torch.nn.Module) -> BlockInt8Embedding | None:
        """The exact int8 form of a plain float32 nn.Embedding, or None where it has none."""
        if type(embedding) is not torch.nn.Embedding or embedding.weight.dtype != torch.float32 \
                or embedding.embedding_dim % INT4_GROUP \
                or embedding.max_norm is not None:  # (padding_idx only matters to training)
            return None
        w = embedding.weight.detach()
        blocks = w.view(w.shape[0], -1, INT4_GROUP)  # [V, G, 32]
        scale = blocks.abs().amax(dim=-1) / 127  # [V, G]: a Q8_0 block's largest value is +-127 scales
        q = (blocks / scale.clamp(min=1e-30)[..., None]).round().clamp(-127, 127)
        if not torch.equal(q * scale[..., None], blocks):
            return None
        return BlockInt8Embedding(q.to(torch.int8).view_as(w), scale)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.q[ids].view(*ids.shape, -1, INT4_GROUP).float() * self.scale[ids][..., None]
        return rows.view(*ids.shape, self.embedding_dim)


KINDS = {"int8": Int8Linear, "int4": Int4Linear, "none": DenseLinear}
HEADS = {"int8": Int4PairLinear, "int4": Int4PairLinear, "none": DenseLinear}


FUSED = (("maskd_qkv", ("q_proj", "k_proj", "v_proj")), ("maskd_gate_up", ("gate_proj", "up_proj")))


def _fuse(parent: torch.nn.Module, kind: str, compute: torch.dtype) -> int:
    """Sibling projections that read the same input (q, k, v; gate, up) become one layer of them
    all, rows stacked, for the decode step (engine/decode_step.py): one kernel call instead of three
    or two. Each row is quantized as in a layer of its own, so the outputs are the same numbers; the
    siblings stay (the packed pass calls them), each reading its weight from the joined layer's rows
    where they are the same bytes (`share`), so the weights are mostly held once. Returns how many
    siblings it replaced."""
    replaced = 0
    for name, parts in FUSED:
        layers = [getattr(parent, part, None) for part in parts]
        if not all(type(layer) is torch.nn.Linear for layer in layers):
            continue
        joined = torch.nn.utils.skip_init(torch.nn.Linear, layers[0].in_features,  # no random init: overwritten
                                          sum(layer.out_features for layer in layers), bias=layers[0].bias is not None)
        with torch.no_grad():
            joined.weight.copy_(torch.cat([layer.weight for layer in layers]))
            if joined.bias is not None:
                joined.bias.copy_(torch.cat([layer.bias for layer in layers]))
        cls = KINDS[kind]
        if cls is Int4Linear and not all(Int4Linear.fits(layer) for layer in [joined, *layers]):
            cls = Int8Linear
        fused = cls(joined, compute)
        setattr(parent, name, fused)
        start = 0
        for part, layer in zip(parts, layers):
            sibling = cls(layer, compute)
            sibling.share(fused, start)
            setattr(parent, part, sibling)
            start += layer.out_features
            replaced += 1
    return replaced


def quantize_model(model: torch.nn.Module, kind: str, compute: torch.dtype) -> int:
    """Replaces the decoder's Linear layers with `kind` ("int8", "int4", or "none": dense) layers
    computing in `compute`, and the output head with an Int4PairLinear where the layers are quantized
    (the logits are the most sensitive product: plain int4 there cost SmolLM2 4% of perplexity); a
    layer int4 cannot hold (its sizes) becomes int8. Sibling projections are joined (`_fuse`).
    The input embedding (a lookup reads one row, not the matrix) becomes int8 blocks only where they
    hold it exactly (a GGUF's Q8_0 table: SmolLM2's 108 MB in 30). Returns how many linear layers
    were replaced. Weights tied between head and embedding are untied: the head gets its own."""
    replaced = 0
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        replaced += _fuse(parent, kind, compute)
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            cls = HEADS[kind] if child is head else KINDS[kind]
            if cls in (Int4Linear, Int4PairLinear) and not Int4Linear.fits(child):
                cls = Int8Linear
            setattr(parent, name, cls(child, compute))
            replaced += 1
    if head is not None and getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head is a quantized copy now
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    exact = BlockInt8Embedding.of(embedding) if embedding is not None else None
    if exact is not None:
        model.set_input_embeddings(exact)
    return replaced

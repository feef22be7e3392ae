"""Weight-only quantized linear layers for the CPU: int8 per output channel and int4 in groups of 32,
computed by the kernels that ship in torch (`aten._weight_int8pack_mm`,
`aten._weight_int4pack_mm_for_cpu`, the ones torchao's CPU layouts dispatch to). The activations
stay in the model's dtype (bfloat16 or float32); only the weights are read in fewer bytes, which is
what bounds a batch-1 decode step.

int4 is asymmetric (a scale and a zero per group, min-max), the form of GGUF's Q4_0 / Q4_1 blocks:
a model dequantized from such a file is requantized almost exactly (`quantize_model`).
"""

from __future__ import annotations

import torch

INT4_GROUP = 32  # GGUF's block size: a Q4 block maps onto one group


class Int8Linear(torch.nn.Module):
    """y = x @ (q * scale).T + bias, q int8 [N, K], scale [N] per output channel (symmetric)."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach().float()  # [N, K]
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [N]
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("qweight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(dtype))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().to(dtype),
                                                                        requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [M, K]
        y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scale)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]  # [N, K]


class Int4Linear(torch.nn.Module):
    """y = x @ W.T + bias with W[n, g*32 + i] = (q - 8) * scale[g, n] + zero[g, n], q in 0..15."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype):
        super().__init__()
        n, k = linear.weight.shape
        w = linear.weight.detach().float().view(n, k // INT4_GROUP, INT4_GROUP)  # [N, G, 32]
        low, high = w.amin(dim=-1), w.amax(dim=-1)  # [N, G]
        scale = ((high - low) / 15).clamp(min=1e-12)
        q = ((w - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).view(n, k)
        zero = low + 8 * scale  # the kernel reads (q - 8) * scale + zero
        self.in_features, self.out_features = k, n
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scale_zero", torch.stack([scale.t(), zero.t()], dim=-1).contiguous().to(dtype))  # [G, N, 2]
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().to(dtype),
                                                                        requires_grad=False)

    @staticmethod
    def fits(linear: torch.nn.Linear) -> bool:
        n, k = linear.weight.shape
        return k % INT4_GROUP == 0 and n % 8 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)  # [M, K]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, INT4_GROUP, self.scale_zero)  # [M, N]
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


KINDS = {"int8": Int8Linear, "int4": Int4Linear}


def quantize_model(model: torch.nn.Module, kind: str, dtype: torch.dtype) -> int:
    """Replaces the decoder's Linear layers with `kind` ("int8" or "int4") layers whose activations
    are `dtype`, and the output head with an int8 one (the logits are the most sensitive product:
    int4 there cost SmolLM2 4% of perplexity); a layer int4 cannot hold (its sizes) becomes int8.
    The input embedding stays as it is (a lookup reads one row, not the matrix). Returns how many
    layers were replaced. Weights tied between head and embedding are untied: the head gets its own."""
    replaced = 0
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            cls = Int8Linear if child is head else KINDS[kind]
            if cls is Int4Linear and not Int4Linear.fits(child):
                cls = Int8Linear
            setattr(parent, name, cls(child, dtype))
            replaced += 1
    if head is not None and getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head is a quantized copy now
    return replaced

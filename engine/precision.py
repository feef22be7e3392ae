"""What a model runs at: the activations' dtype (the KV cache follows it) and the weights'
quantization, from models.yaml's `dtype` and `quantization` and what the device can do.

`auto` picks the fastest choice that keeps the model faithful (benchmarks/ measures the bounds:
perplexity within +3% for bfloat16 and +8% for int8/int4 against float32, greedy tokens):

- CUDA: bfloat16 (float16 where the GPU has no bf16), weights as they are.
- A CPU with bfloat16 instructions (AVX512_BF16 or AMX): bfloat16 activations and weight-only
  int4 where the source's weights are 4-bit blocks already (a GGUF of Q4_0 / Q4_1 / Q4_K: their
  requantization is exact), int8 otherwise; the output head is int8 in both.
- A CPU without them: float32, weights as they are (the quantized kernels are fast only with
  bfloat16 activations; with float32 ones they were 10x slower than float32 weights).

`MASKD_CPU_BF16=0` makes the CPU count as one without bfloat16 (to try that path anywhere).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from engine.registry import RegistryError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATIONS = ("auto", "none", "int8", "int4")
FOUR_BIT = {"Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS"}  # GGUF block types int4 groups of 32 hold exactly


@dataclass(frozen=True)
class Precision:
    """On CUDA the whole model runs at `dtype`. On the CPU the linear layers multiply in `dtype` and
    the rest of the model (residual stream, norms, attention, KV cache) stays float32
    (engine/quantized_linear.py says why)."""

    dtype: torch.dtype  # of the matmuls (CPU) or of everything (CUDA)
    quantization: str  # none | int8 | int4 (weight-only; the head is int8 whenever it is not none)
    why: str  # one line for the startup log and `maskd models`
    cpu: bool = True

    @property
    def model_dtype(self) -> torch.dtype:
        """The dtype of the model's own tensors, the activations between its layers and the KV cache."""
        return torch.float32 if self.cpu else self.dtype

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        if not self.cpu or (self.dtype == torch.float32 and self.quantization == "none"):
            return name
        weights = name if self.quantization == "none" else self.quantization
        return f"{weights} weights, {name} matmuls, float32 activations"


def cpu_has_bf16() -> bool:
    if os.environ.get("MASKD_CPU_BF16") == "0":
        return False
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def gguf_weight_types(path: str) -> set[str]:
    """The block types of a GGUF file's 2-D weights (its header only; nothing is dequantized)."""
    import gguf

    reader = gguf.GGUFReader(path)
    return {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2 and "embd" not in t.name}


def choose(name: str, dtype: str, quantization: str, device: torch.device,
           gguf_path: str | None = None) -> Precision:
    """The precision a model runs at on `device`; raises RegistryError for one the device cannot run."""
    if quantization not in QUANTIZATIONS:
        raise RegistryError(f"model {name!r}: quantization {quantization!r} is not one of {QUANTIZATIONS}")
    if device.type != "cpu":
        if quantization in ("int8", "int4"):
            raise RegistryError(f"model {name!r}: quantization {quantization} runs on the CPU only (torch's "
                                f"weight-only kernels); on {device.type} set quantization: auto or none")
        if dtype == "auto":
            bf16 = device.type != "cuda" or torch.cuda.is_bf16_supported()
            return Precision(torch.bfloat16 if bf16 else torch.float16, "none",
                             f"auto on {device.type}: {'bfloat16' if bf16 else 'float16'}", cpu=False)
        return Precision(DTYPES[dtype], "none", f"dtype {dtype} as models.yaml says", cpu=False)
    bf16 = cpu_has_bf16()
    if dtype == "auto":
        act = torch.bfloat16 if bf16 else torch.float32
        why = "CPU with bfloat16 instructions" if bf16 else "CPU without bfloat16 instructions: float32"
    else:
        act, why = DTYPES[dtype], f"dtype {dtype} as models.yaml says"
        if act == torch.bfloat16 and not bf16:
            why += " (this CPU has no bfloat16 instructions: it runs, slowly)"
    if quantization != "auto":
        return Precision(act, quantization, why + f"; quantization {quantization} as models.yaml says")
    if act != torch.bfloat16:
        return Precision(act, "none", why + "; weights unquantized (int4/int8 kernels need bfloat16 activations)")
    types = gguf_weight_types(gguf_path) if gguf_path else set()
    if types and types <= FOUR_BIT:
        return Precision(act, "int4", why + f"; int4 weights (the GGUF's are {', '.join(sorted(types))})")
    return Precision(act, "int8", why + "; int8 weights")


def apply(model: torch.nn.Module, precision: Precision) -> int:
    """Casts the model to its dtype and, on the CPU, replaces its linear layers in place (quantized, or
    dense in a narrower dtype); returns how many layers were replaced."""
    from engine.quantized_linear import quantize_model

    model.to(precision.model_dtype)
    if precision.model_dtype == precision.dtype and precision.quantization == "none":
        return 0
    return quantize_model(model, precision.quantization, precision.dtype)

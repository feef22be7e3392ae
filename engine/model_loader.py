"""Load a registry entry's model and tokenizer onto the best device, without touching the network."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from dataclasses import dataclass

import torch

from engine import precision as precisions
from engine.registry import ModelSpec, RegistryError


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype  # of the activations and the KV cache
    eos_token_ids: frozenset[int]
    context_length: int
    vocab_size: int  # width of the logits, may exceed len(tokenizer)
    spec: ModelSpec
    precision: precisions.Precision | None = None


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_precision(spec: ModelSpec, device: torch.device, tp: int = 1,
                   device_map: str | None = None) -> precisions.Precision:
    """What the model runs at here (engine/precision.py); sharded or spread models keep their
    weights unquantized."""
    gguf_path = None
    if spec.kind in ("package", "gguf"):
        where, name = spec.locate()
        gguf_path = f"{where}/{name}"
    quantization, dtype = spec.quantization, spec.dtype
    if tp > 1 or device_map:  # the shards are plain Linear layers at the model's dtype
        quantization = "none" if quantization == "auto" else quantization
        dtype = "float32" if dtype == "auto" and device.type == "cpu" else dtype
    chosen = precisions.choose(spec.name, dtype, quantization, device, gguf_path)
    if (tp > 1 or device_map) and chosen.quantization != "none":
        raise RegistryError(f"model {spec.name!r}: quantization {chosen.quantization} cannot be sharded "
                            "(--tp or device_map); set quantization: none")
    return chosen


def _give_back_freed() -> None:
    """Returns the heap the load freed to the system (glibc keeps it otherwise): the float32 copy a
    GGUF dequantizes to, and the layers quantization replaced. SmolLM2: resident 1,132 -> 717 MB."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name:
        libc = ctypes.CDLL(name)
        if hasattr(libc, "malloc_trim"):  # glibc's; musl has none
            libc.malloc_trim(0)


def eos_ids_of(model, tokenizer) -> frozenset[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return frozenset(ids)


@contextlib.contextmanager
def gguf_read_once():
    """Within it, a GGUF file's header is parsed once and gguf's tensor name map built once per
    architecture. transformers parses the whole header (SmolLM2's holds its 49k-token vocabulary)
    for the tokenizer, the config and the weights, and builds the name map once per module
    (~400 times for SmolLM2); the precision's choice reads the header too: about 10 s of a 17 s load."""
    try:
        import gguf
    except ImportError:
        yield
        return
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers = {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = reader_class(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def load_model(spec: ModelSpec, device: str = "auto", allow_download: bool = False, tp: int = 1,
               device_map: str | None = None) -> LoadedModel:
    """tp > 1: this process is one of tp ranks (torch.distributed already joined) and loads its
    shard with transformers' tensor parallelism; device_map="auto" spreads layers over the
    devices instead (one process)."""
    if not spec.is_available() and not allow_download:
        raise RegistryError(
            f"model {spec.name!r} is not available locally (source {spec.source}); "
            "put its weights in the Hugging Face cache or point `source` at a local path")
    started = time.perf_counter()
    with gguf_read_once():
        loaded = _load(spec, device, allow_download, tp, device_map)
    print(f"maskd: loaded {spec.name} in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    return loaded


def _load(spec: ModelSpec, device: str, allow_download: bool, tp: int, device_map: str | None) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, gguf_file = spec.locate()
    target = pick_device(device)
    chosen = pick_precision(spec, target, tp, device_map)
    dtype = chosen.model_dtype
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    kwargs["local_files_only"] = not allow_download
    print(f"maskd: loading {spec.name} from {spec.source} ({target}, {chosen.describe()}: {chosen.why})",
          file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    if tp > 1:
        from transformers.distributed import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(tp_size=tp)
    elif device_map:
        kwargs["device_map"] = device_map
    # a GGUF dequantizes to float32: quantized again from there, its 4-bit blocks come back exactly
    model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kwargs)
    if tp == 1 and not device_map:
        model.to(target)
        precisions.apply(model, chosen)
    model.eval()
    _give_back_freed()
    if spec.chat_template:
        tokenizer.chat_template = spec.chat_template
    context = spec.context_length or getattr(model.config, "max_position_embeddings", 2048)
    vocab_size = model.get_output_embeddings().out_features
    return LoadedModel(
        name=spec.name, model=model, tokenizer=tokenizer, device=target, dtype=dtype,
        eos_token_ids=eos_ids_of(model, tokenizer), context_length=context,
        vocab_size=vocab_size, spec=spec, precision=chosen)

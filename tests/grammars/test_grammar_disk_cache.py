"""The grammar disk cache hands back only what this maskd wrote for the key, and never unpickles.

Each test fails on the code before grammars/compile/unit_file.py: entries were pickles read with
pickle.load, carrying no key of their own, and the key left interegular out.
"""

from __future__ import annotations

import pickle
import shutil
from importlib.metadata import version

import numpy as np

from grammar_fixtures import smollm2_vocabulary
from grammars import GrammarCompiler
from grammars.compile import compiler as compiler_module

REGEX = r'\{"q":"[a-z]{1,8}"\}'
OTHER = r'\{"n":[0-9]{1,3}\}'


class _Planted:
    """What a planted entry could hold: a pickle that runs code (writes a marker file) when read."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _compiler(cache_dir) -> GrammarCompiler:
    return GrammarCompiler(smollm2_vocabulary(), cache_dir=str(cache_dir), workers=1)


def _reference(regex: str):
    with GrammarCompiler(smollm2_vocabulary(), workers=1) as plain:  # memory only
        return plain.compile_regex(regex).index.get_transitions()


def test_a_planted_entry_is_never_unpickled_and_the_grammar_is_rebuilt(tmp_path):
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    with _compiler(cache) as compiler:
        path = compiler._disk.path(compiler._key(REGEX))  # where this key's entry is read from
        with open(path, "wb") as f:
            pickle.dump(_Planted(str(marker)), f)
        grammar = compiler.compile_regex(REGEX)
        assert not marker.exists(), "the planted pickle ran"
        assert compiler.stats["compiles"] == 1 and compiler.stats["disk_hits"] == 0
        assert grammar.index.get_transitions() == _reference(REGEX)
    # an .npz whose array is an object array (a pickle inside the zip) is refused too
    with open(path, "wb") as f:
        np.savez(f, header=np.array([_Planted(str(marker))], dtype=object))
    with _compiler(cache) as fresh:
        assert fresh.compile_regex(REGEX).index.get_transitions() == _reference(REGEX)
        assert not marker.exists() and fresh.stats["compiles"] == 1
    with _compiler(cache) as again:  # the rebuilt entry replaced the planted one
        again.compile_regex(REGEX)
        assert again.stats["disk_hits"] == 1 and again.stats["compiles"] == 0


def test_an_entry_of_another_version_or_key_is_not_read_even_under_this_name(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(compiler_module, "CACHE_VERSION", "an older maskd")
    with _compiler(cache) as old:
        old.compile_regex(REGEX)
        old_path = old._disk.path(old._key(REGEX))
    monkeypatch.undo()
    with _compiler(cache) as current:
        path = current._disk.path(current._key(REGEX))
        assert path != old_path  # the version is in the key: another file
        shutil.copy(old_path, path)  # ... and copied under this key's name, it is still not read
        shutil.copy(old_path, current._disk.path(current._key(OTHER)))  # nor as another regex's entry
        assert current.compile_regex(REGEX).index.get_transitions() == _reference(REGEX)
        assert current.compile_regex(OTHER).index.get_transitions() == _reference(OTHER)
        assert current.stats["disk_hits"] == 0 and current.stats["compiles"] == 2


def test_the_key_holds_every_version_that_shapes_an_entry():
    from grammars.files.cache_version import JSON_VALUE_VERSION, UNIT_VERSION

    for name in ("outlines-core", "interegular", "numpy"):
        assert f"{name}-{version(name)}" in compiler_module.CACHE_VERSION
    assert compiler_module.CACHE_VERSION == UNIT_VERSION and "src-" in UNIT_VERSION  # maskd's table code
    assert f"numpy-{version('numpy')}" in JSON_VALUE_VERSION and "src-" in JSON_VALUE_VERSION


def test_a_good_entry_round_trips_as_plain_arrays_and_a_damaged_one_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    with _compiler(cache) as compiler:
        first = compiler.compile_regex(REGEX)
        path = compiler._disk.path(first.key)
    with np.load(path, allow_pickle=False) as data:  # plain arrays: no pickle anywhere in the file
        arrays = {name: data[name] for name in data.files}
    with _compiler(cache) as fresh:
        loaded = fresh.compile_regex(REGEX)
        assert fresh.stats["disk_hits"] == 1 and fresh.stats["compiles"] == 0
    assert loaded.index.get_transitions() == first.index.get_transitions()
    for name in ("keys", "distance", "far", "mode", "odd_off", "odd_tok", "odd_dist", "count"):
        assert np.array_equal(getattr(loaded.budget, name), getattr(first.budget, name))
    assert loaded.budget.sparse[0] == first.budget.sparse[0]
    assert all(np.array_equal(a, b) for a, b in zip(loaded.budget.sparse[1:], first.budget.sparse[1:]))
    # an id past the vocabulary would index out of bounds when the mask is applied: not read
    arrays["sparse_ids"] = arrays["sparse_ids"].copy()
    arrays["sparse_ids"][-1] = smollm2_vocabulary().size + 5
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with _compiler(cache) as damaged:
        assert damaged.compile_regex(REGEX).index.get_transitions() == first.index.get_transitions()
        assert damaged.stats["disk_hits"] == 0 and damaged.stats["compiles"] == 1

"""Cache folders another user could write to are never read from."""

import os
import shutil
import subprocess

import pytest

from grammars.files.private_dir import owned_file, private_dir


def test_a_new_folder_is_private_and_a_shared_one_is_refused(tmp_path):
    mine = tmp_path / "cache"
    assert private_dir(str(mine)) and (os.stat(mine).st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert not private_dir(str(shared))


def test_only_regular_files_of_this_user_are_loaded(tmp_path):
    path = tmp_path / "x.index"
    path.write_bytes(b"x")
    assert owned_file(str(path))
    link = tmp_path / "link.index"
    link.symlink_to(path)
    assert not owned_file(str(link)) and not owned_file(str(tmp_path / "absent"))


def test_a_compiler_with_a_shared_cache_folder_keeps_nothing_on_disk(tmp_path):
    from grammars import GrammarCompiler
    from grammar_fixtures import smollm2_vocabulary
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    compiler = GrammarCompiler(smollm2_vocabulary(), cache_dir=str(shared), workers=1)
    try:
        assert compiler.cache_dir is None
        compiler.compile_regex("a+")
        compiler.drain()  # the disk write, had there been one, runs in the background
        assert os.listdir(shared) == []
    finally:
        compiler.close()


def test_the_index_table_library_is_never_built_in_a_shared_or_temporary_folder(tmp_path, monkeypatch):
    import tempfile

    from grammars.index import native
    shared, temporary = tmp_path / "shared", tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o777)
    temporary.mkdir()
    monkeypatch.setenv("MASKD_CACHE_DIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # the shared temporary folder, watched
    assert native.load() is None  # the slow Python paths instead
    assert native._load_extension() is None  # nor the extension: the ctypes routines (or none) instead
    assert os.listdir(shared) == [] and os.listdir(temporary) == []


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("cc") is None, reason="needs root (chown) and a C compiler")
def test_a_library_planted_by_another_user_is_rebuilt_never_loaded(tmp_path, monkeypatch):
    """A library's constructor runs as it loads: one another user put in place must never load."""
    from grammars.index import native
    cache, marker = tmp_path / "cache", tmp_path / "ran"
    assert private_dir(str(cache))
    planted = cache / native.library_name()
    source = tmp_path / "planted.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                      f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(planted), str(source)], check=True)
    os.chown(planted, 65534, 65534)
    monkeypatch.setenv("MASKD_CACHE_DIR", str(cache))
    library = native.load()
    assert not marker.exists(), "the planted library was loaded"
    assert library is not None and os.stat(planted).st_uid == os.getuid()  # rebuilt from the source

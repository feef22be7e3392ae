"""Cache folders another user could write to are never read from."""

import os

from grammars.private_dir import owned_file, private_dir


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
        assert os.listdir(shared) == []
    finally:
        compiler.close()

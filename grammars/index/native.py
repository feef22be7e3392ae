"""maskd's C routines (grammars/index/_index_table.c, _token_index.c, _set_bits.c, _mask_row.c,
_merge_ids.c): compiled with the system C compiler on first use, once per source version, into a
folder of this user's alone, then loaded through ctypes; and the few called at every decoding step
also as a CPython extension (grammars/index/_fast_calls.c), where Python's headers are present.

Only a folder of this user's alone: never the shared temporary folder, where anyone could plant a
library to be loaded into the server (private_dir.py). Without a C compiler `library()` is None and
callers take their pure-Python paths (slower, same results).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import sysconfig

import numpy as np

from grammars.files.private_dir import owned_file, private_dir

log = logging.getLogger("maskd.grammars")

_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(_HERE, name)
           for name in ("_index_table.c", "_token_index.c", "_set_bits.c", "_mask_row.c", "_merge_ids.c")]
_HEADERS = [os.path.join(_HERE, "_varint.h")]
_LIBRARY: list = []  # [] not tried yet; [None] unavailable; [CDLL]


def library():
    """The loaded C library, or None where it cannot be built."""
    if not _LIBRARY:
        _LIBRARY.append(load())
    return _LIBRARY[0]


_ROUTINES: dict[str, object] = {}


def routine(name: str, restype, argtypes: list):
    """The C library's function ``name`` with its ctypes signature set (looked up once), or None
    where the library cannot be built (the caller takes its Python path)."""
    if name not in _ROUTINES:
        lib = library()
        found = None
        if lib is not None:
            found = getattr(lib, name)
            found.restype, found.argtypes = restype, argtypes
        _ROUTINES[name] = found
    return _ROUTINES[name]


def library_name() -> str:
    digest = hashlib.sha256()
    for path in SOURCES + _HEADERS:
        with open(path, "rb") as f:
            digest.update(f.read())
    return f"maskd-native-{digest.hexdigest()[:16]}-{sys.platform}.so"


def load():
    """Build (unless this user's build of these sources is there) and load the library; or None."""
    path = _built(library_name(), SOURCES, [])
    try:
        return None if path is None else ctypes.CDLL(path)
    except OSError as exc:
        log.warning("could not load the C library %s (%s): the slow Python paths are used", path, exc)
        return None


_EXTENSION: list = []  # as _LIBRARY
EXTENSION_SOURCES = [os.path.join(_HERE, name)
                     for name in ("_fast_calls.c", "_mask_row.c", "_merge_ids.c", "_set_bits.c")]


def extension():
    """maskd's CPython extension (grammars/index/_fast_calls.c: ``pick_rows``, ``take_ahead``, ``merged``,
    ``bits``, ``address``), built against Python's and numpy's headers and loaded once; or None where
    Python's headers are missing or it cannot be built (callers use the ctypes routines)."""
    if not _EXTENSION:
        _EXTENSION.append(_load_extension())
    return _EXTENSION[0]


def _load_extension():
    include, numpy_include = sysconfig.get_paths()["include"], np.get_include()
    if not os.path.exists(os.path.join(include, "Python.h")):
        return None
    digest = hashlib.sha256(f"{include} {numpy_include} {np.__version__}".encode())  # built against this numpy
    for path in EXTENSION_SOURCES:
        with open(path, "rb") as f:
            digest.update(f.read())
    name = f"maskd-fast-calls-{digest.hexdigest()[:16]}-{sysconfig.get_config_var('SOABI')}.so"
    path = _built(name, EXTENSION_SOURCES, [f"-I{include}", f"-I{numpy_include}"])
    try:
        spec = None if path is None else importlib.util.spec_from_file_location("_maskd_fast_calls", path)
        if spec is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (OSError, ImportError) as exc:
        log.warning("could not load the C extension %s (%s): the ctypes routines are used", path, exc)
        return None


def _built(name: str, sources: list[str], flags: list[str]) -> str | None:
    """The path of this user's build of ``sources`` as ``name`` in maskd's cache folder (compiled now
    unless it is there), or None where there is no private folder or no build."""
    folder = os.environ.get("MASKD_CACHE_DIR") or os.path.expanduser("~/.cache/maskd")
    path = os.path.join(folder, name)
    if not private_dir(folder):
        log.warning("no private folder for the C library at %s: the slow Python paths are used", folder)
        return None
    try:
        if not owned_file(path):
            if os.path.lexists(path):
                os.remove(path)  # not ours: rebuilt rather than loaded
            tmp = f"{path}.{os.getpid()}.tmp"
            compiler = os.environ.get("CC", "cc")
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", *flags, "-o", tmp, *sources], check=True,
                           capture_output=True, timeout=120)
            os.replace(tmp, path)
        return path
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not build the C library in %s (%s): the slow Python paths are used", folder, exc)
        return None


def copied(pointer, n: int, dtype) -> np.ndarray:
    """The ``n`` items a C routine wrote at ``pointer``, copied into a numpy array it owns."""
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.ctypeslib.as_array(pointer, shape=(n,)).astype(dtype, copy=True)

"""maskd's C routines (grammars/_index_table.c, _token_index.c, _set_bits.c, _mask_row.c,
_merge_ids.c): compiled with the system C compiler on first use, once per source version, into a
folder of this user's alone, then loaded.

Only a folder of this user's alone: never the shared temporary folder, where anyone could plant a
library to be loaded into the server (private_dir.py). Without a C compiler `library()` is None and
callers take their pure-Python paths (slower, same results).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import sys

import numpy as np

from grammars.private_dir import owned_file, private_dir

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
    folder = os.environ.get("MASKD_CACHE_DIR") or os.path.expanduser("~/.cache/maskd")
    path = os.path.join(folder, library_name())
    if not private_dir(folder):
        log.warning("no private folder for the C library at %s: the slow Python paths are used", folder)
        return None
    try:
        if not owned_file(path):
            if os.path.lexists(path):
                os.remove(path)  # not ours: rebuilt rather than loaded
            tmp = f"{path}.{os.getpid()}.tmp"
            compiler = os.environ.get("CC", "cc")
            subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", tmp, *SOURCES], check=True,
                           capture_output=True, timeout=120)
            os.replace(tmp, path)
        return ctypes.CDLL(path)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not build the C library in %s (%s): the slow Python paths are used", folder, exc)
        return None


def copied(pointer, n: int, dtype) -> np.ndarray:
    """The ``n`` items a C routine wrote at ``pointer``, copied into a numpy array it owns."""
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.ctypeslib.as_array(pointer, shape=(n,)).astype(dtype, copy=True)

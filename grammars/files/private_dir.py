"""Cache folders nobody else can plant files in.

maskd loads compiled grammars, JSON-value tables and a compiled C library from its cache folders,
so a folder another user can write to would let that user run code in the server (the library) or
steer its masks (the tables; neither is a pickle, grammars/compile/unit_file.py).
A cache folder is used only if it is owned by this user and writable by nobody else (made 0700 if
new); a file is loaded only if this user owns it. Otherwise the cache is skipped with a warning.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger("maskd.grammars")


def private_dir(path: str) -> bool:
    """Creates `path` (mode 0700) if needed; True if it is safe to read and write."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError as exc:
        log.warning("cache folder %s is unusable (%s); running without it", path, exc)
        return False
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        log.warning("cache folder %s is not this user's alone (owner uid %d, mode %o); not using it: "
                    "chmod 700 it or pass another folder", path, info.st_uid, stat.S_IMODE(info.st_mode))
        return False
    return True


def owned_file(path: str) -> bool:
    """Whether `path` exists, is a regular file, and belongs to this user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()

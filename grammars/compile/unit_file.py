"""The disk form of one compiled unit: its TokenIndex and BudgetTable, with no pickle.

A pickle runs code when it is read, so a cache entry planted or swapped in the cache folder would
run in the server.  An entry is instead an .npz of plain arrays, read with ``allow_pickle=False``:
a JSON header (the format, the unit's cache key and the versions that shaped it), the index's
arrays (grammars/index/unit_index.py) and the table's arrays.

An entry whose header names another key (another regex, vocabulary or version: a file renamed or
copied under this name) is not read, and the table's arrays are checked for the shapes and bounds
the index and mask code rely on (an out-of-range id in a sparse mask would be an out-of-bounds index on a
GPU, which kills the device context rather than raising).  Any failure is reported as ``BadEntry``
and the caller rebuilds the unit.  The header is not a signature: the folder is this user's alone
(private_dir.py), and whoever could write there could read a MAC's secret too; what the format
guarantees is that reading an entry, planted or not, never runs code.
"""

from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np

from grammars.index.budget import ALLOWED, BANNED, NONE, BudgetTable
from grammars.files.private_dir import owned_file
from grammars.index.unit_index import TokenIndex

log = logging.getLogger("maskd.grammars")

FORMAT = "maskd-unit-npz-2"
_TABLE = ("keys", "distance", "far", "mode", "odd_off", "odd_tok", "odd_dist")
_INDEX = ("final", "loop", "off", "tok", "nxt")


class BadEntry(ValueError):
    """A cache entry that is not one this maskd wrote for this key."""


class UnitFolder:
    """The compiler's disk cache: ``<folder>/<key>.unit.npz`` per unit, in a folder of this user's alone
    (private_dir.py; ``folder`` None: no disk cache). ``versions``: what shaped the entries it writes."""

    def __init__(self, folder: str | None, vocab_size: int, versions: str) -> None:
        self.folder, self.vocab_size, self.versions = folder, vocab_size, versions

    def path(self, key: str) -> str | None:
        return os.path.join(self.folder, f"{key}.unit.npz") if self.folder else None

    def get(self, key: str) -> tuple[TokenIndex, BudgetTable] | None:
        """The unit of ``key``, or None: absent, not ours, or not a good entry for this key (then the
        caller rebuilds it, and its write replaces the entry)."""
        path = self.path(key)
        if path is None or not owned_file(path):
            return None
        try:
            return load_unit(path, key, self.vocab_size)
        except (OSError, BadEntry) as exc:
            log.warning("grammar cache entry %s is not usable (%s); rebuilding it", path, exc)
            return None

    def put(self, key: str, built: tuple[TokenIndex, BudgetTable]) -> None:
        path = self.path(key)
        if path is None:
            return
        try:
            save_unit(path, key, self.versions, *built)
        except OSError as exc:
            log.warning("could not write %s (%s); the unit stays in memory only", path, exc)


def save_unit(path: str, key: str, versions: str, index: TokenIndex, table: BudgetTable) -> None:
    """Write the unit to ``path`` atomically (a temp file in the same folder, then os.replace)."""
    header = json.dumps({"format": FORMAT, "key": key, "versions": versions}).encode()
    arrays = {name: getattr(table, name) for name in _TABLE}
    if table.count is not None:
        arrays["count"] = table.count
    if table.sparse is not None:
        size, kind, off, ids = table.sparse
        arrays.update(sparse_size=np.asarray([size], dtype=np.int64), sparse_kind=kind, sparse_off=off,
                      sparse_ids=ids)
    arrays.update({f"index_{name}": getattr(index, name) for name in _INDEX})
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, header=np.frombuffer(header, dtype=np.uint8), **arrays)
    os.replace(tmp, path)


def load_unit(path: str, key: str, vocab_size: int) -> tuple[TokenIndex, BudgetTable]:
    """The unit saved at ``path`` for ``key`` over ``vocab_size`` tokens; BadEntry (or OSError) if it
    is anything else."""
    try:
        with np.load(path, allow_pickle=False) as data:  # a pickle, or an object array, is refused here
            arrays = {name: data[name] for name in data.files}
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - not an .npz of plain arrays (a pickle, truncated, garbage)
        raise BadEntry(f"not a unit file ({type(exc).__name__}: {exc})") from None
    try:
        header = json.loads(arrays.pop("header").tobytes())
    except (KeyError, ValueError) as exc:
        raise BadEntry(f"no readable header ({exc})") from None
    if not isinstance(header, dict):
        raise BadEntry("no readable header")
    if header.get("format") != FORMAT or header.get("key") != key:
        raise BadEntry(f"written for another key or format ({header.get('format')}, {header.get('versions')})")
    index = _index(arrays)
    table = _table(arrays, vocab_size)
    if len(table.keys) != len(index.final):
        raise BadEntry("the table and the index have different state counts")
    return index, table


def _index(arrays: dict[str, np.ndarray]) -> TokenIndex:
    """The TokenIndex of ``arrays`` after the checks its readers rely on (BadEntry otherwise)."""
    try:
        final, loop, off, tok, nxt = (arrays.pop(f"index_{name}") for name in _INDEX)
    except KeyError:
        raise BadEntry("no index") from None
    states = len(final)
    if any(a.ndim != 1 for a in (final, loop, off, tok, nxt)) or not states or len(loop) != states:
        raise BadEntry("index arrays of the wrong shape")
    if len(nxt) != len(tok) or not _offsets(off, states, len(tok)):
        raise BadEntry("index arrays of mismatched lengths")
    if not _in_range(nxt, states) or not _in_range(tok, 1 << 31) or not np.isin(final, (0, 1)).all() \
            or not np.isin(loop, (0, 1)).all():
        raise BadEntry("index arrays out of range")
    return TokenIndex(final, loop, off, tok, nxt)


def _table(arrays: dict[str, np.ndarray], vocab_size: int) -> BudgetTable:
    """The BudgetTable of ``arrays`` after the checks its readers rely on (BadEntry otherwise)."""
    missing = [name for name in _TABLE if name not in arrays]
    if missing:
        raise BadEntry(f"lacks arrays {missing}")
    if any(a.ndim != 1 for a in arrays.values()):
        raise BadEntry("an array is not one-dimensional")
    states = len(arrays["keys"])
    odd = len(arrays["odd_tok"])
    same = [len(arrays[n]) == states for n in ("distance", "far", "mode")] + [len(arrays["odd_dist"]) == odd]
    if not all(same) or not _offsets(arrays["odd_off"], states, odd):
        raise BadEntry("table arrays of mismatched lengths")
    if not _in_range(arrays["odd_tok"], vocab_size):
        raise BadEntry("odd tokens out of range")
    falls = np.flatnonzero(np.diff(arrays["odd_dist"]) < 0) + 1  # a budget reads a state's as a slice
    if not np.isin(falls, arrays["odd_off"]).all():
        raise BadEntry("odd tokens not ordered by distance")
    count = arrays.get("count")
    if count is not None and len(count) != states:
        raise BadEntry("count of the wrong length")
    sparse = None
    if "sparse_ids" in arrays:
        try:
            (size,), kind, off, ids = (arrays[f"sparse_{n}"] for n in ("size", "kind", "off", "ids"))
        except (KeyError, ValueError):
            raise BadEntry("incomplete sparse masks") from None
        if len(kind) != states or not _offsets(off, states, len(ids)):
            raise BadEntry("sparse masks of mismatched lengths")
        if size != vocab_size or not _in_range(ids, size) or not np.isin(kind, (NONE, ALLOWED, BANNED)).all():
            raise BadEntry("sparse masks out of range")
        sparse = (int(size), kind, off, ids)
    return BudgetTable(*(arrays[name] for name in _TABLE), count, sparse)


def _offsets(off: np.ndarray, rows: int, total: int) -> bool:
    """Whether ``off`` is a CSR offset array of ``rows`` rows over ``total`` items."""
    return len(off) == rows + 1 and int(off[0]) == 0 and int(off[-1]) == total and bool((np.diff(off) >= 0).all())


def _in_range(ids: np.ndarray, size: int) -> bool:
    return not len(ids) or (int(ids.min()) >= 0 and int(ids.max()) < size)

"""SparseMask: a state's token mask as a short list of token ids, applied to logits without a bitmask.

On a 49k vocabulary a JSON grammar's states are bimodal: either a handful of tokens are allowed
(punctuation, keys, enum values) or nearly all are (inside strings; a few hundred tokens banned).
Either way one side of the mask is short, and writing only that side beats expanding the packed
bitmask (measured on CPU, one thread, one row of 49,152 floats):

    disallowed ids, index_fill_ (-inf)              2 us + 1.7 ns per id
    allowed ids, gather + fill_(-inf) + scatter     8 us + 2.1 ns per id
    packed bitmask, LUT index_select + add         25-50 us (grammars/masks/bitmask.py)

(the same through numpy views of the row, for float32/64/16: 2.5 and 10 us against torch's 6.7 and
17 us on a slower day).

A grammar's SparseMasks come from its budget table, which stores every state's ids at compile
time (grammars/index/budget.py, by the same rule as ``sparse_mask`` here; tests compare the two);
without stored ids one is built from the state's packed row.  Either way it is memoised per state
and shared by every request; mid-sized sets have none and keep the bitmask path.  CPU only: on
CUDA the packed bitmask is applied on the device.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np
import torch

from grammars.index import native
from grammars.index.budget import ALLOWED_MAX, DISALLOWED_MAX  # noqa: F401 - the rule, shared with compile time

_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)  # bfloat16: torch's ops
_BUFFERS: dict[tuple, torch.Tensor] = {}
_LOCK = threading.Lock()


class SparseMask:
    """The tokens on the short side of a mask over ``vocab_size`` tokens, ascending, all below it:
    ``allowed`` True, the only allowed ones; False, the banned ones. Held as an int64 numpy array
    (``array``, what the CPU paths read); ``ids`` is a torch view of it, made on first use (a state's
    first visit makes a SparseMask, and a tensor costs 10-20 us there). ``size`` is the number of
    ids and ``single`` the one allowed id where it is the only one (a forced token), else -1: plain
    ints, read by the pick at every step without numpy's per-call cost."""

    __slots__ = ("allowed", "array", "vocab_size", "size", "single", "_ids", "_address")

    def __init__(self, allowed: bool, ids: torch.Tensor | np.ndarray, vocab_size: int):
        self.allowed, self.vocab_size = allowed, vocab_size
        if isinstance(ids, torch.Tensor):
            self._ids, self.array = ids, ids.numpy()
        else:
            self._ids, self.array = None, np.asarray(ids, dtype=np.int64)
        self.size = len(self.array)
        self.single = int(self.array[0]) if allowed and self.size == 1 else -1
        self._address = None

    @property
    def ids(self) -> torch.Tensor:
        """int64 [k]: the ids as a tensor sharing the array's memory."""
        if self._ids is None:
            with torch.inference_mode(False):  # read later both inside and outside the engine's step
                self._ids = torch.from_numpy(self.array)
        return self._ids

    @classmethod
    def of_sorted(cls, allowed: bool, array: np.ndarray, vocab_size: int) -> SparseMask:
        """A SparseMask of an int64 array already ascending and distinct (a merge's result, a state's
        stored ids), held as it is: the constructor's type check and conversion cost ~10 µs with the
        caches cold, and a state's first narrowed visit makes two or three (grammars/json_value/hole_ids.py)."""
        mask = cls.__new__(cls)
        mask.allowed, mask.array, mask.vocab_size, mask.size = allowed, array, vocab_size, len(array)
        mask.single = int(array[0]) if allowed and mask.size == 1 else -1
        mask._ids = mask._address = None
        return mask

    def id_array(self) -> np.ndarray:
        """int64 [k]: the ids as numpy."""
        return self.array

    @property
    def address(self) -> int:
        """Where the ids lie in memory (for the C pick; numpy's ``.ctypes`` costs ~3 µs per call)."""
        if self._address is None:
            self.array = np.ascontiguousarray(self.array)
            fast = native.extension()
            self._address = fast.address(self.array) if fast is not None else self.array.ctypes.data
        return self._address


def sparse_mask(bitmask_row: torch.Tensor, vocab_size: int) -> SparseMask | None:
    """The sparse form of a packed row (int32 [ceil(vocab_size/32)]), or None if both sides are long.

    Bits for tokens >= vocab_size are ignored, as ``apply_token_bitmask_inplace`` does.
    """
    words = bitmask_row.numpy().view(np.uint32).copy()  # [W]; bit j of word w = token 32*w + j
    tail = words.shape[0] * 32 - vocab_size
    if tail:
        words[-1] &= np.uint32((1 << (32 - tail)) - 1)  # bits past the vocabulary: not tokens
    allowed = int(np.bitwise_count(words).sum())
    banned = vocab_size - allowed
    if banned <= DISALLOWED_MAX and banned <= allowed:  # index_fill_ is the cheaper apply
        words = ~words
        if tail:
            words[-1] &= np.uint32((1 << (32 - tail)) - 1)
        keep_allowed = False
    elif allowed <= ALLOWED_MAX:
        keep_allowed = True
    else:
        return None
    return SparseMask(keep_allowed, _set_bits(words), vocab_size)


def allowed_sparse(ids, vocab_size: int, base: np.ndarray | None = None) -> SparseMask | None:
    """The SparseMask ``sparse_mask`` makes of a row whose allowed tokens are ``ids`` (ints, any order,
    repeats allowed) and ``base`` (int64 ascending distinct, if given), made from the ids alone; None
    where more than ALLOWED_MAX ids are given (repeats counted) or the banned side is the one
    ``sparse_mask`` keeps."""
    if len(ids) + (0 if base is None else len(base)) > ALLOWED_MAX:
        return None
    return _allowed_side(_merged(_NO_IDS if base is None else base, True, ids, _NO_IDS), vocab_size)


@functools.lru_cache(maxsize=4096)
def few_allowed(ids: tuple[int, ...], vocab_size: int) -> SparseMask | None:
    """allowed_sparse of a few ids given as a tuple, memoised: the forced tokens' masks, asked at the
    first steps of every request (a merge there cost 30-70 us, cache-cold after the request's setup)."""
    return allowed_sparse(np.array(ids, dtype=np.int64), vocab_size)


def changed(mask: SparseMask | None, on, off) -> SparseMask | None:
    """The SparseMask ``sparse_mask`` makes of ``mask``'s row with the tokens ``off`` cleared and then
    ``on`` set (ids in any order), merged from the id lists (no row); None where ``mask`` is None or
    the result's short side is not the side ``mask`` keeps."""
    if mask is None or not (len(on) or len(off)):
        return mask
    ids = _merged(mask.array, mask.allowed, on, off)
    if mask.allowed:
        return _allowed_side(ids, mask.vocab_size)
    if len(ids) > DISALLOWED_MAX or len(ids) > mask.vocab_size - len(ids):
        return None
    return SparseMask.of_sorted(False, ids, mask.vocab_size)


def _allowed_side(ids: np.ndarray, vocab_size: int) -> SparseMask | None:
    """SparseMask(True, ids) for ascending distinct ``ids`` where sparse_mask would keep that side."""
    banned = vocab_size - len(ids)
    if len(ids) > ALLOWED_MAX or (banned <= DISALLOWED_MAX and banned <= len(ids)):
        return None
    return SparseMask.of_sorted(True, ids, vocab_size)


def _merged(ids: np.ndarray, allowed: bool, on, off) -> np.ndarray:
    """int64 ascending distinct: ``allowed``, (ids less off) plus on; else (ids plus off) less on.
    ``ids`` ascending distinct; ``on`` and ``off`` in any order. In C (grammars/index/_merge_ids.c) in one
    call through the extension (native.extension() ``merged``: its inputs read as they come, the
    result a new array; around the merge, numpy's conversions, sort and slice cost 20-60 us at a
    state's first narrowed visit, cache-cold after a forward pass); without it, a few ids in all in
    Python's sets (the ctypes call alone costs 4-6 µs, more when its code is cold), more through
    ctypes, else numpy."""
    fast = native.extension()
    if fast is not None:
        return fast.merged(ids, allowed, on, off)
    if len(ids) + len(on) + len(off) <= _FEW_IDS:
        ids, on, off = set(ids.tolist()), set(_listed(on)), set(_listed(off))
        return np.array(sorted((ids - off) | on if allowed else (ids | off) - on), dtype=np.int64)
    on, off = np.ascontiguousarray(on, dtype=np.int64), np.ascontiguousarray(off, dtype=np.int64)
    routine = _merge_by_ctypes()
    if routine is not None:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty(len(ids) + len(on) + len(off), dtype=np.int64)
        n = routine(ids, on, off, allowed, out)
        if n >= 0:
            return out[:n]
    if allowed:
        return _distinct(np.concatenate((ids[~np.isin(ids, off)], on)))
    ids = _distinct(np.concatenate((ids, off)))
    return ids[~np.isin(ids, on)]


def _merge_by_ctypes():
    """merge_ids through ctypes (called as routine(ids, on, off, allowed, out)); or None without the C library."""
    routine = native.routine("merge_ids", ctypes.c_int64, _MERGE_ARGS)
    if routine is None:
        return None
    return lambda ids, on, off, allowed, out: routine(ids.ctypes.data, len(ids), on.ctypes.data, len(on),
                                                      off.ctypes.data, len(off), allowed, out.ctypes.data)


def _listed(ids) -> list:
    """Python ints of an int array or a sequence of ints."""
    return ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Ascending without repeats, by a sort (np.unique took 240 us for 3,000 ids on numpy 2.4)."""
    ids = np.sort(ids)
    return ids[np.concatenate(([True], ids[1:] != ids[:-1]))] if len(ids) else ids


_NO_IDS = np.zeros(0, dtype=np.int64)
_FEW_IDS = 64  # _merged without the extension: at most this many ids in all in Python (0.5-2 µs against 6-7 by ctypes)
_MERGE_ARGS = [ctypes.c_void_p, ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_void_p]  # made once: asked per merge


def _set_bits(words: np.ndarray) -> np.ndarray:
    """int64 [k] ascending positions of the set bits of uint32 [W]: in C (grammars/index/_set_bits.c, ~2 µs
    for 700 bits of 1536 words) through the extension, else through ctypes (~25 µs, most of it the
    call), else numpy (120-190 us)."""
    fast = native.extension()
    routine = fast.bits if fast is not None else _set_bits_by_ctypes()
    if routine is not None:
        words = np.ascontiguousarray(words, dtype=np.uint32)
        out = np.empty(int(np.bitwise_count(words).sum()), dtype=np.int64)
        if routine(words, out) == out.size:
            return out
    nonzero = np.flatnonzero(words)  # [n] words with a set bit
    bits = np.flatnonzero(np.unpackbits(words[nonzero].view(np.uint8), bitorder="little"))  # [k] in n*32
    return nonzero[bits >> 5] * 32 + (bits & 31)


def _set_bits_by_ctypes():
    """set_bits through ctypes, called as the extension's bits; or None without the C library."""
    routine = native.routine("set_bits", ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                          ctypes.c_int64])
    if routine is None:
        return None
    return lambda words, out: routine(words.ctypes.data, words.size, out.ctypes.data, out.size)


@functools.cache
def rows_routine():
    """The extension's ``pick_rows`` (grammars/index/_fast_calls.c: settle()'s loop over the narrowed rows
    in one call) where it is built, else None. Looked up once."""
    fast = native.extension()
    return None if fast is None else fast.pick_rows


@functools.cache
def take_routine():
    """The extension's ``take_ahead`` (grammars/index/_fast_calls.c: engine/constraint_hook.py's call over rows
    whose masks were all looked up ahead, in one call) where it is built, else None. Looked up once."""
    fast = native.extension()
    return None if fast is None else fast.take_ahead


@functools.cache
def pick_routine():
    """The C greedy pick under one SparseMask (grammars/index/_mask_row.c pick_f32) through ctypes (2-2.5 µs a
    call): settle()'s per-row pick where the extension (rows_routine) is not built; or None without the
    C library. Looked up once."""
    return native.routine("pick_f32", ctypes.c_int64, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                       ctypes.c_int64, ctypes.c_int, ctypes.c_int64])


def apply_sparse_mask_inplace(logits_row: torch.Tensor, mask: SparseMask) -> None:
    """Set the disallowed logits of one row to -inf in place; no allocation per call.

    Like the bitmask scratch, the gather buffer is shared: one decoding loop at a time.

    logits_row: float [V] on CPU with V == mask.vocab_size.
    """
    if logits_row.dim() != 1 or logits_row.shape[0] != mask.vocab_size or logits_row.device.type != "cpu":
        raise ValueError(
            f"a SparseMask over {mask.vocab_size} tokens applies to one CPU logits row of that "
            f"width; got {logits_row.device} {tuple(logits_row.shape)}; use "
            f"apply_token_bitmask_inplace for other shapes and devices"
        )
    if logits_row.dtype in _NUMPY_DTYPES:  # numpy's indexing costs a third of torch's per call
        row, ids = logits_row.numpy(), mask.id_array()
        if mask.allowed:
            kept = row[ids]
            row.fill(-np.inf)
            row[ids] = kept
        else:
            row[ids] = -np.inf
        return
    if not mask.allowed:
        logits_row.index_fill_(0, mask.ids, float("-inf"))
        return
    k = mask.ids.shape[0]
    if k == 0:
        logits_row.fill_(float("-inf"))
        return
    kept = _buffer(logits_row.dtype)[:k]  # [k]
    torch.index_select(logits_row, 0, mask.ids, out=kept)
    logits_row.fill_(float("-inf"))
    logits_row.index_copy_(0, mask.ids, kept)


def _buffer(dtype: torch.dtype) -> torch.Tensor:
    """float [ALLOWED_MAX] scratch for the kept logits, one per dtype (CPU, not an inference tensor)."""
    buf = _BUFFERS.get((dtype,))
    if buf is None:
        with _LOCK, torch.inference_mode(False):
            buf = _BUFFERS.setdefault((dtype,), torch.empty(ALLOWED_MAX, dtype=dtype))
    return buf

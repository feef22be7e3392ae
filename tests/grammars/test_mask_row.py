"""The C mask paths (grammars/index/_mask_row.c) give what the torch and numpy paths give.

mask_row_f32 (the packed apply of budget-narrowed rows on CPU) against apply_token_bitmask_inplace;
pick_f32 (the greedy pick under a SparseMask) against settle()'s numpy path, through ctypes and
through the CPython extension (grammars/index/_fast_calls.c pick_rows: all the rows in one call) alike.
"""

from __future__ import annotations

import os
import sysconfig

import numpy as np
import pytest
import torch

import engine.sampling as sampling
from grammars.index import native
from grammars.masks.bitmask import apply_token_bitmask_cpu, apply_token_bitmask_inplace
from grammars.masks.sparse_mask import SparseMask

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here")


def packed(bits: torch.Tensor) -> torch.Tensor:
    """bool [B, W*32] -> int32 [B, W], bit j of word w = column 32*w + j."""
    words = np.packbits(bits.numpy(), axis=1, bitorder="little").view(np.uint32)
    return torch.from_numpy(words.view(np.int32).copy())


@pytest.mark.parametrize("vocab,width", [(49152, 1536), (49150, 1536), (100, 4), (100, 3), (262144, 8192)])
@pytest.mark.parametrize("density", [0.0, 0.01, 0.5, 0.99, 1.0])
def test_the_c_packed_apply_equals_the_torch_apply(vocab, width, density):
    gen = torch.Generator().manual_seed(vocab + int(density * 100))
    mask = packed(torch.rand(3, width * 32, generator=gen) < density)
    torch_way = torch.randn(3, vocab, generator=gen)
    c_way = torch_way.clone()
    apply_token_bitmask_inplace(torch_way, mask, rows=[0, 2])
    assert apply_token_bitmask_cpu(c_way, mask, [0, 2])
    assert torch.equal(torch_way, c_way)


def test_the_c_packed_apply_declines_what_it_does_not_cover():
    mask = packed(torch.ones(1, 64, dtype=torch.bool))
    assert not apply_token_bitmask_cpu(torch.zeros(1, 64, dtype=torch.float16), mask, [0])
    assert not apply_token_bitmask_cpu(torch.zeros(64, 2).t(), mask, [0])  # a row with stride 2


@pytest.mark.parametrize("seed", range(6))
def test_the_c_pick_equals_the_numpy_pick(seed, monkeypatch):
    """Allowed and banned masks, short and long, one allowed token (no call), ties, and the row's own
    argmax banned or not."""
    rng = np.random.default_rng(seed)
    vocab = 5000
    logits = torch.from_numpy(rng.integers(-3, 4, size=(5, vocab)).astype(np.float32))  # many ties
    masks = {0: SparseMask(True, np.sort(rng.choice(vocab, 7, replace=False)), vocab),
             1: SparseMask(True, np.sort(rng.choice(vocab, 900, replace=False)), vocab),
             2: SparseMask(False, np.sort(rng.choice(vocab, 40, replace=False)), vocab),
             3: SparseMask(False, np.flatnonzero(logits[3].numpy() == logits[3].max().item()), vocab),
             4: SparseMask(True, np.flatnonzero(logits[4].numpy() == logits[4].min().item())[:1], vocab)}
    best = logits.numpy().argmax(axis=1).tolist()  # row 3's own argmax is banned: the next best wins
    assert native.library() is not None and sampling.pick_routine() is not None
    c_way = sampling.settle(logits.clone(), list(best), masks)  # pick_rows, where the extension is built
    monkeypatch.setattr(sampling, "rows_routine", lambda: None)
    per_row = sampling.settle(logits.clone(), list(best), masks)  # a pick_f32 call per row
    monkeypatch.setattr(sampling, "pick_routine", lambda: None)
    numpy_way = sampling.settle(logits.clone(), list(best), masks)
    assert c_way == per_row == numpy_way
    assert c_way[3] not in masks[3].array.tolist()
    assert c_way[4] == int(masks[4].array[0])  # a forced token, though its logit is the row's least


@pytest.mark.parametrize("banned", [3, 1000, 1025, 8192])
def test_a_banned_pick_over_a_large_vocabulary_leaves_the_row_as_it_was(banned):
    """The row's own argmax banned on Gemma's 262k vocabulary (the C pick masks the banned logits,
    argmaxes the row in blocks and puts them back; above 1024 banned ids its buffer is allocated):
    the first of the largest other logits, with the largest tied across blocks and beside banned
    ones; the row bit for bit as before; the first token not banned where every other is -inf."""
    rng = np.random.default_rng(banned)
    vocab = 262144
    row = rng.standard_normal(vocab).astype(np.float32)
    ids = np.sort(rng.choice(np.arange(1, vocab), banned - 1, replace=False))
    ids = np.union1d(ids, [0])  # token 0 banned: the first token not banned is past it
    row[ids[-1]] = 9.0  # the row's own argmax, banned
    free = np.setdiff1d(np.arange(vocab), ids)
    row[free[[-1, len(free) // 2, 7]]] = 5.0  # the largest allowed, three times: the first wins
    logits = torch.from_numpy(row.copy()).unsqueeze(0)
    mask = SparseMask(False, ids, vocab)
    assert sampling.settle(logits, [int(ids[-1])], {0: mask}) == [int(free[7])]
    assert np.array_equal(logits[0].numpy(), row)
    logits[0, free] = float("-inf")
    assert sampling.settle(logits, [int(ids[-1])], {0: mask}) == [int(free[0])]


def test_the_extensions_pick_rows_is_the_ctypes_pick_and_settle_uses_it():
    """Where Python's headers are here the extension is built, and settle() picks through its
    pick_rows; its pick equals the ctypes routine's on every mask kind, best banned or not, and it
    refuses a wrong call."""
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("no Python headers here: the ctypes routine serves")
    fast = native.extension()
    assert fast is not None and sampling.rows_routine() is fast.pick_rows
    by_ctypes = sampling.pick_routine()
    rng = np.random.default_rng(7)
    vocab = 3000
    logits = torch.from_numpy(rng.integers(-3, 4, size=(1, vocab)).astype(np.float32))  # many ties
    best = int(logits[0].argmax())
    for k in (0, 1, 2, 40, 900):
        for allowed in (True, False):
            ids = np.sort(rng.choice(vocab, k, replace=False))
            for chosen in (ids, np.union1d(ids, [best])):
                mask = SparseMask(allowed, chosen, vocab)
                tokens = [best]
                fast.pick_rows(logits.data_ptr(), vocab, logits.shape, {0: mask}, tokens)
                assert tokens[0] == by_ctypes(logits.data_ptr(), vocab, mask.address, mask.size, mask.allowed, best)
    with pytest.raises(TypeError):
        fast.pick_rows(logits.data_ptr(), vocab)


def test_pick_rows_picks_each_row_as_its_own_pick_and_refuses_what_is_not_a_row():
    """The extension's pick_rows (settle()'s loop in one call) over rows of a [B, V] view with a
    row stride past V: each narrowed row's token is pick_f32's for its mask (read from the mask's
    slots; an address not read yet is read through its property), a forced token without a pick,
    the other rows' tokens kept; a row outside the logits or the tokens, a mask that is not one,
    or a wrong call is an error."""
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("no Python headers here: the ctypes routine serves")
    fast = native.extension()
    rng = np.random.default_rng(11)
    vocab = 4000
    wide = torch.from_numpy(rng.standard_normal((4, vocab + 96)).astype(np.float32))
    logits = wide[:, :vocab]  # rows vocab + 96 floats apart
    best = logits.numpy().argmax(axis=1).tolist()
    masks = {0: SparseMask(True, np.sort(rng.choice(vocab, 50, replace=False)), vocab),
             1: SparseMask(False, np.union1d(rng.choice(vocab, 30, replace=False), [best[1]]), vocab),
             3: SparseMask(True, np.array([17]), vocab)}
    assert all(mask._address is None for mask in masks.values())
    tokens = list(best)
    assert fast.pick_rows(logits.data_ptr(), vocab + 96, logits.shape, masks, tokens) is None
    for row in (0, 1):
        mask = masks[row]
        assert tokens[row] == sampling.pick_routine()(logits[row].data_ptr(), vocab, mask.address, mask.size,
                                                      mask.allowed, best[row])
    assert tokens[1] != best[1] and tokens[1] not in masks[1].array.tolist()
    assert tokens[2] == best[2] and tokens[3] == 17
    for bad, error in (({4: masks[0]}, IndexError), ({-1: masks[0]}, IndexError), ({0: np.arange(3)}, AttributeError),
                       ({"0": masks[0]}, TypeError)):
        with pytest.raises(error):
            fast.pick_rows(logits.data_ptr(), vocab + 96, logits.shape, bad, list(best))
    with pytest.raises(IndexError):  # fewer tokens than the row
        fast.pick_rows(logits.data_ptr(), vocab + 96, logits.shape, {2: masks[0]}, [0, 0])
    with pytest.raises(TypeError):
        fast.pick_rows(logits.data_ptr(), vocab + 96, logits.shape, masks)
    with pytest.raises(TypeError):
        fast.pick_rows(logits.data_ptr(), vocab + 96, (4,), masks, list(best))


def test_the_extensions_array_calls_read_flat_arrays_of_their_item_size_only():
    """bits and address read numpy arrays through the buffer protocol: the wrong item size or a
    read-only out is an error, never a stray read. merged reads int64 arrays in place and copies
    int32 arrays, strided arrays and sequences of ints; anything else (floats) is an error. It returns
    an int64 array whose memory cannot be resized under it."""
    if not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        pytest.skip("no Python headers here: the ctypes routines serve")
    fast = native.extension()
    ids, none = np.array([1, 5, 9], dtype=np.int64), np.zeros(0, dtype=np.int64)
    out = np.empty(6, dtype=np.int64)

    def merged(*args):
        got = fast.merged(*args)
        assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.ndim == 1
        with pytest.raises(BufferError):
            got.base.obj.extend(b"\0" * 8)  # the bytearray under it, held by its memoryview
        return got.tolist()

    assert merged(ids, True, np.array([2, 5]), np.array([9])) == [1, 2, 5]
    assert merged(ids, False, np.array([5]), np.array([2, 2])) == [1, 2, 9]
    assert merged(ids.astype(np.int32), True, [7, 0], (1,)) == [0, 5, 7, 9]
    assert merged(np.arange(10, dtype=np.int64)[::2], False, np.array([4], dtype=np.int32), []) == [0, 2, 6, 8]
    assert merged(none, True, none, none) == []
    with pytest.raises(TypeError):
        fast.merged(ids.astype(np.float64), True, none, none)
    with pytest.raises(TypeError):
        fast.merged(ids, True, none)
    assert fast.address(ids) == ids.ctypes.data
    words = np.array([0b1010, 1], dtype=np.uint32)
    assert fast.bits(words, out) == 3 and out[:3].tolist() == [1, 3, 32]
    readonly = np.empty(6, dtype=np.int64)
    readonly.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        fast.bits(words, readonly)
    with pytest.raises(ValueError):
        fast.bits(words.astype(np.int64), out)
    with pytest.raises(ValueError):
        fast.address(words)

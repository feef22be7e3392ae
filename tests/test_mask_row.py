"""The C mask paths (grammars/_mask_row.c) give what the torch and numpy paths give.

mask_row_f32 (the packed apply of budget-narrowed rows on CPU) against apply_token_bitmask_inplace;
pick_f32 (the greedy pick under a SparseMask) against settle()'s numpy path.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.sampling as sampling
from grammars import native
from grammars.bitmask import apply_token_bitmask_cpu, apply_token_bitmask_inplace
from grammars.sparse_mask import SparseMask

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
    c_way = sampling.settle(logits.clone(), list(best), masks)
    monkeypatch.setattr(sampling, "pick_routine", lambda: None)
    numpy_way = sampling.settle(logits.clone(), list(best), masks)
    assert c_way == numpy_way
    assert c_way[3] not in masks[3].array.tolist()
    assert c_way[4] == int(masks[4].array[0])  # a forced token, though its logit is the row's least

"""Per-token mask cost along random-logit constrained walks (the `compile` suite's second table).

Each walk starts a fresh matcher of one compiled grammar and, for up to ``steps`` tokens, draws
random logits (the closing tokens favoured in the second half, so walks end), times fill + apply
of the mask, and advances by the argmax. maskd masks as the engine does (ConstraintMasker: the
per-state sparse id lists on CPU), or with ``packed`` through the packed bitmask (the CUDA path);
xgrammar and llguidance through their own bitmask fill and apply.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from engine.constraint_hook import ConstraintMasker
from grammars import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmasks


def closers(tok, vocab):
    return [tok.convert_tokens_to_ids(c) for c in ['"', "}", "]", ","]] + sorted(vocab.eos_token_ids)


def walk_costs(step, n_walks, steps, vocab_size, seed=0):
    """Run ``step(logits, i)`` -> done along random walks; returns per-token µs."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.empty(1, vocab_size)
    times = []
    for w in range(n_walks):
        for i in range(steps):
            logits.normal_(generator=gen)
            cost, done = step(w, i, logits)
            times.append(cost)
            if done:
                break
    return times


def mask_maskd(grammars, tok, vocab, steps, packed=False):
    """The engine's ConstraintMasker (fill, then each state's SparseMask on CPU), or with
    ``packed`` the packed-bitmask apply alone (fill + apply_token_bitmask_inplace)."""
    bitmask = allocate_token_bitmask(1, vocab.size)
    masker = ConstraintMasker(vocab.size, 1)
    bias = closers(tok, vocab)
    state = {}

    def step(w, i, logits):
        if i == 0:
            state["m"] = grammars[w % len(grammars)][1].matcher()
            state["seqs"] = [SimpleNamespace(constraint=state["m"], tokens_left=None)]
        m = state["m"]
        if i > steps // 2:
            logits[0, bias] += 8.0
        t = time.perf_counter()
        if packed:
            fill_next_token_bitmasks([(0, m)], bitmask)
            apply_token_bitmask_inplace(logits, bitmask)
        else:
            masker(logits, state["seqs"])
        cost = (time.perf_counter() - t) * 1e6
        m.advance(int(torch.argmax(logits[0])))
        return cost, m.is_terminated()

    return walk_costs(step, len(grammars), steps, vocab.size)


def mask_xgrammar(handle, tok, vocab, steps):
    xgr, compiled = handle
    bitmask = xgr.allocate_token_bitmask(1, vocab.size)
    bias = closers(tok, vocab)
    state = {}

    def step(w, i, logits):
        if i == 0:
            state["m"] = xgr.GrammarMatcher(compiled[w % len(compiled)])
        m = state["m"]
        if i > steps // 2:
            logits[0, bias] += 8.0
        t = time.perf_counter()
        m.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        cost = (time.perf_counter() - t) * 1e6
        m.accept_token(int(torch.argmax(logits[0])))
        return cost, m.is_terminated()

    return walk_costs(step, len(compiled), steps, vocab.size)


def mask_llguidance(handle, tok, vocab, steps):
    llg, lltok, matchers = handle
    import llguidance.torch as lt

    bitmask = lt.allocate_token_bitmask(1, vocab.size)
    bias = closers(tok, vocab)
    state = {}

    def step(w, i, logits):
        if i == 0:
            state["m"] = llg.LLMatcher(lltok, matchers[w % len(matchers)][0])
        m = state["m"]
        if i > steps // 2:
            logits[0, bias] += 8.0
        t = time.perf_counter()
        lt.fill_next_token_bitmask(m, bitmask, 0)
        lt.apply_token_bitmask_inplace(logits, bitmask)
        cost = (time.perf_counter() - t) * 1e6
        m.consume_token(int(torch.argmax(logits[0])))
        return cost, m.is_stopped() or m.is_error()

    return walk_costs(step, len(matchers), steps, vocab.size)

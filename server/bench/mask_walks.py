"""Per-token mask cost along random-logit constrained walks (the `compile` suite's second table).

A walk starts a fresh matcher of one compiled grammar and, for up to ``steps`` tokens, draws random
logits (the closing tokens favoured in the second half, so walks end), times fill + apply of the
mask, and advances by the argmax. Walk ``seed`` draws the same logits for every engine, and the
suite runs each walk on every engine in turn (interleaved). maskd masks as the engine does for a
greedy row (ConstraintMasker: the per-state sparse id lists on CPU, left to the pick where a
greedy row allows it, whose masked part is timed too), or with ``packed`` through the packed
bitmask (the CUDA path); xgrammar and llguidance through their own bitmask fill and apply.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from engine.constraint_hook import ConstraintMasker
from engine.sampling import SamplingParams, settle
from grammars import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmasks


def closers(tok, vocab):
    return [tok.convert_tokens_to_ids(c) for c in ['"', "}", "]", ","]] + sorted(vocab.eos_token_ids)


def walk(step, steps, vocab_size, bias, seed) -> list[float]:
    """Runs ``step(logits)`` -> (µs, done) along one random walk; returns per-token µs."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.empty(1, vocab_size)  # [1, V]
    times = []
    for i in range(steps):
        logits.normal_(generator=gen)
        if i > steps // 2:
            logits[0, bias] += 8.0
        cost, done = step(logits)
        times.append(cost)
        if done:
            break
    return times


def walk_maskd(grammar, tok, vocab, steps, seed, packed=False) -> list[float]:
    """The engine's ConstraintMasker on a greedy row (fill, then each state's SparseMask on CPU),
    with the mask's part of the pick (engine/sampling.py settle(): the argmax over a state's allowed
    ids, or the check of the row's own argmax against its banned ids) timed, and the row's own
    argmax not, as for the peers; or with ``packed`` the packed-bitmask apply alone (fill +
    apply_token_bitmask_inplace)."""
    bitmask = allocate_token_bitmask(1, vocab.size)
    masker = ConstraintMasker(vocab.size, 1)
    m = grammar.matcher()
    seqs = [SimpleNamespace(constraint=m, tokens_left=None, params=SamplingParams(temperature=0.0))]

    def step(logits):
        t = time.perf_counter()
        if packed:
            fill_next_token_bitmasks([(0, m)], bitmask)
            apply_token_bitmask_inplace(logits, bitmask)
            cost = (time.perf_counter() - t) * 1e6
            token = int(torch.argmax(logits[0]))
        else:
            narrowed = masker(logits, seqs)
            cost = time.perf_counter() - t
            plain = [0] if narrowed and narrowed[0].allowed else [int(logits.numpy()[0].argmax())]  # not timed
            t = time.perf_counter()
            token = settle(logits, plain, narrowed)[0]  # the mask's part of the pick, timed
            cost = (cost + time.perf_counter() - t) * 1e6
        m.advance(token)
        return cost, m.is_terminated()

    return walk(step, steps, vocab.size, closers(tok, vocab), seed)


def walk_xgrammar(compiled, tok, vocab, steps, seed) -> list[float]:
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(1, vocab.size)
    m = xgr.GrammarMatcher(compiled)

    def step(logits):
        t = time.perf_counter()
        m.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        cost = (time.perf_counter() - t) * 1e6
        m.accept_token(int(torch.argmax(logits[0])))
        return cost, m.is_terminated()

    return walk(step, steps, vocab.size, closers(tok, vocab), seed)


def walk_llguidance(peer, grammar, tok, vocab, steps, seed) -> list[float]:
    """``peer``: server.bench.peers.LLGuidancePeer (its tokenizer); ``grammar``: its compiled grammar."""
    import llguidance.torch as lt

    bitmask = lt.allocate_token_bitmask(1, vocab.size)
    m = peer.llguidance.LLMatcher(peer.lltok, grammar)

    def step(logits):
        t = time.perf_counter()
        lt.fill_next_token_bitmask(m, bitmask, 0)
        lt.apply_token_bitmask_inplace(logits, bitmask)
        cost = (time.perf_counter() - t) * 1e6
        m.consume_token(int(torch.argmax(logits[0])))
        return cost, m.is_stopped() or m.is_error()

    return walk(step, steps, vocab.size, closers(tok, vocab), seed)

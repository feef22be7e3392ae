"""Matcher + bitmask: constrained random walks give schema-valid JSON; EOS, specials, rollback."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from grammar_fixtures import shared_compiler, smollm2_tokenizer, smollm2_vocabulary
from grammars import (
                      GrammarError,
                      allocate_token_bitmask,
                      apply_token_bitmask_inplace,
                      fill_next_token_bitmasks,
                      )

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}


def _allowed(bitmask_row: torch.Tensor, vocab_size: int) -> set[int]:
    bits = ((bitmask_row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(-1)
    return set(torch.nonzero(bits[:vocab_size]).view(-1).tolist())


def _walk(matcher, vocab, seed, steps=200):
    """Random-logit constrained sampling; checks every step's mask invariants."""
    gen = torch.Generator().manual_seed(seed)
    bitmask = allocate_token_bitmask(2, vocab.size)
    logits = torch.empty(2, vocab.size)
    tok = smollm2_tokenizer()
    closers = [tok.convert_tokens_to_ids(c) for c in ['"', "}", "]", ","]] + list(vocab.eos_token_ids)
    tokens = []
    for step in range(steps):
        logits.normal_(generator=gen)
        if step > 40:  # steer towards closing so unbounded strings/numbers end
            logits[1, closers] += 8.0
        fill_next_token_bitmasks([(1, matcher)], bitmask)
        apply_token_bitmask_inplace(logits, bitmask, rows=[1])
        assert torch.isfinite(logits[0]).all()  # row 0 is unconstrained
        allowed = torch.isfinite(logits[1])
        eos_allowed = any(bool(allowed[e]) for e in vocab.eos_token_ids)
        assert eos_allowed == matcher.finished()
        assert not any(bool(allowed[s]) for s in vocab.special_ids - vocab.eos_token_ids)
        token = int(torch.argmax(logits[1]))
        matcher.advance(token)
        tokens.append(token)
        if matcher.is_terminated():
            break
    return tokens


@pytest.fixture(scope="module")
def grammar():
    return shared_compiler().compile_json_schema(SCHEMA)


@pytest.mark.parametrize("seed", range(6))
def test_random_walks_are_schema_valid(grammar, seed):
    vocab = smollm2_vocabulary()
    matcher = grammar.matcher()
    tokens = _walk(matcher, vocab, seed, steps=400)
    assert matcher.is_terminated(), "walk did not terminate"
    data = json.loads(vocab.decode(tokens).decode("utf-8"))  # decode() skips EOS
    jsonschema.validate(data, SCHEMA, format_checker=jsonschema.FormatChecker())


def test_json_object_walk():
    vocab = smollm2_vocabulary()
    from grammars import GrammarCompiler

    compiler = GrammarCompiler(vocab, workers=1)
    try:
        matcher = compiler.json_object_matcher()
    finally:
        compiler.close()
    tokens = _walk(matcher, vocab, seed=7, steps=400)
    assert isinstance(json.loads(vocab.decode(tokens)), dict)


def test_disallowed_token_raises(grammar):
    matcher = grammar.matcher()
    tok = smollm2_tokenizer()
    with pytest.raises(GrammarError, match="not allowed"):
        matcher.advance(tok.encode("hello", add_special_tokens=False)[0])
    with pytest.raises(GrammarError, match="EOS"):
        matcher.advance(tok.eos_token_id)


def test_rollback(grammar):
    vocab = smollm2_vocabulary()
    matcher = grammar.matcher()
    text = '{"name":"Rex","age":3,"kind":"dog"}'
    ids = smollm2_tokenizer().encode(text, add_special_tokens=False)
    states = []
    for t in ids:
        states.append(matcher.state)
        matcher.advance(t)
    eos = min(vocab.eos_token_ids)
    matcher.advance(eos)
    assert matcher.is_terminated() and not matcher.accepts(eos)
    matcher.rollback(1)  # undo EOS
    assert matcher.accepts(eos) and matcher.finished()
    matcher.rollback(3)
    assert matcher.state == states[-3] and not matcher.finished()
    for t in ids[-3:]:
        matcher.advance(t)
    assert matcher.finished()
    with pytest.raises(GrammarError, match="roll back"):
        matcher.rollback(len(ids) + 1)


def test_forced_on_const():
    vocab = smollm2_vocabulary()
    tok = smollm2_tokenizer()
    grammar = shared_compiler().compile_json_schema({"const": "ok"})
    matcher = grammar.matcher()
    quote = tok.convert_tokens_to_ids('"')
    row = torch.zeros(grammar.width, dtype=torch.int32)
    matcher.fill(row)
    assert _allowed(row, vocab.size) == {quote}  # SmolLM2 has no '"o'/'"ok' token
    assert matcher.forced() == [quote]  # after '"': 'o', 'ok' -> not forced any more
    matcher.advance(quote)
    assert matcher.forced() == []
    for t in tok.encode('ok', add_special_tokens=False):
        matcher.advance(t)
    assert matcher.forced() == [quote]  # only the closing quote can follow
    matcher.fill(row)
    assert _allowed(row, vocab.size) == {quote}
    matcher.advance(quote)
    assert matcher.forced() == [] and matcher.finished() and matcher.is_terminated()


def test_apply_handles_wider_logits_and_row_subsets():
    vocab_size, width_vocab = 70, 64  # logits wider than the mask's coverage
    bitmask = allocate_token_bitmask(3, width_vocab)
    bitmask.zero_()
    bitmask[0, 0] = 0b101  # row 0: tokens 0 and 2
    bitmask[2, 1] = 1  # row 2: token 32
    logits = torch.zeros(3, vocab_size)
    apply_token_bitmask_inplace(logits, bitmask, rows=[0, 2])
    assert torch.isfinite(logits[0]).nonzero().view(-1).tolist() == [0, 2]
    assert torch.isfinite(logits[1]).all()
    assert torch.isfinite(logits[2]).nonzero().view(-1).tolist() == [32]
    logits = torch.zeros(3, vocab_size, dtype=torch.bfloat16)
    apply_token_bitmask_inplace(logits, bitmask)
    assert torch.isfinite(logits[1]).sum() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_apply_on_cuda():
    bitmask = allocate_token_bitmask(2, 64).zero_()
    bitmask[1, 0] = 1
    logits = torch.zeros(2, 64, device="cuda")
    apply_token_bitmask_inplace(logits, bitmask.cuda(), rows=[1])
    assert torch.isfinite(logits[1]).nonzero().view(-1).tolist() == [0]
    assert torch.isfinite(logits[0]).all()


def test_bitmask_scratch_made_in_inference_mode_works_outside_it():
    """The engine applies masks inside torch.inference_mode; a later caller outside it used to get
    'Inplace update to inference tensor outside InferenceMode'."""
    import torch

    from grammars import allocate_token_bitmask, apply_token_bitmask_inplace
    mask = allocate_token_bitmask(1, 77)
    mask[0, 1] = 0  # ban tokens 32..63
    with torch.inference_mode():
        apply_token_bitmask_inplace(torch.zeros(1, 77), mask)
    logits = torch.zeros(1, 77)
    apply_token_bitmask_inplace(logits, mask)
    assert torch.isinf(logits[0, 32:64]).all() and not torch.isinf(logits[0, :32]).any()

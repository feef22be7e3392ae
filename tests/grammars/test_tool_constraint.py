"""The tool-call constraint on the embedded model's vocabulary: random walks under its masks are valid turns."""

import json
import random

import jsonschema
import pytest
import torch

from grammars import GrammarCompiler, TokenVocabulary, schema_to_regex
from grammars.tools.formats import get_tool_format
from grammars.tools.tool_constraint import compile_tool_constraint
from grammars.tools.tool_grammar import tool_grammar
from grammars.masks.trigger_mask import trigger_masks

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


@pytest.fixture(scope="module")
def vocab(smollm_tokenizer):
    return TokenVocabulary.from_tokenizer(smollm_tokenizer, 49152)


@pytest.fixture(scope="module")
def compiler(vocab):
    with GrammarCompiler(vocab, timeout_s=60) as c:
        yield c


def make(compiler, vocab, tokenizer, fmt="hermes", mode="required", parallel=True, forced_name=None):
    grammar = tool_grammar(fmt, TOOLS, schema_to_regex, parallel, forced_name)
    trigger = trigger_masks(vocab, grammar.trigger, ()) if mode == "auto" else None
    return compile_tool_constraint(grammar, compiler, tokenizer, required=mode != "auto", trigger=trigger)


def allowed(constraint, size=49152):
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    constraint.fill(row)
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
    return set(torch.nonzero(bits.flatten()[:size]).flatten().tolist())


def walk(constraint, rng, prefix=(), limit=300, eos=2):
    """Feeds prefix (each token must be allowed), then samples uniformly among allowed tokens,
    taking forced tokens as the engine does. Returns the token ids."""
    out = []
    for token in prefix:
        assert token in allowed(constraint), f"token {token} should be allowed"
        constraint.advance(token)
        out.append(token)
    while not constraint.is_terminated() and len(out) < limit:
        forced = constraint.forced()
        if forced:
            for token in forced:
                constraint.advance(token)
            out += forced
            continue
        choices = sorted(allowed(constraint))
        assert choices, "a constraint must always allow some token"
        token = rng.choice(choices)
        constraint.advance(token)
        out.append(token)
        if token == eos:
            break
    return out


def check_calls(fmt, text, parallel):
    content, calls = get_tool_format(fmt).parse(text)
    assert calls, f"no calls parsed from {text!r}"
    assert parallel or len(calls) == 1
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    return content, calls


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_random_walks_are_valid_calls(compiler, vocab, smollm_tokenizer, fmt, parallel):
    rng = random.Random(7)
    for _ in range(4):
        constraint = make(compiler, vocab, smollm_tokenizer, fmt=fmt, parallel=parallel)
        ids = walk(constraint, rng)
        assert constraint.is_terminated(), "the walk should end inside the limit"
        text = smollm_tokenizer.decode([t for t in ids if t != 2])
        assert text.startswith(get_tool_format(fmt).open_text())
        content, _ = check_calls(fmt, text, parallel)
        assert content is None


def test_named_tool_only(compiler, vocab, smollm_tokenizer):
    rng = random.Random(3)
    for _ in range(3):
        constraint = make(compiler, vocab, smollm_tokenizer, forced_name="add", parallel=False)
        text = smollm_tokenizer.decode(walk(constraint, rng))
        _, calls = check_calls("hermes", text, parallel=False)
        assert [name for name, _ in calls] == ["add"]


def test_auto_text_then_trigger_arms_the_grammar(compiler, vocab, smollm_tokenizer):
    rng = random.Random(5)
    constraint = make(compiler, vocab, smollm_tokenizer, mode="auto", parallel=False)
    assert 2 in allowed(constraint) and constraint.finished()  # free text may end at once
    prefix = smollm_tokenizer.encode("Let me check that.\n<tool_call>", add_special_tokens=False)
    ids = walk(constraint, rng, prefix=prefix)
    text = smollm_tokenizer.decode([t for t in ids if t != 2])
    content, calls = check_calls("hermes", text, parallel=False)
    assert content.strip() == "Let me check that." and len(calls) == 1


def test_auto_never_lets_a_token_run_past_the_trigger(vocab, smollm_tokenizer):
    trigger = "<tool_call>"
    masks = trigger_masks(vocab, trigger, ())
    for k in range(len(trigger)):
        banned = {t for t in range(49152) if not (int(masks.masks[k][t >> 5]) >> (t & 31)) & 1}
        for token, piece in vocab.token_bytes.items():
            text = trigger[:k].encode() + piece
            at = text.find(trigger.encode())
            overruns = at >= 0 and at + len(trigger) < len(text)
            assert (token in banned) == overruns, (k, piece)


def test_auto_free_text_without_trigger_stays_free(compiler, vocab, smollm_tokenizer):
    constraint = make(compiler, vocab, smollm_tokenizer, mode="auto")
    for token in smollm_tokenizer.encode("The <b>weather</b> is <tool fine", add_special_tokens=False):
        assert token in allowed(constraint)
        constraint.advance(token)
    assert constraint.finished() and not constraint.is_terminated()
    assert len(allowed(constraint)) > 40000


def test_parallel_off_ends_after_one_call_and_on_allows_another(compiler, vocab, smollm_tokenizer):
    single = make(compiler, vocab, smollm_tokenizer, parallel=False)
    walk(single, random.Random(1))
    assert single.is_terminated()
    multi = make(compiler, vocab, smollm_tokenizer, parallel=True)
    rng = random.Random(1)
    while multi.calls_opened < 1 or not multi.finished():  # run the first call to its close
        forced = multi.forced()
        token = forced[0] if forced else rng.choice(sorted(allowed(multi)))
        multi.advance(token)
    separator_first = smollm_tokenizer.encode("\n<tool_call>", add_special_tokens=False)[0]
    assert allowed(multi) == {2, separator_first}


def test_rollback_restores_the_mask(compiler, vocab, smollm_tokenizer):
    constraint = make(compiler, vocab, smollm_tokenizer, mode="auto")
    rng = random.Random(2)
    prefix = smollm_tokenizer.encode("ok <tool_call>", add_special_tokens=False)
    for token in prefix:
        constraint.advance(token)
    before = allowed(constraint)
    steps = 0
    for _ in range(6):
        forced = constraint.forced()
        token = forced[0] if forced else rng.choice(sorted(allowed(constraint)))
        constraint.advance(token)
        steps += 1
    constraint.rollback(steps)
    assert allowed(constraint) == before
    constraint.rollback(len(prefix))
    assert constraint.finished() and len(allowed(constraint)) > 40000


def test_llama3_reply_opening_with_brace_must_be_a_call(compiler, vocab, smollm_tokenizer):
    constraint = make(compiler, vocab, smollm_tokenizer, fmt="llama3_json", mode="auto", parallel=False)
    first = allowed(constraint)
    brace_tokens = [t for t, p in vocab.token_bytes.items() if p.startswith(b"{")]
    assert any(t in first for t in brace_tokens) and not all(t in first for t in brace_tokens)
    brace = smollm_tokenizer.encode('{"', add_special_tokens=False)
    assert len(brace) == 1 and brace[0] in first
    text = smollm_tokenizer.decode(walk(constraint, random.Random(4), prefix=brace))
    check_calls("llama3_json", text, parallel=False)

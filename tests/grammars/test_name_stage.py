"""Name first: a call's literal opening is written while its tools' units compile (grammars/tools/name_stage.py)."""

import concurrent.futures
import json
import re

import jsonschema
import pytest

from grammar_fixtures import allowed, shared_compiler, smollm2_tokenizer, smollm2_vocabulary
from grammars import schema_to_regex
from grammars.tools.name_stage import name_stage
from grammars.tools.regex_text import leading_literal, shortest_text
from grammars.tools.tool_grammar import tool_grammar
from grammars.match.unit_union import UnitUnion
from test_grammar_units import SCHEMAS, TOOLS

GRAMMAR = tool_grammar("hermes", TOOLS, lambda s: schema_to_regex(s, free_values=True), parallel=False)
FREE = {"type": "object", "properties": {"meta": {}, "n": {"type": "integer"}}, "required": ["meta", "n"]}


def stage_of(regexes, preferred=None):
    futures = [concurrent.futures.Future() for _ in regexes]
    stage = name_stage(smollm2_vocabulary(), list(regexes), futures,
                       (preferred if preferred is not None else []).append)
    return stage, futures


def test_a_units_literal_and_a_shortest_text():
    weather = GRAMMAR.units[0]
    assert leading_literal(weather) == '\n{"name": "get_weather", "arguments": {"city":"'
    text = shortest_text(weather)
    assert re.fullmatch(weather, text) and json.loads(text)["arguments"] == {"city": ""}
    free = tool_grammar("hermes", [{"type": "function", "function": {"name": "f", "parameters": FREE}}],
                        lambda s: schema_to_regex(s, free_values=True), parallel=False).units[0]
    assert "\x01" in shortest_text(free)  # a free value: the JSON-value automaton's one token
    assert leading_literal("(a|b)c") == "" and shortest_text("x(?=y)") is None


def test_a_literal_ends_before_a_free_value():
    """A free value's HOLE byte stands for a JSON value, not for text: the stage writes up to it and
    waits there for the unit. SmolLM2 and Gemma 3 hold the byte as a token of their own, which the
    unit never allows (a stage that wrote it failed the hand-over, in a busy server's 25-tool run)."""
    free = tool_grammar("hermes", [{"type": "function", "function": {"name": "f", "parameters": FREE}}],
                        lambda s: schema_to_regex(s, free_values=True), parallel=False).units[0]
    literal = leading_literal(free)
    assert literal == '\n{"name": "f", "arguments": {"meta":'
    vocab = smollm2_vocabulary()
    hole = next(t for t, b in vocab.token_bytes.items() if b == b"\x01")
    stage, futures = stage_of([free])
    m = stage.matcher()
    written = b""
    while m.ready():
        assert hole not in allowed(m)
        options = [t for t in allowed(m) if literal.encode().startswith(written + vocab.token_bytes[t])]
        token = max(options, key=lambda t: len(vocab.token_bytes[t]))
        m.advance(token)
        written += vocab.token_bytes[token]
    rest = literal.encode()[len(written):]
    assert literal.encode().startswith(written) and rest  # it waits where a token may cross into the value
    futures[0].set_result(shared_compiler().compile_regex(free))
    assert m.ready() and hole not in allowed(m) and allowed(m)
    # the unit allows what the stage could not: tokens that cross the literal's end (`":"` where `":` is left)
    assert any(vocab.token_bytes[t].startswith(rest) and len(vocab.token_bytes[t]) > len(rest) for t in allowed(m))


def test_the_stage_allows_the_literals_prefixes_holds_at_the_end_and_hands_over():
    """Before any unit is compiled, exactly the tokens that keep the text a prefix of some tool's
    literal; at the chosen tool's literal end it is not ready and prefers that unit; once compiled,
    the unit union takes over, its masks equal to a union fed the same tokens from the start."""
    preferred = []
    stage, futures = stage_of(GRAMMAR.units, preferred)
    vocab = smollm2_vocabulary()
    m = stage.matcher()
    literals = [leading_literal(r).encode() for r in GRAMMAR.units]
    assert allowed(m) == {t for t, b in vocab.token_bytes.items() if any(lit.startswith(b) for lit in literals)}
    target = literals[2]  # add
    written = b""
    while m.ready():  # up to where a token could cross the literal's end: the unit decides those
        options = [t for t in allowed(m) if target.startswith(written + vocab.token_bytes[t])]
        token = max(options, key=lambda t: len(vocab.token_bytes[t]))
        m.advance(token)
        written += vocab.token_bytes[token]
    rest = target[len(written):]
    assert target.startswith(written) and 0 < len(rest) < 16 and preferred == [GRAMMAR.units[2]]
    units = [shared_compiler().compile_regex(r) for r in GRAMMAR.units]
    for future, unit in zip(futures, units):
        future.set_result(unit)
    assert m.ready()
    reference = UnitUnion(units).matcher()
    for token in m._tokens:
        reference.advance(token)
    assert allowed(m) == allowed(reference)
    for token in smollm2_tokenizer().encode(rest.decode() + '12,"b":-3}}\n', add_special_tokens=False):
        assert token in allowed(m)
        m.advance(token)
    assert m.is_terminated()


def test_under_a_budget_only_tools_that_surely_close_are_started_and_the_bounds_hold():
    stage, futures = stage_of(GRAMMAR.units)
    vocab = smollm2_vocabulary()
    cheapest = min(range(3), key=lambda i: stage.bounds[i][0])
    budget = stage.bounds[cheapest][0]  # room for the cheapest tool's shortest call only
    m = stage.matcher()
    tokens = allowed_under(m, budget)
    assert tokens and m.budget_forced
    for t in tokens:
        piece = vocab.token_bytes[t]
        assert any(stage.literals[i].startswith(piece) and stage.bounds[i][len(piece)] <= budget - 1
                   for i in range(3))
    assert not allowed_under(stage.matcher(), 1)
    units = [shared_compiler().compile_regex(r) for r in GRAMMAR.units]
    for i, unit in enumerate(units):  # the bound after the literal is never below the exact minimum
        matcher = unit.matcher()
        for token in smollm2_tokenizer().encode(stage.literals[i].decode(), add_special_tokens=False):
            matcher.advance(token)
        assert matcher.min_tokens() <= stage.bounds[i][len(stage.literals[i])]
        assert unit.min_tokens(unit.initial_state) <= stage.bounds[i][0]


def allowed_under(matcher, budget):
    import torch
    row = torch.zeros((smollm2_vocabulary().size + 31) // 32, dtype=torch.int32)
    matcher.fill(row, budget)
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return set(torch.nonzero(bits.flatten()[:smollm2_vocabulary().size]).flatten().tolist())


def test_no_stage_where_literals_cannot_tell_the_tools_apart():
    assert stage_of([r"\[a\]", r"\[a\]b"])[0] is None  # one literal is a prefix of the other
    assert stage_of([r" ?\[\{", r" ?\[\["])[0] is None  # mistral's optional space: no literal


@pytest.mark.parametrize("name", ["get_weather", "add"])
def test_a_call_written_through_the_stage_is_valid(name):
    """Rollback inside the stage, then a whole call, every token under the mask."""
    stage, futures = stage_of(GRAMMAR.units)
    m = stage.matcher()
    first = smollm2_tokenizer().encode("\n", add_special_tokens=False)[0]
    m.advance(first)
    m.rollback(1)
    assert allowed(m) == allowed(stage.matcher())
    for future, regex in zip(futures, GRAMMAR.units):
        future.set_result(shared_compiler().compile_regex(regex))
    arguments = {"get_weather": {"city": "Oslo"}, "add": {"a": 1, "b": 2}}[name]
    text = "\n" + json.dumps({"name": name, "arguments": arguments}, separators=(", ", ": ")) + "\n"
    text = text.replace('"arguments": {' + json.dumps(arguments)[1:-1] + "}",
                        '"arguments": ' + json.dumps(arguments, separators=(",", ":")))
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        assert token in allowed(m), text
        m.advance(token)
    assert m.is_terminated()
    jsonschema.validate(json.loads(text)["arguments"], SCHEMAS[name])


def test_the_c_split_equals_the_python_one():
    """TokenTrie.split (C) and the Python path give the same fewest-token counts, holes included."""
    from grammars.tools.name_stage import _bounds, _pieces, _trie

    vocab = smollm2_vocabulary()
    for text in (b'\n{"name": "add", "arguments": {"a":0,"b":0}}\n', b'{"meta":\x01,"n":0}', b"\x01\x01", b""):
        assert _trie(vocab).split(text, 1) == _bounds(text, _pieces(vocab))


def test_tokens_at_finds_every_token_text_the_literal_starts_with():
    """tokens_at looks only as far as the longest token with the literal's two bytes at k, and finds
    what a look-up of every length finds (ids grouped as the vocabulary's pieces)."""
    stage, _ = stage_of(GRAMMAR.units)
    pieces = stage.pieces
    longest = max(map(len, pieces))
    for i, literal in enumerate(stage.literals):
        for k in range(len(literal)):
            every = tuple((end, pieces[literal[k:end]]) for end in range(k + 1, min(len(literal), k + longest) + 1)
                          if literal[k:end] in pieces)
            assert stage.tokens_at(i, k) == every
            assert every  # a text literal: some token starts it at every byte

"""Free-form values (`{}`, `{"type": "object"}`, arrays without item schema) as holes that the shared
JSON-value automaton fills: small regexes, any depth, the tokenizer's own tokens across the holes."""

import json
import random

import jsonschema
import pytest

from grammar_fixtures import allowed, decode_within, shared_compiler, smollm2_tokenizer, smollm2_vocabulary
from grammars import schema_to_regex
from grammars.schema.free_values import HOLE_REGEX
from grammars.match.hole_matcher import HoleMatcher
from grammars.tools.formats import get_tool_format
from grammars.tools.tool_constraint import compile_tool_constraint
from grammars.tools.tool_grammar import tool_grammar

SCHEMA = {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 10},
    "metadata": {"type": "object", "additionalProperties": True},
    "tags": {"type": "array", "items": {}},
    "options": {"type": "object"},
    "limit": {"type": "integer"}}, "required": ["query", "metadata"], "additionalProperties": False}
ANY = {}



@pytest.fixture(scope="module")
def grammar():
    return shared_compiler().compile_regex(schema_to_regex(SCHEMA, free_values=True))


def test_free_values_are_holes_not_regexes():
    regex = schema_to_regex(SCHEMA, free_values=True)
    assert regex.count(r"\x01") == 6 and len(regex) < 600  # without holes: tens of thousands of characters
    assert len(schema_to_regex(SCHEMA)) > 20000
    assert schema_to_regex(ANY, free_values=True) == r"\x01"
    fixed = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}
    assert HOLE_REGEX not in schema_to_regex(fixed, free_values=True)


@pytest.mark.parametrize("text", [
    '{"query":"q","metadata":{}}',
    '{"query":"weather","metadata":{"user":{"id":7,"tags":["a","b"],"deep":[[[[[[[[[[1]]]]]]]]]]},"x":null},'
    '"tags":[1,"two",{"three":3.5e+2},[],true],"options":{"k":"v"},"limit":-3}',
    '{"query":"é ü","metadata":{"text":"日本語 \\"quoted\\" \\\\ done","n":0.25}}',
])
def test_the_tokenizers_own_encoding_is_allowed_token_by_token(grammar, text):
    matcher = grammar.matcher()
    assert isinstance(matcher, HoleMatcher)
    tokens = smollm2_tokenizer().encode(text, add_special_tokens=False)
    for i, token in enumerate(tokens):
        piece = smollm2_tokenizer().decode(tokens[:i + 1])
        assert token in allowed(matcher), f"token {i} ({smollm2_tokenizer().decode([token])!r}) refused after {piece!r}"
        assert matcher.accepts(token)
        matcher.advance(token)
    assert matcher.finished()
    eos = min(smollm2_vocabulary().eos_token_ids)
    assert eos in allowed(matcher)
    matcher.rollback(len(tokens))
    assert allowed(matcher) == allowed(grammar.matcher())


@pytest.mark.parametrize("text", ['{"query":"q","metadata":[]}', '{"query":"q","metadata":{"a":}}',
                                  '{"query":"q","metadata":{"a":1},"tags":{"x":1}}',
                                  '{"query":"q","metadata":{"a":1}}}'])
def test_invalid_texts_are_refused(grammar, text):
    matcher = grammar.matcher()
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        if token not in allowed(matcher):
            return
        matcher.advance(token)
    assert not matcher.finished(), f"{text!r} was accepted"


@pytest.mark.parametrize("seed", range(8))
def test_random_outputs_are_valid_against_the_schema(grammar, seed):
    """Random logits under the masks (a budget of 80 tokens more than the shortest output makes
    every walk end): each output is valid against the original schema."""
    matcher = grammar.matcher()
    ids = decode_within(matcher, matcher.min_tokens() + 80, random.Random(seed), favour=[])
    assert matcher.finished()
    text = smollm2_tokenizer().decode([t for t in ids if t not in smollm2_vocabulary().eos_token_ids])
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("slack", [0, 3, 12])
def test_budgets_close_free_values_in_time(grammar, slack):
    """With the budget at the shortest output + slack, random outputs that favour opening brackets
    and string text still close validly in time."""
    tokenizer = smollm2_tokenizer()
    favour = [t for t in range(49152) if tokenizer.decode([t]) in ("{", "[", '{"', '["', "a", "[[", "{\"a\":")]
    for seed in range(6):
        matcher = grammar.matcher()
        budget = matcher.min_tokens() + slack
        ids = decode_within(matcher, budget, random.Random(seed), favour)
        assert len(ids) <= budget and matcher.finished(), tokenizer.decode(ids)
        text = tokenizer.decode([t for t in ids if t not in smollm2_vocabulary().eos_token_ids])
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_tool_with_free_form_parameters_gives_valid_calls():
    tools = [{"type": "function", "function": {"name": "search", "parameters": SCHEMA}},
             {"type": "function", "function": {"name": "log", "parameters": {"type": "object", "properties": {
                 "event": {}}, "required": ["event"]}}}]
    grammar = tool_grammar("hermes", tools, lambda s: schema_to_regex(s, free_values=True), parallel=True)
    for seed in range(2):
        constraint = compile_tool_constraint(grammar, shared_compiler(), smollm2_tokenizer(), required=True)
        out = decode_within(constraint, constraint.min_tokens() + 80, random.Random(seed), favour=[])
        assert constraint.closed()
        text = smollm2_tokenizer().decode(out, skip_special_tokens=False).replace("<|im_end|>", "")
        _, calls = get_tool_format("hermes").parse(text)
        assert calls
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), tools[0 if name == "search" else 1]["function"]["parameters"])


def test_a_budget_already_short_at_a_hole_still_allows_the_nearest_value():
    """At a unit state where a value starts, with fewer tokens left than the value and the rest
    need, the mask is the value's nearest ends, never empty (an empty row made argmax pick token 0,
    and the request failed: BFCL's RoutingNodesChangedObserver.shardInitialized at slack 0)."""
    import torch

    tokenizer = smollm2_tokenizer()
    matcher = shared_compiler().compile_regex(schema_to_regex({"type": "object", "properties": {"a": {}}, "required": ["a"]},
                                                              free_values=True)).matcher()
    for token in tokenizer.encode('{"a":', add_special_tokens=False):
        matcher.advance(token)
    assert matcher.tables.is_hole(matcher.unit.state) and matcher.min_tokens() > 1
    row = torch.zeros(1536, dtype=torch.int32)
    matcher.fill(row, budget=1)
    assert bool(row.any())
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
    assert set(torch.nonzero(bits.flatten()[:49152]).flatten().tolist()) <= allowed(matcher)


def test_masks_inside_a_value_nested_deeper_than_a_token_can_leave_are_memoised(grammar, monkeypatch):
    """Past _EXIT_DEPTH open containers no token leaves the value, so its mask is the automaton's own:
    memoised under the automaton's key (it was rebuilt at every such step, ~300 µs each)."""
    tokens = smollm2_tokenizer().encode('{"query":"q","metadata":{"d":[[[[[[[1,[2,{"k":[3]}]]]]]]]]}}',
                                        add_special_tokens=False)

    def walk() -> list[set[int]]:
        matcher, masks = grammar.matcher(), []
        for token in tokens:
            masks.append(allowed(matcher))
            matcher.advance(token)
        return masks

    first = walk()
    tables = grammar.hole_tables()
    built, build = [], tables._row
    monkeypatch.setattr(tables, "_row", lambda *args, **kw: built.append(1) or build(*args, **kw))
    assert walk() == first and not built  # every mask of the second walk memoised, the deep ones too
    tables.memo.clear()
    assert walk() == first and built  # and the memoised masks are those built afresh


def test_the_memoised_safe_budgets_say_what_narrows_says(grammar):
    """sparse_mask(budget) reads one memoised threshold per state where it asked narrows() (several
    lookups) before: inside a value (HoleTables.value_entry; deeper than a token can leave, HoleMatcher's
    _deep_safe) and in a unit (BudgetTable.safe_budget).
    At every step of a text through values and units, for every budget, the two agree; and the
    thresholds narrows() reads agree with whether the narrowed row exists (the automaton's
    budget_row, the unit's _budget_mask), which narrows() no longer makes; in a unit, narrows() says
    what its parts say."""
    text = ('{"query":"weather","metadata":{"user":{"id":7,"tags":["a","b"],"deep":[[[[[[1]]]]]]},"x":null},'
            '"tags":[1,"two",{"three":3.5e+2},[],true],"options":{"k":"v"},"limit":-3}')
    matcher, checked = grammar.matcher(), set()
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        if matcher.value is not None:
            safe = matcher.tables.value_entry(matcher.value, matcher.hole)[2]
            if safe is None:  # past EXIT_DEPTH the entry serves every depth: HoleMatcher works this depth's out
                checked.add("deep")
                safe = matcher._deep_safe()
            else:
                checked.add("value")
            assert [b < safe for b in range(-2, 90)] == [matcher.narrows(b) for b in range(-2, 90)]
            value, automaton = matcher.value, matcher.tables.automaton
            own = automaton.safe_budget(value.q, value.frame)
            assert [b < own for b in range(-2, 90)] == [
                automaton.budget_row(value.q, value.frame, b) is not None for b in range(-2, 90)]
        elif not matcher.unit.eos_taken:
            checked.add("unit")
            safe = grammar.budget.safe_budget(matcher.unit.state)
            assert [b < safe for b in range(-2, 90)] == [matcher.unit.narrows(b) for b in range(-2, 90)]
            assert [b < safe for b in range(-2, 90)] == [matcher.unit._budget_mask(b) is not None for b in range(-2, 90)]
            near = matcher.tables.near_hole(matcher.unit.state)
            checked.add("near a hole" if near else "unit")
            assert [_narrows_by_parts(matcher, b) for b in range(-2, 90)] == [matcher.narrows(b) for b in range(-2, 90)]
        matcher.advance(token)
    assert checked == {"value", "deep", "unit", "near a hole"}


def _narrows_by_parts(matcher, budget: int) -> bool:
    """HoleMatcher.narrows in a unit, from its parts (HoleTables.unit_safe memoises one threshold):
    the unit's own budget, a value that must fit where one starts, the entering tokens' rests."""
    tables, state = matcher.tables, matcher.unit.state
    if matcher.unit.narrows(budget):
        return True
    if not tables.near_hole(state):
        return False
    if tables.is_hole(state):
        room = budget - matcher.grammar.min_tokens(tables.hole_after(state))
        if room < 1 or room < tables.automaton.safe_budget(*tables.automaton.initial("value")):
            return True
    return tables.entering(state)[1] > budget - 1


@pytest.mark.parametrize("budget", [90, 3])
def test_priming_makes_the_first_mask_and_leaves_the_constraint_as_it_was(grammar, budget):
    """server/generation.py prime(): the first step's mask is made before the request is submitted;
    the engine's first ask then gets that same memoised mask (where the budget narrows it, the
    second ask's), and the constraint's state and budget flag are as a fresh one's."""
    from server.generation import prime

    primed, fresh = grammar.matcher(), grammar.matcher()
    prime(primed, budget)
    assert primed.state == fresh.state and primed.budget_forced is False
    first = primed.sparse_mask(budget)
    assert first is not None and first is primed.sparse_mask(budget)
    assert allowed(primed) == allowed(fresh)
    if budget == 90:  # not narrowed: the state's own memoised mask, its address made
        assert first._address is not None

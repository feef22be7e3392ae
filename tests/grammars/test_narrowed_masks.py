"""Budget-narrowed masks as SparseMasks (grammars/masks/second_ask.py): from its second ask on
(from the first where it is made from id lists), sparse_mask(budget) gives what fill(row, budget)
allows, for every kind of constraint, at every step and budget of a walk, without a fill."""

import numpy as np
import pytest
import torch

from grammar_fixtures import shared_compiler, smollm2_tokenizer, smollm2_vocabulary
from grammars import schema_to_regex
from grammars.json_value.json_value_matcher import JsonValueMatcher
from grammars.masks.second_ask import SecondAsk
from grammars.masks.sparse_mask import sparse_mask
from grammars.tools.tool_constraint import compile_tool_constraint
from grammars.tools.tool_grammar import tool_grammar
from grammars.match.unit_union import _UNION_CACHE

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"},
    "meta": {"type": "object", "additionalProperties": True}, "tags": {"type": "array", "items": {}}},
    "required": ["city", "meta"], "additionalProperties": False}
ARGUMENTS = '{"city":"Oslo","days":3,"meta":{"user":{"id":7,"seen":[1,"two",null]},"k":"v"},"tags":[true,[]]}'
DEEP = '{"city":"Oslo","meta":{"a":{"b":[[{"c":[[{"d":"e"}]]}]]}},"tags":[[[[[[1]]]]]]}'  # past EXIT_DEPTH


def test_second_ask_builds_the_sparse_form_once_on_the_second_ask():
    vocab = smollm2_vocabulary()
    row = torch.zeros((vocab.size + 31) // 32, dtype=torch.int32)
    row[0] = 0b1010  # tokens 1 and 3
    made = []
    memo = SecondAsk(vocab.size)
    assert memo.get("k", lambda: made.append(1) or row) is None and not made  # first ask: no row made
    got = memo.get("k", lambda: made.append(1) or row)
    assert got.allowed and got.array.tolist() == [1, 3] and made == [1]
    assert memo.get("k", lambda: made.append(1) or row) is got and made == [1]
    assert memo.held_bytes() >= got.array.nbytes
    memo.put("shared", lambda: got)  # a list under two keys is held, and counted, once
    assert memo.get("shared", lambda: row) is got and memo.held_bytes() == 200 + got.array.nbytes
    counted = {id(got)}  # counted already by another memo
    assert memo.held_bytes(counted) == 200



def test_a_mask_two_threads_make_at_once_is_one_object_to_both():
    """The compiler's background thread asks the memos the engine asks (grammars/match/narrowed_ahead.py). Where
    both make one key's mask at once, both read the one kept: masks are named by the objects themselves in
    other memos' keys, and a copy dropped by its memo must not be handed out."""
    size = smollm2_vocabulary().size
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    row[0] = 0b1010
    memo, other = SecondAsk(size), []
    assert memo.get("k", lambda: row) is None  # the first ask

    def racing_row():  # the other thread's second ask completes while this one builds
        if not other:
            other.append(memo.get("k", lambda: row))
        return row
    got = memo.get("k", racing_row)
    assert got is other[0] and memo.get("k", lambda: row) is got
    made = sparse_mask(row, size)
    fresh = SecondAsk(size)
    first = fresh.get("j", lambda: row, lambda: (fresh.put("j", lambda: made), sparse_mask(row, size))[1])
    assert first is made and fresh.get("j", lambda: row) is made  # a list put meanwhile is the one read

def _constraints():
    """(name, fresh constraint, the token ids of a valid text for it)."""
    tokenizer, compiler = smollm2_tokenizer(), shared_compiler()
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    plain = compiler.compile_json_schema({"type": "object", "properties": {
        "city": SCHEMA["properties"]["city"], "days": SCHEMA["properties"]["days"]},
        "required": ["city"], "additionalProperties": False})
    yield "unit", plain.matcher(), encode('{"city":"Oslo","days":3}')
    yield "holes", compiler.compile_json_schema(SCHEMA).matcher(), encode(ARGUMENTS)
    yield "deep", compiler.compile_json_schema(SCHEMA).matcher(), encode(DEEP)
    yield "json", JsonValueMatcher(compiler.json_automaton(), "object"), encode(ARGUMENTS)
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": SCHEMA}}]
    constraint = compile_tool_constraint(tool_grammar("hermes", tools, schema_to_regex, True, None), compiler,
                                         tokenizer, required=True)
    yield "tool", constraint, encode('<tool_call>\n{"name": "forecast", "arguments": ' + ARGUMENTS + '}\n</tool_call>')
    tools.append({"type": "function", "function": {"name": "forecast_hourly", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    constraint = compile_tool_constraint(tool_grammar("hermes", tools, schema_to_regex, True, None), compiler,
                                         tokenizer, required=True)  # two units live through `forecast`
    yield "union", constraint, encode('<tool_call>\n{"name": "forecast_hourly", "arguments": {"city":"Oslo"}}\n</tool_call>')


def _assert_is_the_fill(mask, constraint, budget, row, name):
    """``mask`` allows what constraint.fill(row, budget) allows (row: int32 [W], scratch)."""
    constraint.fill(row, budget)
    expected = sparse_mask(row, mask.vocab_size)
    assert expected is not None and mask.allowed == expected.allowed, (name, budget)
    assert np.array_equal(mask.array, expected.array), (name, budget)


@pytest.mark.parametrize("case", range(6))
def test_narrowed_sparse_masks_allow_what_the_budget_fill_allows(case):
    name, constraint, tokens = list(_constraints())[case]
    size = smollm2_vocabulary().size
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    narrowed = first_asks = 0
    for token in tokens:
        whole = constraint.sparse_mask()
        for budget in range(1, 40):
            first = constraint.sparse_mask(budget)  # the first ask: an id list only where made without a row
            got = constraint.sparse_mask(budget)
            for mask in (first, got):
                if mask is not None:
                    _assert_is_the_fill(mask, constraint, budget, row, name)
            narrowed += got is not None and got is not whole
            first_asks += first is not None and first is not whole
        constraint.advance(token)
    assert narrowed >= 20, name  # budgets narrowed masks on many steps, and those came as SparseMasks
    assert first_asks >= 20, name  # and made from id lists on the first ask, with no row
    if name == "union":
        assert any(key[0] == "budget" for key in _UNION_CACHE)  # narrowed while two units were live


@pytest.mark.parametrize("text", [ARGUMENTS, DEEP])
def test_a_values_narrowed_masks_are_kept_per_rung_and_are_the_fills(text, monkeypatch):
    """Inside a value a budget narrows the mask through two cuts only, its rung (grammars/json_value/value_rungs.py).
    Asked as the engine asks, one less a step, each mask is what fill(row, budget) allows, and every
    budget of one rung reads the one mask kept for it; a later request, asking in another order, reads
    the masks the first one made, and makes none."""
    import grammars.match.hole_matcher as hole_matcher
    from grammars.json_value.value_rungs import position, rung

    grammar = shared_compiler().compile_json_schema(SCHEMA)
    tokens = smollm2_tokenizer().encode(text, add_special_tokens=False)
    size = smollm2_vocabulary().size
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)

    def walk(budgets) -> dict:
        matcher, made = grammar.matcher(), {}
        for at, token in enumerate(tokens):
            kept: dict = {}
            for budget in budgets:
                if matcher.value is None or not matcher.narrows(budget):
                    continue
                mask = first = matcher.sparse_mask(budget)
                mask = matcher.sparse_mask(budget) if mask is None else mask  # a row's list from the second ask on
                if mask is not None:
                    _assert_is_the_fill(mask, matcher, budget, row, text)
                    assert kept.setdefault(rung(position(matcher), budget), mask) is mask, budget
                made[at, budget] = first
            matcher.advance(token)
        return made

    first = walk(range(39, 0, -1))
    from_ids = {at: mask for at, mask in first.items() if mask is not None}
    assert len(from_ids) >= 20 and len(set(map(id, from_ids.values()))) < len(from_ids)  # rungs shared by budgets
    calls = []
    monkeypatch.setattr(hole_matcher, "budget_ids", lambda *args: calls.append(args) or None)
    again = walk(range(1, 40))
    assert all(again[at] is mask for at, mask in from_ids.items()) and len(calls) <= len(first) - len(from_ids)


def test_a_values_masks_that_read_nothing_of_its_unit_are_shared_by_every_grammar():
    """Deeper than a token can leave a value, its narrowed mask reads nothing of the unit but whether the
    unit may end after it (grammars/json_value/value_rungs.py): another grammar's request, through the same text,
    reads the masks the first grammar's request made (each the fill there), kept by the automaton."""
    from grammars.json_value.value_exits import EXIT_DEPTH

    compiler = shared_compiler()
    other = dict(SCHEMA, properties=dict(SCHEMA["properties"], note={"type": "boolean"}))  # another unit
    tokens = smollm2_tokenizer().encode(DEEP, add_special_tokens=False)
    size = smollm2_vocabulary().size
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)

    def walk(schema) -> dict:
        matcher, made = compiler.compile_json_schema(schema).matcher(), {}
        for at, token in enumerate(tokens):
            deep = matcher.value is not None and matcher.value.frame.depth > EXIT_DEPTH
            for budget in range(30, 0, -1):
                if deep and matcher.narrows(budget):
                    mask = matcher.sparse_mask(budget)
                    if mask is not None:
                        _assert_is_the_fill(mask, matcher, budget, row, schema)
                    made[at, budget] = mask
            matcher.advance(token)
        return made

    first, again = walk(SCHEMA), walk(other)
    shared = [at for at, mask in first.items() if mask is not None]
    assert len(shared) >= 20 and all(again[at] is first[at] for at in shared)


@pytest.mark.parametrize("case", range(6))
def test_the_last_asks_kept_by_the_matchers_follow_detours_and_rollbacks(case):
    """Matcher, JsonValueMatcher and HoleMatcher keep the last state's safe budget and whole mask
    (``_here``). After a detour (another allowed token) and its rollback, and at every step, the masks
    asked are still what fill(row, budget) allows, whether asked where the detour began or only after
    the next real token: the kept answer is only read where it was made."""
    name, constraint, tokens = list(_constraints())[case]
    size = smollm2_vocabulary().size
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    eos = set(smollm2_vocabulary().eos_token_ids)

    def check():
        for budget in (None, 2, 6, 40):
            for _ in range(2):  # the second ask gets an id list where a first one had none
                mask = constraint.sparse_mask(budget)
            if mask is not None:
                _assert_is_the_fill(mask, constraint, budget, row, name)

    def whole_after(token):
        constraint.advance(token)
        constraint.fill(row, None)
        constraint.rollback(1)
        return row.clone()

    detours = 0
    for i, token in enumerate(tokens):
        check()
        if i % 3 == 1:  # a detour to a state whose mask differs from the next one's: a kept answer read
            constraint.fill(row, None)  # there would be wrong after the rollback and the real token
            bits = np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:size]
            after = whole_after(token)
            others = [int(t) for t in np.flatnonzero(bits)[:200] if t != token and t not in eos]
            other = next((t for t in others if not torch.equal(whole_after(t), after)), None)
            if other is not None:
                constraint.advance(other)
                check()
                constraint.rollback(1)
                detours += 1
                if detours % 2:  # asked where the detour began; else next after the real token (below)
                    check()
        constraint.advance(token)
    assert detours >= 3, name


def test_the_narrowed_masks_made_with_the_grammar_are_the_budget_fills(monkeypatch):
    """grammars/match/narrowed_ahead.py warm_narrowed makes the narrowed id lists of a grammar's unit states
    and of the value states whose whole masks are made ahead (those per rung: grammars/json_value/value_rungs.py),
    at every budget that narrows them (up to a bound). Each is what fill(row, budget) allows there, and
    the first ask of a request there reads it."""
    import grammars.match.hole_matcher as hole_matcher
    from grammars.match.grammar import CompiledGrammar
    from grammars.match.hole_matcher import HoleMatcher
    from grammars.json_value.hole_tables import _ENDINGS, _STACKS, HoleTables, value_at
    from grammars.match.narrowed_ahead import warm_narrowed

    compiled = shared_compiler().compile_json_schema(SCHEMA)
    grammar = CompiledGrammar(compiled.index, compiled.regex, compiled.vocabulary, compiled.key, compiled.budget)
    tables = grammar.hole_tables()  # fresh memos
    assert not tables.narrowed._memo
    held = grammar.held_bytes()
    assert warm_narrowed(grammar, tables) > 0  # within its bound
    assert grammar.held_bytes() >= held + 100 * len(tables.narrowed)  # counted again once entries were added
    made = dict(tables.narrowed._memo)
    size = smollm2_vocabulary().size
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)

    def is_the_fill(mask, matcher, budget):
        matcher.fill(row, budget)
        expected = sparse_mask(row, size)
        assert expected is not None and mask.allowed == expected.allowed, (matcher.state, budget)
        assert np.array_equal(mask.array, expected.array), (matcher.state, budget)

    kinds = set()
    for (state, budget), mask in made.items():
        unit_state, value_state, hole = state
        assert value_state is None  # a value's are kept per rung
        matcher = HoleMatcher(grammar, tables)
        matcher.unit.place(unit_state)
        assert matcher.state == state
        kinds.add("hole" if tables.is_hole(unit_state) else "near" if tables.near_hole(unit_state) else "unit")
        assert matcher.sparse_mask(budget) is mask  # the first ask reads it
        is_the_fill(mask, matcher, budget)
    assert kinds == {"hole", "near", "unit"} and len(made) > 100
    monkeypatch.setattr(hole_matcher, "rung_ids", lambda *args: None)  # a request's ask makes no list
    values = 0
    for hole in sorted(tables.holes):
        for place in [(q, stack) for q in _ENDINGS for stack in _STACKS]:
            matcher = HoleMatcher(grammar, tables)
            matcher.unit.place(hole)
            matcher.value, matcher.hole = value_at(tables, *place), hole
            for budget in range(max(1, matcher.min_tokens()), tables.value_entry(matcher.value, hole)[2]):
                mask = matcher.sparse_mask(budget)
                if mask is not None:
                    values += 1
                    is_the_fill(mask, matcher, budget)
    assert values > 400
    bounded = CompiledGrammar(compiled.index, compiled.regex, compiled.vocabulary, compiled.key, compiled.budget)
    bounded._holes.append(HoleTables(bounded, tables.automaton))
    bounded._holes[0].prepare()
    assert warm_narrowed(bounded, bounded._holes[0], most=50) <= 0  # the bound holds
    assert 0 < len(bounded._holes[0].narrowed._memo) <= 50


def test_a_units_budget_cuts_are_merged_with_the_grammar(monkeypatch):
    """grammars/match/narrowed_ahead.py warm_budget_cuts (GrammarCompiler runs it after each compile): the
    merged id lists of every state's budget cuts are made ahead, so a narrowed first ask near a
    budget's end merges nothing, and each is what fill(row, budget) allows."""
    import grammars.masks.sparse_mask as sparse_mask_module
    from grammars.match.grammar import CompiledGrammar
    from grammars.match.narrowed_ahead import warm_budget_cuts

    compiled = shared_compiler().compile_json_schema({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False})
    grammar = CompiledGrammar(compiled.index, compiled.regex, compiled.vocabulary, compiled.key,
                                               compiled.budget)
    assert warm_budget_cuts(grammar) > 10
    held = grammar.held_bytes()
    assert held >= grammar.approx_bytes + sum(mask.array.nbytes for mask in grammar._kept.values())

    def no_merge(*args, **kwargs):
        raise AssertionError("a narrowed first ask merged id lists")

    monkeypatch.setattr(sparse_mask_module, "_merged", no_merge)
    size = smollm2_vocabulary().size
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    matcher, first_asks = grammar.matcher(), 0
    for token in smollm2_tokenizer().encode('{"city":"Bergen","days":12,"unit":"C"}', add_special_tokens=False):
        for budget in range(1, 30):
            mask = matcher.sparse_mask(budget)
            if mask is None or not matcher.narrows(budget):
                continue
            first_asks += 1
            matcher.fill(row, budget)
            expected = sparse_mask(row, size)
            assert mask.allowed == expected.allowed and np.array_equal(mask.array, expected.array), budget
        matcher.advance(token)
    assert first_asks >= 50

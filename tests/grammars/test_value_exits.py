"""grammars/json_value/value_exits.py: a value's leaving tokens (the vocabulary's exits by value state, their rests
walked sorted through the unit) and a unit state's entering tokens are exactly those the byte-by-byte
walk of each candidate token finds (run()), with the same fewest tokens left after each."""

import numpy as np
import pytest

from grammar_fixtures import shared_compiler, smollm2_vocabulary
from grammars import schema_to_regex
from grammars.json_value.hole_bytes import bytes_view
from grammars.json_value.hole_crossings import entering_fit, leaving_fit
from grammars.json_value.json_value_lexer import AFTER, ARRAY, COMPLETE, FIRST_BYTES, NUM_STATES, OBJECT, S_BASE, VALUE
from grammars.json_value.value_exits import EXIT_DEPTH, value_exits

SCHEMAS = [
    {"type": "object", "properties": {"query": {"type": "string"}, "metadata": {"type": "object"},
                                      "tags": {"type": "array", "items": {}}, "limit": {"type": "integer"}},
     "required": ["query", "metadata"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {}, "b": {}, "c": {"type": "object"}}, "required": ["a", "b", "c"],
     "additionalProperties": False},  # values side by side: a token may leave one and enter the next
    {},  # the whole output one value: after it only the end
    {"type": "object", "properties": {"n": {"anyOf": [{}, {"type": "string"}]}, "m": {}}, "required": ["n", "m"],
     "additionalProperties": False},  # a hole where the unit goes on by `"` too: run() walks those tokens
]
STACKS = [(), (OBJECT,), (ARRAY,), (OBJECT, ARRAY), (ARRAY, OBJECT, ARRAY), (OBJECT,) * EXIT_DEPTH]


def by_candidates(tables, value_state, hole) -> dict[int, int]:
    """Every token holding `,`, `}` or `]` that may start there, walked by run(): token -> least after it."""
    view = bytes_view(smollm2_vocabulary())
    q, stack = value_state
    firsts = set(FIRST_BYTES[q]) | (set(tables.edges.get(tables.hole_after(hole), ())) if q in COMPLETE else set())
    need = 1 if q >= S_BASE else 0
    out = {}
    for b in firsts:
        for token in view.leaving.get(b, ()):
            if view.closers[token] < len(stack) or view.quotes.get(token, 0) < need:
                continue
            found = tables.run(-1, value_state, hole, tables.token_bytes[token])
            if found is not None and found[0]:  # the value ended inside it and the unit went on
                out[token] = tables.least(found[1])
    return out


def agree(listed: tuple[list[int], int], costs, expected: dict[int, int], fit_at) -> None:
    """HoleTables' (tokens, the most left after any) and (ids, least after each) say what ``expected`` says,
    and so does ``fit_at(limit)`` (the tokens after which at most ``limit`` are left) at every limit: one
    read-only array for limits that keep the same tokens."""
    tokens, worst = listed
    assert set(tokens) == set(expected) and worst == max(expected.values(), default=0)
    assert dict(zip(costs[0].tolist(), costs[1].tolist())) == expected
    made = {}
    for limit in range(-1, worst + 2):
        fit = fit_at(limit)
        kept = frozenset(t for t, least in expected.items() if least <= limit)
        assert set(fit.tolist()) == kept and len(fit) == len(kept) and not fit.flags.writeable
        assert made.setdefault(kept, fit) is fit


@pytest.mark.parametrize("schema", range(len(SCHEMAS)))
def test_leaving_tokens_are_those_each_walked_alone_finds(schema):
    grammar = shared_compiler().compile_regex(schema_to_regex(SCHEMAS[schema], free_values=True))
    tables = grammar.hole_tables()
    holes = sorted(tables.holes)
    assert holes
    compared = leaving = 0
    for hole in holes:
        for stack in STACKS:
            for q in range(NUM_STATES):
                expected = by_candidates(tables, (q, stack), hole)
                agree(tables.leaving((q, stack), hole), tables.leaving_costs((q, stack), hole), expected,
                      lambda limit: leaving_fit(tables, (q, stack), hole, limit))
                compared += 1
                leaving += len(expected)
    assert compared >= NUM_STATES * len(STACKS)
    assert leaving > 10 if SCHEMAS[schema] else leaving == 0  # {}: nothing follows the value


def test_value_states_with_the_same_exits_share_one_walk():
    """Value states whose exits are the same tokens share one list object (ValueExits.exits), and their
    leaving entries are that list's one walk in the unit (hole_crossings.leaving): the same objects, held
    once in the grammar's memory count. (Each is checked against a walk of its own token by token above.)"""
    from grammars.json_value.hole_tables import HoleTables

    grammar = shared_compiler().compile_regex(schema_to_regex(SCHEMAS[0], free_values=True))
    tables = HoleTables(grammar, grammar.hole_tables().automaton)  # a fresh memo
    tables.prepare()
    exits, hole = tables.exits, min(tables.holes)
    states = [(q, stack) for stack in STACKS for q in range(NUM_STATES)]
    groups: dict[int, list] = {}
    for state in states:
        groups.setdefault(id(exits.exits(*state)), []).append(state)
    assert len({exits.exits(*state) for state in states}) == len(groups)  # equal lists: one object
    shared = [group for group in groups.values() if len(group) > 1]
    assert len(shared) >= 3 and len(groups) < len(states) / 2
    for group in shared:
        first, costs = tables.leaving(group[0], hole), tables.leaving_costs(group[0], hole)
        held = tables.held_bytes()
        for state in group[1:]:
            assert tables.leaving(state, hole) is first and tables.leaving_costs(state, hole) is costs
        assert tables.held_bytes() == held


def by_run(tables, state) -> dict[int, int]:
    """Every token that may enter a value from unit ``state``, walked by run(): token -> least after it."""
    view = bytes_view(smollm2_vocabulary())
    candidates = [t for b in tables.edges.get(state, {}) for t in view.entering.get(b, ())]
    if tables.is_hole(state):
        candidates += [t for b in FIRST_BYTES[VALUE] for t in view.leaving.get(b, ())]
    out = {}
    for token in candidates:
        found = tables.run(state, None, -1, tables.token_bytes[token])
        if found is not None and (found[1][0] == "value" or tables.sentinel in found[0]):
            out[token] = tables.least(found[1])
    return out


@pytest.mark.parametrize("schema", range(len(SCHEMAS)))
def test_entering_tokens_are_those_each_walked_alone_finds(schema):
    grammar = shared_compiler().compile_regex(schema_to_regex(SCHEMAS[schema], free_values=True))
    tables = grammar.hole_tables()
    entering = 0
    for state in range(grammar.index.n_states):
        expected = by_run(tables, state)
        agree(tables.entering(state), tables.entering_costs(state), expected,
              lambda limit: entering_fit(tables, state, limit))
        entering += len(expected)
    assert entering > (20 if SCHEMAS[schema] else 10)  # {}: only tokens that stay in the value
    if schema == 3:
        assert any(b in tables.edges[hole] for hole in tables.holes for b in FIRST_BYTES[VALUE])


def test_exits_are_sorted_by_rest_with_their_shared_prefixes():
    exits = value_exits(smollm2_vocabulary()).exits(AFTER, (OBJECT,))  # after a member's value: `},`, `}]`, `}}`
    assert len(exits.tokens) > 5 and list(exits.rests) == sorted(exits.rests) and all(exits.rests)
    for before, rest, shared in zip(exits.rests, exits.rests[1:], exits.shared[1:]):
        assert before[:shared] == rest[:shared] and (shared == min(len(before), len(rest)) or before[shared] != rest[shared])


def test_a_value_mask_is_an_id_list_from_its_first_ask_with_no_row():
    """A value state's id list is the automaton's, changed by EOS and the leaving tokens, on its first
    ask and without a row; it equals the conversion of the row value_mask makes later, for both sides
    of the mask."""
    from grammars.json_value.hole_tables import value_at
    from grammars.json_value.json_value_lexer import S_BODY
    from grammars.masks.sparse_mask import sparse_mask

    grammar = shared_compiler().compile_regex(schema_to_regex({"type": "object", "properties": {
        "note": {"type": "object"}}, "required": ["note"], "additionalProperties": False}, free_values=True))
    tables = grammar.hole_tables()
    hole = min(tables.holes)
    sides = set()
    for q in (S_BODY, AFTER):  # in a string in the value: `"}}` leaves it (banned side); after a member: `}}`
        value = value_at(tables, q, (OBJECT,))
        row, sparse, _ = tables.value_entry(value, hole)
        assert row is None and sparse is not None and tables.value_entry(value, hole)[1] is sparse
        row, again = tables.value_mask(value, hole)
        expected = sparse_mask(row, smollm2_vocabulary().size)
        assert again is sparse and sparse.allowed == expected.allowed and np.array_equal(sparse.array, expected.array)
        leaving = tables.leaving(value.state, hole)[0]  # the mask holds leaving tokens too
        assert leaving and set(leaving) <= set(np.flatnonzero(_allowed_bits(row)).tolist())
        sides.add(sparse.allowed)
    assert sides == {True, False}


def _allowed_bits(row):
    return np.unpackbits(row.numpy().view(np.uint8), bitorder="little").astype(bool)


def test_warming_the_json_automaton_makes_every_exit_list(monkeypatch):
    """GrammarCompiler.json_automaton's background warm-up makes the vocabulary's lists ahead, so a
    grammar's first visit near a hole only walks them through its unit."""
    from grammars.json_value import value_exits as module
    from grammars.json_value.json_value_cache import warm_json

    monkeypatch.setattr(module, "_EXITS", {})
    vocabulary = smollm2_vocabulary()
    warm_json(shared_compiler().json_automaton(), vocabulary, lambda: None)
    memo = module.value_exits(vocabulary)._memo
    stacks = sum(2 ** depth for depth in range(EXIT_DEPTH + 1))
    assert sum(1 for key in memo if isinstance(key[0], int)) == NUM_STATES * stacks  # (q, stack) keys
    assert ("longer", module.NEAR) in memo and ("enter", ord('"')) in memo and "starts" in memo


def test_prepare_makes_the_value_masks_a_nested_object_passes_through():
    """A grammar's first request finds made by prepare() the value masks where a value most often ends
    or passes (lexical states _ENDINGS in the stacks _STACKS; each leaving walk cost 40-280 us at a
    first visit on the request path): scanning nested objects, arrays and scalars in a hole from a
    fresh HoleTables walks none of those again."""
    from grammars.json_value.hole_tables import _ENDINGS, _STACKS, HoleTables, value_at

    grammar = shared_compiler().compile_regex(schema_to_regex(SCHEMAS[0], free_values=True))
    tables = HoleTables(grammar, grammar.hole_tables().automaton)  # a fresh memo
    tables.prepare()
    walks = sum(1 for key in tables.memo if key[0] == "leave")
    automaton, hole, seen = tables.automaton, min(tables.holes), set()
    for text in (b'{"a":{"b":{"c":1.5,"d":"x"},"e":[1,"y",true]}}', b'["p",{"q":null},-2]', b'"s"', b"12"):
        state = (VALUE, ())
        for b in text:
            state = automaton.scan(state, bytes([b]))[0]
            if state[0] in _ENDINGS and state[1] in _STACKS:
                tables.value_entry(value_at(tables, *state), hole)
                seen.add(state)
    assert len(seen) >= 16 and sum(1 for key in tables.memo if key[0] == "leave") == walks

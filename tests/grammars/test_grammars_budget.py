"""Budget-aware decoding: the distance table against brute force, and outputs that close in budget."""

import json
import random
from collections import deque

import jsonschema
import numpy as np
import outlines_core
import pytest
import torch

from engine.sampling import SamplingParams
from grammar_fixtures import decode_within, rigged_logits
from grammars.index import budget as budget_module
from grammars.index.budget import build_budget_table, budget_table_from_transitions
from grammars.index.unit_index import from_outlines
from grammars.match.grammar import CompiledGrammar
from test_tool_constraint import allowed, check_calls, compiler, make, vocab  # noqa: F401 - fixtures

SAMPLED = SamplingParams(temperature=1.0)  # the masker writes a sampled row's mask into its logits

SMALL_TOKENS = ["a", "b", "c", "ab", "bc", "abc", "{", "}", '"', '{"', '"}', "1", "12", ",", ":"]
SMALL_REGEXES = [r"a{3,7}", r"(ab|c)*abc", r"\{\"[abc]{0,4}\"(,[12]{1,3})?\}", r"(a|bc)+c?", r"[abc]{2}:[12]+",
                 r"[abc]*(\{1\}|\})"]  # last: odd tokens at two distances, the nearer one the higher id
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "days", "tags"], "additionalProperties": False}


def small_index(regex):
    eos = len(SMALL_TOKENS)
    vocabulary = outlines_core.Vocabulary(eos, {t: [i] for i, t in enumerate(SMALL_TOKENS)})
    return from_outlines(outlines_core.Index(regex, vocabulary), eos), eos


def brute_force_distance(index, eos):
    """Fewest tokens to a final state from each state, by forward BFS over every token from every state."""
    states, queue = {index.get_initial_state()}, deque([index.get_initial_state()])
    while queue:
        s = queue.popleft()
        for t in range(eos):
            n = index.get_next_state(s, t)
            if n is not None and n not in states:
                states.add(n)
                queue.append(n)
    out = {}
    for start in states:
        seen, frontier, depth = {start}, [start], 0
        while frontier and not any(index.is_final_state(s) for s in frontier):
            depth += 1
            frontier = [n for s in frontier for t in range(eos)
                        if (n := index.get_next_state(s, t)) is not None and n not in seen and not seen.add(n)]
        out[start] = depth if frontier else -1
    return out


@pytest.mark.parametrize("regex", SMALL_REGEXES)
def test_distance_table_matches_brute_force(regex):
    index, eos = small_index(regex)
    expected = brute_force_distance(index, eos)
    for table in (build_budget_table(index), budget_table_from_transitions(index)):
        assert {s: table.distance_of(s) for s in expected} == expected


@pytest.mark.parametrize("regex", SMALL_REGEXES)
@pytest.mark.parametrize("few_odd", [budget_module.FEW_ODD, -1])
def test_budget_restriction_keeps_exactly_the_tokens_that_still_fit(regex, few_odd, monkeypatch):
    """Read as Python lists (few odd tokens) and as arrays (-1: every state's through numpy): a prefix
    ("only") or a suffix ("drop") of the state's odd tokens, which are ordered by distance."""
    monkeypatch.setattr(budget_module, "FEW_ODD", few_odd)
    index, eos = small_index(regex)
    distance = brute_force_distance(index, eos)
    table = build_budget_table(index)
    for state in distance:
        allowed_tokens = {t for t in range(eos) if index.get_next_state(state, t) is not None}
        for limit in range(0, 12):
            fits = {t for t in allowed_tokens if 0 <= distance[index.get_next_state(state, t)] <= limit}
            rule = table.restriction(state, limit)
            if rule is None:
                assert fits == allowed_tokens
            else:
                kind, ids = rule
                listed = list(ids) if few_odd >= 0 else ids.tolist()
                i = table._dense[state]
                odd = table.odd_tok[table.odd_off[i]:table.odd_off[i + 1]].tolist()
                dist = table.odd_dist[table.odd_off[i]:table.odd_off[i + 1]].tolist()
                assert dist == sorted(dist)
                assert listed == (odd[len(odd) - len(listed):] if kind == "drop" else odd[:len(listed)])
                got = allowed_tokens - set(listed) if kind == "drop" else set(listed)
                assert got == fits, (state, limit)


def test_c_table_equals_python_table_on_a_real_schema(compiler):
    grammar = compiler.compile_json_schema(SCHEMA)
    fast, slow = grammar.budget, budget_table_from_transitions(grammar.index)
    order, order_slow = np.argsort(fast.keys), np.argsort(slow.keys)
    assert (fast.keys[order] == slow.keys[order_slow]).all()
    assert (fast.distance[order] == slow.distance[order_slow]).all()
    assert grammar.min_tokens(grammar.initial_state) > 5
    for state in fast.keys.tolist():  # each state's odd tokens ordered by distance in both; the same
        rows, modes = [], [table.mode[table._dense[state]] for table in (fast, slow)]  # ties may differ
        for table in (fast, slow):
            i = table._dense[state]
            lo, hi = table.odd_off[i], table.odd_off[i + 1]
            rows.append(sorted(zip(table.odd_dist[lo:hi].tolist(), table.odd_tok[lo:hi].tolist())))
            assert table.odd_dist[lo:hi].tolist() == sorted(table.odd_dist[lo:hi].tolist())
        assert rows[0] == rows[1] or modes[0] != modes[1]


def test_a_stored_table_whose_odd_tokens_are_out_of_distance_order_is_not_read():
    """A budget reads a state's odd tokens as a slice (BudgetTable.restriction): a unit file whose
    table breaks that order is a bad entry (grammars/compile/unit_file.py), not a wrong mask."""
    from grammars.compile.unit_file import _TABLE, BadEntry, _table

    index, eos = small_index(SMALL_REGEXES[-1])
    table = build_budget_table(index)
    arrays = dict(zip(_TABLE, (table.keys, table.distance, table.far, table.mode, table.odd_off, table.odd_tok,
                               table.odd_dist)))
    assert _table(arrays, eos + 1).odd_dist.tolist() == table.odd_dist.tolist()
    spread = [i for i in range(len(table.keys))
              if len(set(table.odd_dist[table.odd_off[i]:table.odd_off[i + 1]].tolist())) > 1]
    assert spread, "no state with odd tokens at two distances"
    lo, hi = table.odd_off[spread[0]], table.odd_off[spread[0] + 1]
    arrays["odd_dist"] = table.odd_dist.copy()
    arrays["odd_dist"][lo:hi] = table.odd_dist[lo:hi][::-1]
    with pytest.raises(BadEntry, match="ordered by distance"):
        _table(arrays, eos + 1)


@pytest.mark.parametrize("slack", [0, 1, 5, 20])
def test_json_schema_output_closes_within_the_budget(compiler, smollm_tokenizer, slack):
    grammar = compiler.compile_json_schema(SCHEMA)
    minimum = grammar.min_tokens(grammar.initial_state)
    favour = smollm_tokenizer.encode("abcdefgh 12345", add_special_tokens=False)
    rng = random.Random(slack)
    for _ in range(3):
        matcher = grammar.matcher()
        ids = decode_within(matcher, minimum + slack, rng, favour)
        assert len(ids) <= minimum + slack
        assert matcher.closed(), "the budget ran out before the JSON closed"
        data = json.loads(smollm_tokenizer.decode([t for t in ids if t != 2]))
        jsonschema.validate(data, SCHEMA)
        assert matcher.budget_forced or slack == 20


def test_without_a_budget_the_same_rigging_runs_long(compiler, smollm_tokenizer):
    grammar = compiler.compile_json_schema(SCHEMA)
    minimum = grammar.min_tokens(grammar.initial_state)
    favour = smollm_tokenizer.encode("abcdefgh 12345", add_special_tokens=False)
    matcher = grammar.matcher()
    row = torch.zeros(1536, dtype=torch.int32)
    rng = random.Random(0)
    for _ in range(minimum + 5):  # no budget passed: nothing makes it close
        matcher.fill(row)
        bits = ((row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:49152].bool()
        matcher.advance(int(torch.argmax(rigged_logits(rng, 49152, favour).masked_fill(~bits, float("-inf")))))
    assert not matcher.finished() and not matcher.budget_forced


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_tool_call_closes_within_the_budget(compiler, vocab, smollm_tokenizer, fmt, parallel):
    favour = smollm_tokenizer.encode("abcdefgh 12345", add_special_tokens=False)
    rng = random.Random(11)
    for slack in (0, 3, 12):
        constraint = make(compiler, vocab, smollm_tokenizer, fmt=fmt, parallel=parallel)
        minimum = constraint.min_tokens()
        ids = decode_within(constraint, minimum + slack, rng, favour)
        assert constraint.closed(), (fmt, slack)
        check_calls(fmt, smollm_tokenizer.decode([t for t in ids if t != 2]), parallel)


def test_auto_mode_does_not_open_a_call_it_cannot_close(compiler, vocab, smollm_tokenizer):
    constraint = make(compiler, vocab, smollm_tokenizer, mode="auto", parallel=False)
    for token in smollm_tokenizer.encode("Let me check.\n", add_special_tokens=False):
        constraint.advance(token)
    opener = smollm_tokenizer.encode("<tool_call>", add_special_tokens=False)
    for token in opener[:-1]:
        constraint.advance(token)
    last = opener[-1]
    call_min = constraint._call_min
    row = torch.zeros(1536, dtype=torch.int32)
    constraint.fill(row, budget=call_min)  # this token plus call_min - 1: one short of a call
    assert not (int(row[last >> 5]) >> (last & 31)) & 1
    constraint.fill(row, budget=call_min + 1)
    assert (int(row[last >> 5]) >> (last & 31)) & 1
    assert last in allowed(constraint)


def test_parallel_calls_stop_opening_when_no_further_call_fits(compiler, vocab, smollm_tokenizer):
    constraint = make(compiler, vocab, smollm_tokenizer, fmt="hermes", parallel=True)
    rng = random.Random(2)
    while not constraint.closed():  # one whole call, sampled uniformly
        forced = constraint.forced()
        for token in forced or [rng.choice(sorted(allowed(constraint)))]:
            constraint.advance(token)
    separator = constraint.tokens.separator[0]
    row = torch.zeros(1536, dtype=torch.int32)
    constraint.fill(row, budget=3)
    assert not (int(row[separator >> 5]) >> (separator & 31)) & 1 and constraint.budget_forced
    assert (int(row[2 >> 5]) >> 2) & 1  # EOS still ends the turn


def test_a_grammar_built_without_a_table_builds_its_own(compiler):
    grammar = compiler.compile_json_schema(SCHEMA)
    bare = CompiledGrammar(grammar.index, grammar.regex, grammar.vocabulary, "k")
    assert bare.min_tokens(bare.initial_state) == grammar.min_tokens(grammar.initial_state)


def test_masker_applies_the_budget_mask_not_the_memoised_sparse_one(compiler, smollm_tokenizer):
    from types import SimpleNamespace

    from engine.constraint_hook import ConstraintMasker
    from grammars.masks.bitmask import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmasks

    grammar = compiler.compile_json_schema(SCHEMA)
    prefix = smollm_tokenizer.encode('{"city":"Par', add_special_tokens=False)
    masker = ConstraintMasker(49152, 2)
    for budget in (None, 40, 8, 4):
        matchers = [grammar.matcher(), grammar.matcher()]
        for m in matchers:
            for token in prefix:
                m.advance(token)
        for _ in range(2):  # second visit: the state's sparse form exists
            logits = torch.randn(1, 49152)
            reference, fast = logits.clone(), logits.clone()
            bitmask = allocate_token_bitmask(1, 49152)
            fill_next_token_bitmasks([(0, matchers[0])], bitmask, budgets=[budget])
            apply_token_bitmask_inplace(reference, bitmask)
            masker(fast, [SimpleNamespace(constraint=matchers[1], tokens_left=budget, params=SAMPLED)])
            assert torch.equal(reference, fast), budget
        allowed_count = int(torch.isfinite(fast).sum())
        assert (allowed_count < 1000) == (budget is not None and budget <= 8), (budget, allowed_count)


def test_masker_fills_a_tool_constraints_text_row_the_budget_narrows(compiler, vocab, smollm_tokenizer):
    """Auto mode's free text has a stored sparse form, but with no room for a call the arming token is
    banned too: the masker must fill that row and apply it, not the trigger's sparse form."""
    from types import SimpleNamespace

    from engine.constraint_hook import ConstraintMasker

    constraint = make(compiler, vocab, smollm_tokenizer, mode="auto", parallel=False)
    opener = smollm_tokenizer.encode("<tool_call>", add_special_tokens=False)
    for token in smollm_tokenizer.encode("Let me check.\n", add_special_tokens=False) + opener[:-1]:
        constraint.advance(token)
    last, call_min = opener[-1], constraint._call_min
    assert constraint.sparse_mask(call_min + 1) is not None and constraint.sparse_mask(call_min) is None
    for budget, opens in ((call_min, False), (call_min + 1, True), (None, True)):
        logits = torch.zeros(1, 49152)
        ConstraintMasker(49152, 1)(logits, [SimpleNamespace(constraint=constraint, tokens_left=budget,
                                                            params=SAMPLED)])
        assert bool(torch.isfinite(logits[0, last])) == opens, budget

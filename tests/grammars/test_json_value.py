"""JsonValueAutomaton + JsonValueMatcher: the shared token-level pushdown automaton for any JSON value.

Checked against an independent reference (a recursive-descent prefix parser over Python's strict
UTF-8 decoder, tests/json_reference.py), the tokenizer's own encodings, outlines-core's depth-3 json_object regex
(with Python's ``re``: compiling it to a token index takes 11 s) and a breadth-first search for
the true fewest tokens to completion.
"""

from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import pytest
import torch

from grammar_fixtures import smollm2_tokenizer, smollm2_vocabulary
from grammars.errors import GrammarError
from grammars.schema.json_schema import json_object_regex
from grammars.json_value.json_value import JsonValueAutomaton
from grammars.json_value.json_value_cache import _disk_tables, json_value_automaton, warm_automaton
from grammars.json_value.json_value_lexer import AFTER, ARRAY, ARRAY_FIRST, KEY, MAX_DEPTH, N_FRAC, NAMES, OBJECT
from grammars.json_value.json_value_matcher import JsonValueMatcher
from grammars.json_value.json_value_tables import load_tables
from grammars.masks.sparse_mask import SparseMask, sparse_mask
from json_reference import reference


@pytest.fixture(scope="module")
def vocab():
    return smollm2_vocabulary()


@pytest.fixture(scope="module")
def automaton(vocab):
    return json_value_automaton(vocab)


def _allowed(row: torch.Tensor, size: int) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:size]).tolist())


def _byte_tokens(vocab) -> dict[int, int]:
    return {b[0]: t for t, b in sorted(vocab.token_bytes.items(), reverse=True) if len(b) == 1}


def _at(automaton, vocab, prefix: bytes, top: str = "object") -> JsonValueMatcher:
    """A matcher that has read ``prefix`` one single-byte token at a time."""
    single = _byte_tokens(vocab)
    matcher = JsonValueMatcher(automaton, top)
    for b in prefix:
        matcher.advance(single[b])
    return matcher


PREFIXES = [b"", b"{", b'{"a', b'{"a":', b'{"a":[', b'{"a":[1', b'{"a":-', b'{"k":"x\\', b'{"k":"\xe2\x82',
            b'{"k":"\xed', b'{"a":[{"b":{}', b'{"a":{"b":[[1.5e', b'{"a":"b"', b'{"a":{"b":t']


@pytest.mark.parametrize("prefix", PREFIXES + [b"12", b'"a\\'])
def test_mask_equals_brute_force_reference(automaton, vocab, prefix):
    top = "object" if prefix[:1] in (b"", b"{") else "value"
    matcher = _at(automaton, vocab, prefix, top)
    row = torch.zeros(automaton.width, dtype=torch.int32)
    matcher.fill(row)
    expected = {t for t, b in vocab.token_bytes.items() if reference(prefix + b, top == "object") != "invalid"}
    if reference(prefix, top == "object") == "complete":
        expected |= vocab.eos_token_ids
    assert _allowed(row, vocab.size) == expected


def _fewest_tokens(automaton, q, frame, vocab, extra_depth: int = 2, limit: int = 10) -> int:
    """Breadth-first search over (q, stack) for the fewest tokens to a complete value, through every
    allowed token (containers may be opened up to ``extra_depth`` deeper than the start)."""
    frontier, seen = [(q, frame)], {(q, frame.kinds)}
    for distance in range(limit):
        following = []
        for q, frame in frontier:
            if automaton.is_final(q, frame):
                return distance
            for token in _allowed(automaton.entry(q, frame).row, vocab.size) - vocab.eos_token_ids:
                q2, frame2 = automaton.step(q, frame, token)
                key = (q2, frame2.kinds)
                if key not in seen and len(key[1]) <= frame.depth + extra_depth:
                    seen.add(key)
                    following.append((q2, frame2))
        frontier = following
    raise AssertionError("no completion within the search limit")


@pytest.mark.parametrize("prefix", [b'{"a":{"b":[[1.5e', b'{"a":[{"b":{}', b'{"k":"x', b'{"a":[', b'{"a', b""])
def test_min_tokens_is_the_true_minimum(automaton, vocab, prefix):
    single = _byte_tokens(vocab)
    q, frame = automaton.initial("object")
    for b in prefix:
        q, frame = automaton.step(q, frame, single[b])
    assert automaton.min_tokens(q, frame) == _fewest_tokens(automaton, q, frame, vocab)
    assert _at(automaton, vocab, prefix).min_tokens() == automaton.min_tokens(q, frame)


def _bits(row: torch.Tensor, size: int) -> np.ndarray:
    """bool [size]: the tokens a packed row (int32 [ceil(size/32)]) allows."""
    return np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:size].view(bool)


def _sparse_bits(sparse, size: int) -> np.ndarray:
    bits = np.full(size, not sparse.allowed)
    bits[sparse.ids.numpy()] = sparse.allowed
    return bits


@functools.lru_cache(maxsize=2)
def _token_classes(vocab):
    """(closers, tokens with a quote, short structural tokens, specials other than EOS) for steering."""
    closers = [t for t, b in vocab.token_bytes.items() if set(b) <= set(b'"}]')] + sorted(vocab.eos_token_ids)
    quotes = [t for t, b in vocab.token_bytes.items() if b'"' in b]
    structure = [t for t, b in vocab.token_bytes.items()
                 if len(b) <= 3 and set(b) <= set(b'{}[]":,-.0123456789eE+') or b in (b"true", b"null")]
    return tuple(np.asarray(ids, dtype=np.int64) for ids in (closers, quotes, structure,
                                                             sorted(vocab.special_ids - vocab.eos_token_ids)))


def _decode(matcher, vocab, seed: int, budget: int | None = None, steer_after: int = 30, steps: int = 400):
    """Random-logit sampling under the matcher's masks, checking each step's mask; the token ids."""
    gen = torch.Generator().manual_seed(seed)
    row = torch.zeros((vocab.size + 31) // 32, dtype=torch.int32)  # [W]
    closers, quotes, structure, specials = _token_classes(vocab)
    ids: list[int] = []
    while not matcher.is_terminated() and len(ids) < (steps if budget is None else budget + 1):
        left = None if budget is None else budget - len(ids)
        matcher.fill(row, left)
        bits = _bits(row, vocab.size)
        assert bits.any(), "a mask must allow some token"
        assert not bits[specials].any(), "special tokens are never allowed"
        assert any(bits[e] for e in vocab.eos_token_ids) == matcher.finished()
        sparse = matcher.sparse_mask(left)
        if sparse is not None:
            assert np.array_equal(_sparse_bits(sparse, vocab.size), bits)
        forced = matcher.forced()
        if forced and left is None:
            assert bits.sum() == 1 and bits[forced[0]]
        logits = torch.randn(vocab.size, generator=gen).numpy()
        logits[structure] += 3.0 * (seed % 3)  # seed by seed: long strings, or more nesting
        if seed % 3 == 2:
            logits[quotes] += 6.0  # short strings: nesting outside them
        if len(ids) >= steer_after:
            logits[closers] += 8.0
        token = int(np.argmax(np.where(bits, logits, -np.inf)))
        if left is not None and token not in vocab.eos_token_ids:
            assert matcher.min_tokens_after(token) <= max(left - 1, matcher.min_tokens() - 1)
        matcher.advance(token)
        ids.append(token)
    return ids


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("top", ["object", "value"])
def test_random_decoding_gives_valid_json(automaton, vocab, seed, top):
    matcher = JsonValueMatcher(automaton, top)
    ids = _decode(matcher, vocab, seed)
    assert matcher.is_terminated(), "the walk did not end"
    data = json.loads(vocab.decode(ids).decode("utf-8"))
    assert isinstance(data, dict) or top == "value"


BUDGET_PREFIXES = ["{", '{"a":[{"b":"hello', '{"a":[[[[[1', '{"k":{"k":{"k":{"k":[', '{"a":"x\\', '{"a":tr',
                   '{"a":[{}],"b":{"c":-1.5e', '{"a":[{"b":[1,2],"c']


@pytest.mark.parametrize("prefix", BUDGET_PREFIXES)
@pytest.mark.parametrize("slack", [0, 3, 10])
def test_budget_always_completes_in_time(automaton, vocab, prefix, slack):
    for seed in range(3):
        matcher = JsonValueMatcher(automaton, "object")
        ids = smollm2_tokenizer().encode(prefix, add_special_tokens=False)
        for token in ids:
            matcher.advance(token)
        budget = matcher.min_tokens() + slack
        rest = _decode(matcher, vocab, seed, budget=budget, steer_after=1000)
        assert matcher.finished()
        assert len([t for t in rest if t not in vocab.eos_token_ids]) <= budget
        assert isinstance(json.loads(vocab.decode(ids + rest).decode("utf-8")), dict)
        assert matcher.budget_forced or slack > 0


def _compact(data) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _nested(depth: int):
    value = [1, {"x": "y"}]
    for i in range(depth - 1):
        value = {f"k{i}": value} if i % 2 else [value, i]
    return {"top": value}


VALID = [
    "{}", '{"a":[]}', '{"":{}}', '{"a":"b","a":"c"}', _compact(_nested(8)), _compact(_nested(200)),
    _compact({"text": "héllo wörld ☃ 日本語 🎉 \u00a0\u00ff", "esc": "q\"b\\s/\b\f\n\r\t"}), '{"slash":"a\\/b"}',
    _compact({"n": [0, -0, 12, -3.25, 1.5e-10, 1e+100, -2.5E+3, 0.0]}).replace("1e+100", "1E+100"),
    '{"a":[true,false,null,[[]],{"b":{}}],"c":-0.0e-0}',
]


@pytest.mark.parametrize("text", VALID)
def test_tokenizer_encodings_of_valid_json_are_accepted(automaton, vocab, text):
    ids = smollm2_tokenizer().encode(text, add_special_tokens=False)
    assert vocab.decode(ids) == text.encode("utf-8")
    matcher = JsonValueMatcher(automaton, "object")
    for token in ids:
        assert not matcher.finished()
        matcher.advance(token)
    assert matcher.finished() and matcher.is_terminated()
    matcher.advance(min(vocab.eos_token_ids))
    for inner in json.loads(text).values():  # top="value": any value, here the object's members
        value = JsonValueMatcher(automaton, "value")
        for token in smollm2_tokenizer().encode(_compact(inner), add_special_tokens=False):
            value.advance(token)
        assert value.finished()


INVALID = ['{"a":}', '{"a":[1,]}', '{"a" :1}', "{'a':1}", '{"a":1}x', '{"a":1}}', '{"a":[1}]', '{"a":01}',
           '{"a":1e5}', '{"a":"\\u0041"}', '{"a":"\x85"}', '{"a":"\x7f"}', '{"a":"\x01"}', '{"a":tru}', '[1]',
           '{"a":1,}', '{,}', '{"a":.5}', '{"a":-}', '{"a":1.}']


@pytest.mark.parametrize("text", INVALID)
def test_invalid_json_is_rejected_at_the_right_token(automaton, vocab, text):
    ids = smollm2_tokenizer().encode(text, add_special_tokens=False)
    data = b""
    bad = None
    for i, token in enumerate(ids):
        data += vocab.token_bytes[token]
        if reference(data) == "invalid":
            bad = i
            break
    assert bad is not None, "the reference must reject the text"
    matcher = JsonValueMatcher(automaton, "object")
    for token in ids[:bad]:
        matcher.advance(token)
    assert not matcher.accepts(ids[bad])
    with pytest.raises(GrammarError, match="apply the bitmask"):
        matcher.advance(ids[bad])


@pytest.mark.parametrize("text", ['{"a":1', '{"a":"b', "{", '{"a":[{}]'])
def test_eos_is_refused_before_the_value_is_complete(automaton, vocab, text):
    matcher = JsonValueMatcher(automaton, "object")
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        matcher.advance(token)
    assert not matcher.finished() and not matcher.accepts(min(vocab.eos_token_ids))
    with pytest.raises(GrammarError, match="incomplete"):
        matcher.advance(min(vocab.eos_token_ids))


REGEX_TEXTS = VALID[:4] + VALID[6:8] + ['{"a":[true,false,null,[],{}],"c":-0.0e-0}', '{"a":{"b":{"c":1}}}',
                                       '{"a":[1,{"b":2}],"c":[[]]}', '{"a":1e+5}', '{"a":1E-0}'] + INVALID


@pytest.mark.parametrize("text", REGEX_TEXTS)
def test_acceptance_agrees_with_the_depth_3_regex(automaton, vocab, text):
    in_regex = re.fullmatch(json_object_regex(3), text) is not None
    matcher = JsonValueMatcher(automaton, "object")
    accepted = True
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        if not matcher.accepts(token):
            accepted = False
            break
        matcher.advance(token)
    assert (accepted and matcher.finished()) == in_regex


def test_rollback_restores_state_and_masks(automaton, vocab):
    matcher = JsonValueMatcher(automaton, "object")
    ids = smollm2_tokenizer().encode(_compact(_nested(6)), add_special_tokens=False) + [min(vocab.eos_token_ids)]
    row = torch.zeros(automaton.width, dtype=torch.int32)
    seen = []
    for token in ids:
        matcher.fill(row)
        seen.append((matcher.state, row.clone(), matcher.min_tokens()))
        matcher.advance(token)
    assert matcher.is_terminated()
    for n in (1, 3, len(ids)):
        matcher.rollback(n)
        state, mask, fewest = seen[len(seen) - n]
        matcher.fill(row)
        assert matcher.state == state and torch.equal(row, mask) and matcher.min_tokens() == fewest
        for token in ids[len(ids) - n:]:
            matcher.advance(token)
    with pytest.raises(GrammarError, match="max_rollback"):
        matcher.rollback(len(ids) + 1)
    matcher.reset()
    assert matcher.state == (automaton.initial("object")[0], ())


@pytest.mark.parametrize("prefix,last", [(b"nul", "l"), (b"tru", "e"), (b"fals", "e")])
def test_forced_chains_are_single_allowed_tokens(automaton, vocab, prefix, last):
    single = _byte_tokens(vocab)
    matcher = _at(automaton, vocab, prefix, top="value")  # a literal at depth 0: one token can end it
    before = matcher.state
    assert matcher.forced() == [single[ord(last)]]
    assert matcher.state == before  # forced() looks ahead without moving the matcher
    matcher.advance(single[ord(last)])
    assert matcher.is_terminated() and matcher.forced() == []
    assert matcher.min_tokens() == 0 and matcher.min_tokens_after(min(vocab.eos_token_ids)) == 0
    inside = _at(automaton, vocab, b'{"a":' + prefix)  # in an object: forced iff one token ends it
    row = torch.zeros(automaton.width, dtype=torch.int32)
    inside.fill(row)
    allowed = _allowed(row, vocab.size)
    assert inside.forced()[:1] == (sorted(allowed) if len(allowed) == 1 else [])


def test_depth_cap_masks_opening_brackets(automaton, vocab):
    single = _byte_tokens(vocab)
    matcher = _at(automaton, vocab, b"[" * (MAX_DEPTH - 1), top="value")
    assert matcher.accepts(single[ord("[")])
    matcher.advance(single[ord("[")])
    assert not matcher.accepts(single[ord("[")]) and not matcher.accepts(single[ord("{")])
    assert matcher.accepts(single[ord("]")]) and matcher.accepts(single[ord("1")])
    row = torch.zeros(automaton.width, dtype=torch.int32)
    matcher.fill(row)  # = the tokens scan() (its own depth check) takes
    assert _allowed(row, vocab.size) == {t for t, b in vocab.token_bytes.items()
                                         if automaton.scan(matcher.state, b)[0] is not None}
    budget = matcher.min_tokens()
    assert budget < MAX_DEPTH  # multi-closer tokens ("]]") count
    rest = _decode(matcher, vocab, 0, budget=budget)
    assert matcher.finished() and len(rest) <= budget + 1
    depth, value = 0, json.loads((b"[" * MAX_DEPTH + vocab.decode(rest)).decode())
    while isinstance(value, list):
        value, depth = (value[0] if value else None), depth + 1
    assert depth == MAX_DEPTH


def test_scan_stops_where_the_value_ends(automaton):
    obj, value = automaton.initial("object")[0], automaton.initial("value")[0]
    assert automaton.scan((obj, ()), b'{"a":[1,{}]}<tail>') == ((AFTER, ()), 12)
    assert automaton.scan((value, ()), b"-12.5e+3,") == ((AFTER, ()), 8)  # a number ends before ","
    assert automaton.scan((value, ()), b"-12.5") == ((N_FRAC, ()), 5)  # complete, and may continue
    assert automaton.scan((value, ()), b'"\xe2\x98') == ((NAMES.index("S_C1"), ()), 3)  # mid-character
    assert automaton.scan((value, ()), b'["\xc2\x85"]') == (None, 3)  # U+0085 is excluded
    assert automaton.scan((value, ()), b'"\xed\xa0\x80"') == (None, 2)  # a surrogate
    assert automaton.scan((obj, ()), b"[1]") == (None, 0)
    assert automaton.scan((value, ()), b'{"a":1,') == ((KEY, (OBJECT,)), 7)
    state, used = automaton.scan((value, ()), b'[{"a":[')
    assert used == 7 and state == (ARRAY_FIRST, (ARRAY, OBJECT, ARRAY))
    assert automaton.scan(state, b"]}]]") == ((AFTER, ()), 3)
    assert automaton.scan(state, b"]]") == (None, 1)
    matcher = JsonValueMatcher(automaton, "value")
    for token in smollm2_tokenizer().encode('[{"a":[', add_special_tokens=False):
        matcher.advance(token)
    assert matcher.state == state  # a matcher's state is scan's: (q, frame_of(stack)) continues it
    q, frame = state[0], automaton.frame_of(state[1])
    row = torch.zeros(automaton.width, dtype=torch.int32)
    matcher.fill(row)
    assert torch.equal(automaton.entry(q, frame).row, row)
    assert automaton.min_tokens(q, frame) == matcher.min_tokens()


def test_one_shared_automaton_and_its_disk_cache(automaton, vocab, tmp_path, monkeypatch):
    assert json_value_automaton(vocab) is automaton
    tables = _disk_tables(vocab, str(tmp_path))
    files = os.listdir(tmp_path)
    assert len(files) == 1 and files[0].endswith(".npz")
    loaded = load_tables(str(tmp_path / files[0]))  # numpy arrays only: loads with allow_pickle=False
    for name, array in tables.arrays().items():
        assert np.array_equal(loaded.arrays()[name], array) and np.array_equal(automaton.tables.arrays()[name], array)
    import grammars.json_value.json_value_cache as module

    monkeypatch.setattr(module, "build_tables", lambda *a: pytest.fail("the tables should come from disk"))
    again = JsonValueAutomaton(_disk_tables(vocab, str(tmp_path)), vocab.eos_token_ids)
    row, other = torch.zeros(automaton.width, dtype=torch.int32), torch.zeros(automaton.width, dtype=torch.int32)
    for prefix in PREFIXES:
        a, b = _at(automaton, vocab, prefix), _at(again, vocab, prefix)
        a.fill(row)
        b.fill(other)
        assert torch.equal(row, other) and a.min_tokens() == b.min_tokens()
    monkeypatch.undo()
    (tmp_path / files[0]).write_bytes(b"not an npz")
    assert _disk_tables(vocab, str(tmp_path)).size == vocab.size  # unreadable: rebuilt and rewritten
    assert load_tables(str(tmp_path / files[0])).size == vocab.size


def test_top_must_be_object_or_value(automaton):
    with pytest.raises(GrammarError, match="'object'"):
        JsonValueMatcher(automaton, "array")


def test_a_budget_narrowed_sparse_mask_is_the_filled_rows_from_its_second_ask(automaton, vocab):
    matcher = _at(automaton, vocab, b'{"a":"xy')
    assert matcher.sparse_mask() is not None and not matcher.sparse_mask().allowed  # a few banned ids
    assert matcher.sparse_mask(budget=100) is matcher.sparse_mask()
    budget = matcher.min_tokens()
    row = torch.zeros(automaton.width, dtype=torch.int32)
    matcher.fill(row, budget=budget)
    assert matcher.budget_forced
    allowed = _allowed(row, vocab.size)
    assert allowed and all(matcher.min_tokens_after(t) <= matcher.min_tokens() - 1 for t in allowed)
    expected = sparse_mask(row, vocab.size)
    assert expected is not None  # the narrowed row has a short side
    matcher.sparse_mask(budget=budget)  # a first ask (None, unless an earlier test asked it)
    got = matcher.sparse_mask(budget=budget)
    assert got is not None and got.allowed == expected.allowed and np.array_equal(got.array, expected.array)
    assert matcher.sparse_mask(budget=budget) is got  # memoised
    assert matcher.sparse_mask(budget=budget) is not matcher.sparse_mask()


@pytest.mark.parametrize("prefix", [b'{"a":', b'{"a":[', b'{"a":[{"b":{}', b'{"k":"x', b"", b'{"a":{"b":[[1.5e'])
def test_budget_mask_is_every_token_that_still_fits(automaton, vocab, prefix):
    matcher = _at(automaton, vocab, prefix)
    row = torch.zeros(automaton.width, dtype=torch.int32)
    matcher.fill(row)
    candidates = _allowed(row, vocab.size) - vocab.eos_token_ids
    after = {t: matcher.min_tokens_after(t) for t in candidates}
    for budget in range(matcher.min_tokens() - 1, matcher.min_tokens() + 3):
        matcher.fill(row, budget)
        limit = max(budget - 1, matcher.min_tokens() - 1)
        assert _allowed(row, vocab.size) == {t for t, n in after.items() if n <= limit}


def test_warm_makes_every_mask_a_nested_value_reaches():
    """warm_automaton() (run once the automaton is loaded, before `maskd serve` listens) makes the entries,
    budget costs and budget-narrowed id lists that first visits would make, at any depth, and holds the
    lists under the budgets' keys: walking nested values afterwards, asking each prefix's mask at every
    budget that narrows it, makes none and finds each list at its key (none made on a first ask)."""
    automaton = JsonValueAutomaton(json_value_automaton(smollm2_vocabulary()).tables,
                                   smollm2_vocabulary().eos_token_ids)  # fresh entries
    warm_automaton(automaton)
    made = len(automaton._entries), len(automaton._costs), len(automaton._kept), _masks_held(automaton)
    texts = [b'{"a":[{"b":{"c":[[1.5e+3,-2,"x\\n\\"y"],{"d":null,"e":[true,false]}]}}],"f":"g"}',
             b'{"a":' * 20 + b'{"t":"x"}' + b"}" * 20, b'{"a":' + b"[" * 20 + b"1" + b"]" * 20 + b"}"]
    row = torch.zeros(automaton.width, dtype=torch.int32)
    narrowed = 0
    for text in texts:
        for cut in range(len(text) + 1):
            matcher = _at(automaton, smollm2_vocabulary(), text[:cut])
            matcher.fill(row)
            least = matcher.min_tokens()
            for budget in range(max(1, least), least + 12):
                narrowed += matcher.sparse_mask(budget) is not matcher.sparse_mask()
        assert matcher.finished()
    assert narrowed > 100  # the budgets asked did narrow masks
    assert (len(automaton._entries), len(automaton._costs), len(automaton._kept), _masks_held(automaton)) == made


def _masks_held(automaton) -> int:
    return sum(isinstance(got, SparseMask) for got in automaton._budget_sparse._memo.values())


@pytest.mark.parametrize("prefix,narrows", [(b'{"a":', True), (b'{"a":[{"b":{}', True), (b'{"k":"x', True), (b"", True),
                                             (b'{"a":{"b":[[1.5e', False)])  # after `e`: every token costs the same
def test_sparse_at_is_the_entrys_mask_from_the_safe_budget_on_and_the_budget_mask_below(automaton, vocab, prefix,
                                                                                          narrows):
    matcher = _at(automaton, vocab, prefix)
    q, frame = matcher.q, matcher.frame
    safe = automaton.safe_budget(q, frame)
    assert (safe > 1) == narrows
    for budget in range(1, max(min(safe, 40), 1) + 3):
        automaton.budget_sparse(q, frame, budget) if budget < safe else None  # a first ask may be None; then made
        expected = automaton.budget_sparse(q, frame, budget) if budget < safe else automaton.entry(q, frame).sparse
        keys = len(automaton._budget_sparse)
        assert automaton.sparse_at(q, frame, budget) is expected
        assert len(automaton._budget_sparse) == keys  # read at budget_sparse's own key

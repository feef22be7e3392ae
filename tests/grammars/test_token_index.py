"""Token indexes by a pruned walk of the token trie (grammars/index/token_index.py) equal outlines-core's,
loop states included (their plain tokens not listed, grammars/index/unit_index.py)."""

import gzip
import json
from pathlib import Path

import outlines_core
import pytest

from grammar_fixtures import smollm2_vocabulary
from grammars import GrammarError, schema_to_regex
from grammars.index.plain_tokens import plain_tokens
from grammars.index.token_index import TokenTrie
from grammars.tools.tool_grammar import tool_grammar

MASKBENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "maskbench"


@pytest.fixture(scope="module")
def trie():
    vocabulary = smollm2_vocabulary()
    return TokenTrie(vocabulary.token_bytes, plain_tokens(vocabulary))


def canonical(index, eos: int = -1) -> list:
    """The index as (transitions, final) per state, states numbered in breadth-first order (EOS, which
    outlines-core writes as a transition of final states, left out)."""
    transitions, finals = index.get_transitions(), index.get_final_states()
    number, order, out = {index.get_initial_state(): 0}, [index.get_initial_state()], []
    for state in order:
        row = {}
        for token, next_state in sorted(transitions.get(state, {}).items()):
            if token == eos:
                continue
            if next_state not in number:
                number[next_state] = len(number)
                order.append(next_state)
            row[token] = number[next_state]
        out.append((row, state in finals))
    return out


def schemas(subset: str, count: int) -> list[dict]:
    """``count`` schemas spread over a MaskBench subset; none where the data is not beside the checkout
    (../shared/data/maskbench): the hand-written regexes are then checked alone, and
    test_maskbench_regexes_are_checked_where_the_data_is says it was skipped."""
    path = MASKBENCH / f"{subset}.jsonl.gz"
    if not path.is_file():
        return []
    rows = [json.loads(line)["schema"] for line in gzip.open(path, "rt")]
    return rows[:: max(1, len(rows) // count)][:count]


def regexes() -> list[str]:
    out = [r'\{"a":[0-9]+\}', '"[^"]*"', "(ab|é)+c", r'\n\{"name": "f", "arguments": \x01\}\n']
    for subset in ("BFCL", "Glaiveai2K", "JME", "MCPspec"):
        for schema in schemas(subset, 6):
            try:
                out.append(schema_to_regex(schema, free_values=True))
            except GrammarError:
                continue
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "meta": {}}, "required": ["city"]}}}]
    out.append(tool_grammar("hermes", tools, lambda s: schema_to_regex(s, free_values=True), False).units[0])
    return out


def test_maskbench_regexes_are_checked_where_the_data_is():
    if not (MASKBENCH / "BFCL.jsonl.gz").is_file():
        pytest.skip(f"MaskBench data not present at {MASKBENCH}: its regexes are not among those checked here")
    assert len(regexes()) > 20


@pytest.mark.parametrize("regex", regexes())
def test_the_trie_walk_gives_outlines_cores_index(trie, regex):
    mine = trie.index(regex)
    assert mine is not None
    vocabulary = smollm2_vocabulary()
    assert canonical(mine) == canonical(outlines_core.Index(regex, vocabulary.outlines), vocabulary.eos_token_id)


def test_string_states_are_loop_states_listing_only_non_plain_tokens(trie):
    """Inside `"[^"]*"` every plain token stays in the string: the state is a loop state, and it lists
    only the other tokens (the closing quote among them), not ~48k pairs."""
    vocabulary = smollm2_vocabulary()
    plain = plain_tokens(vocabulary)
    index = trie.index('"[^"]*"')
    quote = next(t for t, b in vocabulary.token_bytes.items() if b == b'"')
    inside = index.get_next_state(0, quote)
    assert index.is_loop_state(inside) and not index.is_loop_state(0)
    tokens, _ = index.explicit(inside)
    assert 0 < len(tokens) < len(vocabulary.token_bytes) - len(plain.ids)
    assert not any(int(t) in plain for t in tokens)
    word = next(t for t, b in vocabulary.token_bytes.items() if b == b"hello")
    assert index.get_next_state(inside, word) == inside
    assert index.is_final_state(index.get_next_state(inside, quote))
    newline = next(t for t, b in vocabulary.token_bytes.items() if b == b"\n")
    assert newline in tokens.tolist() and index.get_next_state(inside, newline) == inside  # not plain: listed


def test_a_state_that_refuses_some_string_content_is_not_a_loop_state(trie):
    """`[^"é]*`: é (C3 A9) does not lead back, so every token is listed."""
    index = trie.index('"[^"\u00e9]*"')
    vocabulary = smollm2_vocabulary()
    quote = next(t for t, b in vocabulary.token_bytes.items() if b == b'"')
    inside = index.get_next_state(0, quote)
    assert not index.is_loop_state(inside)
    assert len(index.explicit(inside)[0]) > 40000  # looked up by binary search, not a dict
    word, e_acute = (next(t for t, b in vocabulary.token_bytes.items() if b == text) for text in (b"hello", "é".encode()))
    assert index.get_next_state(inside, word) == inside and index.get_next_state(inside, e_acute) is None
    assert index.is_final_state(index.get_next_state(inside, quote))


def test_a_token_may_leave_an_accepting_state(trie):
    """outlines-core 0.2.14 drops transitions from an accepting state to a non-accepting one (after
    `1`, `.` in `[0-9]+(\\.[0-9]+)?`); the trie walk keeps them, so `1` `.` `5` is written."""
    vocabulary = smollm2_vocabulary()
    one, dot, five = (next(t for t, b in vocabulary.token_bytes.items() if b == text) for text in (b"1", b".", b"5"))
    index = trie.index(r"[0-9]+(\.[0-9]+)?")
    state = index.get_next_state(index.get_initial_state(), one)
    assert index.is_final_state(state)
    state = index.get_next_state(state, dot)
    assert state is not None and not index.is_final_state(state)
    assert index.is_final_state(index.get_next_state(state, five))
    theirs = outlines_core.Index(r"[0-9]+(\.[0-9]+)?", vocabulary.outlines)
    assert theirs.get_next_state(theirs.get_next_state(theirs.get_initial_state(), one), dot) is None


def test_a_regex_holding_the_sentinel_byte_is_left_to_outlines_core(trie):
    assert trie.index("a\x02?") is None
    assert trie.index("a\x02b") is not None  # inside the regex and never at its end: still exact


def test_each_states_tokens_come_sorted_whatever_their_ids():
    """The walk finds a state's tokens in trie order and sorts them by id (insertion sort for a few,
    radix sort for many): ids scattered up to 2^27 need four byte passes, still equal to outlines-core's."""
    import random

    from grammars.index.plain_tokens import PlainTokens

    rng = random.Random(7)
    pieces = sorted({bytes(rng.choice(b'ab"{}:,0123') for _ in range(rng.randint(1, 4))) for _ in range(3000)})
    pieces += [bytes([b]) for b in range(256) if bytes([b]) not in pieces]
    ids = rng.sample(range(1, 1 << 27), len(pieces))
    token_bytes = dict(zip(ids, pieces))
    trie = TokenTrie(token_bytes, PlainTokens(token_bytes, max(ids) + 1))
    vocabulary = outlines_core.Vocabulary(0, {piece: [token] for token, piece in token_bytes.items()})
    for regex in ('\\{"a":"[^"]*","b":[0-9]+\\}', '"[ab0{]*"'):
        mine = trie.index(regex)
        assert mine is not None
        rows = [mine.explicit(s)[0] for s in range(mine.n_states)]
        assert any(len(row) > 32 for row in rows) and any(1 < len(row) <= 32 for row in rows)  # both sorts ran
        assert all((row[1:] > row[:-1]).all() for row in rows)  # ascending: looked up by binary search
        assert canonical(mine) == canonical(outlines_core.Index(regex, vocabulary), 0)

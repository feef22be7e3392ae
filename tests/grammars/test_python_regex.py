"""grammars/languages/python_regex.py: a client's regex (Python's syntax) and a choice become the
token index's regex. The compiled grammar, walked byte by byte over SmolLM2's vocabulary, accepts
a text exactly where Python's `re.fullmatch` of the client's regex does (with re.ASCII: \\d \\w \\s
are ASCII, as in JSON Schema); what no automaton holds is refused by name."""

from __future__ import annotations

import re

import pytest

from grammar_fixtures import shared_compiler, smollm2_vocabulary
from grammars import RegexError, choice_regex, index_regex

CASES = [
    (r"^\d{3}-\d{4}$", ["555-1234", "5551234", "555-12345", "\u0663\u0663\u0663-\u0664\u0664\u0664\u0664", "a55-1234"]),
    (r"(yes|no)", ["yes", "no", "maybe", "", "yesno"]),
    (r"[A-Za-z_][\w.-]*@example\.com", ["a.b-c@example.com", "a@exampleXcom", "9a@example.com", "_@example.com"]),
    (r'[^"\\]+', ["abc", 'a"b', "a\\b", "é€ 1"]),
    (r"a+?b*", ["aab", "b", "a", "abab"]),
    (r".+", ["a\nb", "é€", "x"]),
    (r"\s*\S+", [" x", "\tyz", "  ", "x y"]),
    (r"(?:ab){2,3}c?", ["ababc", "abc", "ababab", "abababab"]),
    (r"[\x00-\x1f]?z", ["\x01z", "z", "\x03z", " z"]),  # control bytes are characters, not markers
    (r"\.\*\+\(\)\[\]\{\}\|\^\$", [".*+()[]{}|^$", "a"]),
    (r"\W+|\d", ["!?", "a", "7", "!7", "\u0663", "é"]),  # \W is ASCII too: é is not a word character there
    (r"[\w\s]+", ["a b_9", "é", "\u2003"]),
    (r"(?P<year>19|20)\d\d", ["1999", "2024", "2124"]),
    (r"[^a-c\d]{2}", ["dd", "a1", "zz", "z"]),
]


def _accepts(grammar, singles: dict[int, int], text: str) -> bool:
    matcher = grammar.matcher()
    for byte in text.encode():
        token = singles[byte]
        if not matcher.accepts(token):
            return False
        matcher.advance(token)
    return matcher.finished()


@pytest.fixture(scope="module")
def singles() -> dict[int, int]:
    """byte -> SmolLM2's token of that byte alone."""
    vocab = smollm2_vocabulary()
    out = {}
    for token, data in vocab.token_bytes.items():
        if len(data) == 1:
            out.setdefault(data[0], token)
    assert all(byte in out for byte in range(32, 127))  # (a few control bytes have no token of their own)
    return out


@pytest.mark.parametrize("pattern, texts", CASES)
def test_the_grammar_accepts_what_python_fullmatch_accepts(pattern, texts, singles):
    grammar = shared_compiler().compile_regex(index_regex(pattern))
    for text in texts:
        assert _accepts(grammar, singles, text) == (re.fullmatch(pattern, text, re.ASCII) is not None), (pattern, text)


def test_the_index_mark_is_never_generated(singles):
    """\x02 ends the index's own regex: no class nor `.` matches it, and a regex asking for it is refused."""
    for pattern in (r"[\x00-\x1f]z", r".z", r"[^a]z", r"\Wz", r"[\W]z"):
        grammar = shared_compiler().compile_regex(index_regex(pattern))
        assert not _accepts(grammar, singles, "\x02z") and _accepts(grammar, singles, "\x03z"), pattern
    with pytest.raises(RegexError, match="x02"):
        index_regex(r"a\x02")


def test_a_choice_accepts_exactly_its_strings(singles):
    choices = ["red", "green blue", "a|b", "", "(x)"]
    grammar = shared_compiler().compile_regex(choice_regex(choices))
    for text in [*choices, "a", "redred", "green", "x", "b"]:
        assert _accepts(grammar, singles, text) == (text in choices), text


@pytest.mark.parametrize("pattern, named", [
    (r"(?=a)a", "lookarounds"), (r"a(?<!b)", "lookarounds"), (r"(a)\1", "backreferences"),
    (r"(a)?(?(1)b|c)", "conditional groups"), (r"\bword", "word boundaries"), (r"a^b", "anchors"),
    (r"(?i)abc", "inline flags"), (r"(?s:.)", "inline flags"), (r"(?>a)", "atomic groups"),
    (r"a*+", "possessive repeats"), (r"[", "not a valid regex"),
])
def test_what_no_automaton_holds_is_refused_by_name(pattern, named):
    with pytest.raises(RegexError, match=re.escape(named)):
        index_regex(pattern)


@pytest.mark.parametrize("choices", [[], ["a", 1], "abc", ["a\x02"]])
def test_a_choice_must_be_strings(choices):
    with pytest.raises(RegexError):
        choice_regex(choices)

"""grammars/languages/gbnf.py: a regular GBNF grammar becomes the token index's regex. The compiled
grammar, walked byte by byte over SmolLM2's vocabulary, accepts a text exactly where Python's
re.fullmatch of the grammar's check regex does, and that regex is checked against texts written
by hand; recursion and bad syntax are refused by name."""

from __future__ import annotations

import re

import pytest

from grammar_fixtures import shared_compiler, smollm2_vocabulary
from grammars import GrammarError, gbnf_regexes

GRAMMAR = r'''
# an answer, then a list of up to four items
root   ::= answer ", " list "\n"?
answer ::= ("yes" | "no")
list   ::= item ("," item){0,3}
item   ::= [a-z]+ | [0-9]{1,3} | "\"" [^"\\]* "\""   # words, numbers, quoted text
'''
TEXTS = {  # text -> in the language (by hand)
    "yes, a": True, "no, abc,12,\"q w\"": True, "yes, a\n": True, "maybe, a": False, "yes, ": False,
    "yes, a,b,c,d,e": False, "no, 1234": False, "yes, \"é\"": True, "yes, \"a\"b\"": False, "yes,a": False,
}


@pytest.fixture(scope="module")
def singles() -> dict[int, int]:
    out = {}
    for token, data in smollm2_vocabulary().token_bytes.items():
        if len(data) == 1:
            out.setdefault(data[0], token)
    return out


def _accepts(grammar, singles, text: str) -> bool:
    matcher = grammar.matcher()
    for byte in text.encode():
        if not matcher.accepts(singles[byte]):
            return False
        matcher.advance(singles[byte])
    return matcher.finished()


def test_a_regular_grammar_is_enforced_as_written(singles):
    index, check = gbnf_regexes(GRAMMAR)
    grammar = shared_compiler().compile_regex(index)
    for text, member in TEXTS.items():
        assert (re.fullmatch(check, text) is not None) == member, text
        assert _accepts(grammar, singles, text) == member, text


def test_any_character_and_classes_never_take_the_index_mark(singles):
    index, check = gbnf_regexes('root ::= . [\\x00-\\x1f] [^a]')
    grammar = shared_compiler().compile_regex(index)
    assert _accepts(grammar, singles, "\n\x03b") and re.fullmatch(check, "\n\x03b")
    assert not _accepts(grammar, singles, "\x02\x03b") and not _accepts(grammar, singles, "a\x03\x02")


@pytest.mark.parametrize("text, named", [
    ('root ::= "(" root ")" | "x"', "refers to itself (root -> root)"),
    ('root ::= a\na ::= "x" b\nb ::= a?', "refers to itself (a -> b -> a)"),
    ('root ::= "x', "not closed"), ('root ::= [a-', "not closed"), ('item ::= "a"', "root"),
    ('root ::= nothing', "not defined"), ('root ::= "a"{3,1}', "below its minimum"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"), ('root ::= <[1000]>', "token references"),
    ('root ::= "\\q"', "unknown escape"), ('root ::= [z-a]', "backwards"), ("", "non-empty"),
])
def test_what_cannot_be_enforced_is_refused_by_name(text, named):
    with pytest.raises(GrammarError, match=re.escape(named)):
        gbnf_regexes(text)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # re's parser on texts such as "[[": "possible nested set"
def test_any_text_is_read_or_refused_with_a_grammar_error():
    """Random texts of GBNF's (and regex's) symbols: each is a grammar or a GrammarError (a 400),
    never another exception (a 500)."""
    import random

    from grammars import index_regex

    rng = random.Random(0)
    symbols = ["root", " ::= ", '"', "a", "\\", "x", "[", "]", "^", "-", "(", ")", "|", "*", "+", "?", "{", "}",
               ",", "1", "\n", "#", ".", " ", "b", "::=", "<", "u", "é", "$", "=", "!", "P", ":"]
    for _ in range(3000):
        text = "".join(rng.choice(symbols) for _ in range(rng.randint(1, 25)))
        for read in (gbnf_regexes, index_regex):
            try:
                read(text)
            except GrammarError:
                pass

"""A client's regex, in Python's syntax, rewritten from Python's own parse of it into the regex the
token index reads (outlines-core, Rust's syntax), meaning the same strings; and a choice among
strings as such a regex.

The whole output must match (as `re.fullmatch` with `re.ASCII`: \\d, \\w and \\s are ASCII, as in
JSON Schema's `pattern`, not every script's digits): a `^` / `\\A` that starts the regex and a `$` /
`\\Z` that ends it say so already and are dropped. What no finite automaton holds is refused with
a RegexError that names it: lookarounds, backreferences, word boundaries, anchors elsewhere,
atomic groups and possessive repeats; inline flags too, whose meaning the rewrite does not carry.
Every character outside [A-Za-z0-9_] and printable non-ASCII is written as an escape, so that no
text of the client's can read as syntax, nor as the token index's own markers (the control byte
of a free JSON value, grammars/schema/free_values.py). One character is never matched: \x02, the
mark where the index's regex ends (grammars/index/token_index.py); every class and `.` leave it
out (a class that held it cut the walk after the first multi-byte character), and a regex that
asks for it is refused.
"""

from __future__ import annotations

import re
from re import _constants as C  # noqa: N812 - the parser's op codes
from re import _parser

from grammars.errors import GrammarError
from grammars.index.token_index import SENTINEL

# \d \w \s and their negations are ASCII, as in JSON Schema (and Python's re.ASCII): Rust's ASCII
# classes, which its character classes (the only place they are written) read
CATEGORIES = {C.CATEGORY_DIGIT: "[:digit:]", C.CATEGORY_NOT_DIGIT: "[:^digit:]", C.CATEGORY_SPACE: "[:space:]",
              C.CATEGORY_NOT_SPACE: "[:^space:]", C.CATEGORY_WORD: "[:word:]", C.CATEGORY_NOT_WORD: "[:^word:]"}
REFUSED = {C.ASSERT: "lookarounds ((?=...), (?!...), (?<=...), (?<!...))",
           C.ASSERT_NOT: "lookarounds ((?=...), (?!...), (?<=...), (?<!...))",
           C.GROUPREF: "backreferences (\\1, (?P=name))", C.GROUPREF_EXISTS: "conditional groups ((?(1)...))",
           C.ATOMIC_GROUP: "atomic groups ((?>...))", C.POSSESSIVE_REPEAT: "possessive repeats (*+, ++, ?+)"}
STARTS = (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
ENDS = (C.AT_END, C.AT_END_STRING)


class RegexError(GrammarError):
    """A regex that cannot be enforced: not valid in Python's syntax, or a construct no finite
    automaton holds."""


def index_regex(pattern: str) -> str:
    """The token index's regex for Python regex `pattern`, matched whole; raises RegexError."""
    if not isinstance(pattern, str):
        raise RegexError(f"a regex must be a string, got {type(pattern).__name__}")
    try:
        parsed = _parser.parse(pattern)
    except re.error as exc:
        raise RegexError(f"not a valid regex ({exc})") from None
    except RecursionError:
        raise RegexError("the regex nests too deeply") from None
    if parsed.state.flags & ~re.UNICODE:
        raise RegexError("inline flags ((?i), (?s), (?m), (?x), ...) are not supported; write the cases out, "
                         "e.g. [Aa] for (?i)a")
    items = list(parsed)
    if items and items[0][0] is C.AT and items[0][1] in STARTS:
        items = items[1:]
    if items and items[-1][0] is C.AT and items[-1][1] in ENDS:
        items = items[:-1]
    return _sequence(items)


def choice_regex(choices: list[str]) -> str:
    """The regex whose matches are exactly `choices`; raises RegexError for an empty list or a
    choice that is not a string."""
    if not isinstance(choices, list) or not choices:
        raise RegexError("a choice needs a non-empty list of strings")
    bad = next((c for c in choices if not isinstance(c, str)), None)
    if bad is not None:
        raise RegexError(f"every choice must be a string, got {bad!r}")
    if any(chr(SENTINEL) in choice for choice in choices):
        raise RegexError("a choice holds the control character \\x02, which cannot be generated (maskd's token "
                         "index marks the end of a regex with it)")
    return "(?:" + "|".join("".join(regex_char(ord(c)) for c in choice) for choice in choices) + ")"


def _sequence(items) -> str:
    return "".join(_item(op, av) for op, av in items)


def _item(op, av) -> str:
    if op in REFUSED:
        raise RegexError(f"{REFUSED[op]} are not supported: no finite automaton holds them; rewrite the regex "
                         "without them")
    if op is C.LITERAL:
        if av == SENTINEL:
            raise RegexError("the control character \\x02 cannot be generated (maskd's token index marks "
                             "the end of a regex with it)")
        return regex_char(av)
    if op is C.NOT_LITERAL:
        return f"[^{regex_char(av)}{regex_char(SENTINEL)}]"
    if op is C.ANY:
        return f"[^\\n{regex_char(SENTINEL)}]"  # any character but a newline (and the mark)
    if op is C.IN:
        return _class(av)
    if op is C.BRANCH:
        return "(?:" + "|".join(_sequence(branch) for branch in av[1]) + ")"
    if op is C.SUBPATTERN:
        _group, add_flags, del_flags, inner = av
        if add_flags or del_flags:
            raise RegexError("inline flags in a group ((?i:...), ...) are not supported; write the cases out")
        return "(?:" + _sequence(inner) + ")"
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # lazy or greedy: the same strings match whole
        low, high, inner = av
        bound = f"{{{low},}}" if high is C.MAXREPEAT else f"{{{low},{high}}}"
        return "(?:" + _sequence(inner) + ")" + bound
    if op is C.AT:
        where = "word boundaries (\\b, \\B)" if av in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY) else \
            "anchors (^, $, \\A, \\Z) other than one that starts or ends the whole regex"
        raise RegexError(f"{where} are not supported; the whole output matches the regex")
    raise RegexError(f"the regex construct {op} is not supported")


def _class(items) -> str:
    out, negate = [], False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            out.append(regex_char(av))
        elif op is C.RANGE:
            out.append(f"{regex_char(av[0])}-{regex_char(av[1])}")
        elif op is C.CATEGORY and av in CATEGORIES:
            out.append(CATEGORIES[av])
        else:
            raise RegexError(f"the character class item {op} {av} is not supported")
    if negate:
        return "[^" + "".join(out) + regex_char(SENTINEL) + "]"
    return "[" + "".join(out) + "&&[^" + regex_char(SENTINEL) + "]]"  # Rust's class intersection


def regex_char(code: int) -> str:
    """One character as both syntaxes read it, never as syntax."""
    c = chr(code)
    if c.isascii() and (c.isalnum() or c == "_"):
        return c
    if not c.isascii() and c.isprintable() and not c.isspace():
        return c
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

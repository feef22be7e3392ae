"""Two texts read off a unit's regex (Python's own regex parser): the literal it starts with, and a
shortest text it matches.

A tool's unit starts with text that leaves no choice: `\\n{"name": "get_weather", "arguments": {"city":"`.
The name stage (grammars/tools/name_stage.py) steps through these literals while the units compile, and
bounds, from a shortest whole text, how many tokens a unit needs at most to close.

outlines-core writes regexes that Python's `re` also reads (grammars/tools/formats/call_regex.py);
a regex it cannot read, or a class with no character to pick, gives None: the caller then waits
for the compiled unit instead.
"""

from __future__ import annotations

import re
from re import _constants as C  # noqa: N812 - the parser's op codes
from re import _parser

from grammars.schema.free_values import HOLE

_PICKS = "a0 \"" + "".join(chr(c) for c in range(0x21, 0x7F)) + "\u00e9\u4e00"  # tried in this order


def unit_texts(regex: str) -> tuple[str, str | None] | None:
    """(leading_literal, shortest_text) of ``regex`` from one parse; None if unreadable."""
    try:
        parsed = list(_parser.parse(regex))
        out: list[str] = []
        _literal(parsed, out)
        text = _shortest(parsed)
        if text is not None and not re.fullmatch(regex, text, re.DOTALL):
            text = None
        return "".join(out), text
    except (re.error, RecursionError, OverflowError):
        return None


def leading_literal(regex: str) -> str | None:
    """The text every match of ``regex`` starts with, up to its first choice; None if unreadable."""
    texts = unit_texts(regex)
    return None if texts is None else texts[0]


def _literal(items: list, out: list[str]) -> bool:
    """Appends the leading literal of ``items``; True if all of them were literal. It ends before a
    free value's HOLE: that byte stands for a JSON value of the unit's automaton, not for text (a
    vocabulary may hold the byte as a token of its own, which the unit never allows)."""
    for op, av in items:
        if op is C.LITERAL and av != ord(HOLE):
            out.append(chr(av))
        elif op is C.SUBPATTERN and not av[1] and not av[2]:  # a plain group: look inside
            if not _literal(list(av[3]), out):
                return False
        else:
            return False
    return True


def shortest_text(regex: str) -> str | None:
    """A shortest text ``regex`` matches (ASCII where it may), checked with re.fullmatch; or None."""
    texts = unit_texts(regex)
    return None if texts is None else texts[1]


def _shortest(items: list) -> str | None:
    out = []
    for op, av in items:
        piece = _one(op, av)
        if piece is None:
            return None
        out.append(piece)
    return "".join(out)


def _one(op, av) -> str | None:
    if op is C.LITERAL:
        return chr(av)
    if op is C.AT:
        return ""
    if op is C.ANY:
        return "a"
    if op is C.NOT_LITERAL:
        return "a" if av != ord("a") else "b"
    if op is C.IN:
        return next((c for c in _PICKS if _in_class(av, c)), None)
    if op is C.SUBPATTERN:
        return _shortest(list(av[3]))
    if op is C.ATOMIC_GROUP:
        return _shortest(list(av))
    if op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
        low, _, sub = av
        if low == 0:
            return ""
        once = _shortest(list(sub))
        return None if once is None else once * low
    if op is C.BRANCH:
        options = [t for t in (_shortest(list(b)) for b in av[1]) if t is not None]
        return min(options, key=lambda t: len(t.encode()), default=None)
    return None  # backreferences, lookaround: not in unit regexes


def _in_class(items: list, c: str) -> bool:
    negate, hit = False, False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            hit |= ord(c) == av
        elif op is C.RANGE:
            hit |= av[0] <= ord(c) <= av[1]
        elif op is C.CATEGORY:
            hit |= bool(re.fullmatch(_CATEGORIES.get(av, "(?!)"), c))
        else:
            return False  # an op we do not read: pick nothing from this class
    return hit != negate


_CATEGORIES = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
               C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W"}

"""A reference JSON prefix checker for the JSON-value automaton's tests: recursive descent over
Python's strict UTF-8 decoder, written independently of grammars/json_value/json_value_lexer.py."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-][0-9]+)?")


class _End(Exception):
    """The text ended where more must come; ``in_string``: in a string's content (where a character
    cut short may be pending)."""

    def __init__(self, in_string: bool = False) -> None:
        self.in_string = in_string


class _Bad(Exception):
    pass


def _value(s: str, i: int) -> int:
    if i == len(s):
        raise _End()
    c = s[i]
    if c == "{":
        return _container(s, i + 1, "}", key=True)
    if c == "[":
        return _container(s, i + 1, "]", key=False)
    if c == '"':
        return _string(s, i + 1)
    if c in "-0123456789":
        j = i
        while j < len(s) and s[j] in "0123456789.eE+-":  # a number runs to the first other character
            j += 1
        run = s[i:j]
        if _NUMBER.fullmatch(run):
            return j
        if j == len(s) and any(_NUMBER.fullmatch(run + tail) for tail in ("0", "+0")):
            raise _End()
        raise _Bad()
    for word in ("true", "false", "null"):
        if c == word[0]:
            part = s[i:i + len(word)]
            if part == word:
                return i + len(word)
            if word.startswith(part) and i + len(part) == len(s):
                raise _End()
            raise _Bad()
    raise _Bad()


def _string(s: str, i: int) -> int:
    while i < len(s):
        c = s[i]
        if c == '"':
            return i + 1
        if c == "\\":
            if i + 1 == len(s):
                raise _End()  # an escape letter (ASCII) must come next
            if s[i + 1] not in '"\\/bfnrt':
                raise _Bad()
            i += 2
            continue
        if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F:
            raise _Bad()
        i += 1
    raise _End(True)


def _container(s: str, i: int, closer: str, key: bool) -> int:
    if i == len(s):
        raise _End()
    if s[i] == closer:
        return i + 1
    while True:
        if key:
            if i == len(s):
                raise _End()
            if s[i] != '"':
                raise _Bad()
            i = _string(s, i + 1)
            if i == len(s):
                raise _End()
            if s[i] != ":":
                raise _Bad()
            i += 1
        i = _value(s, i)
        if i == len(s):
            raise _End()
        if s[i] == closer:
            return i + 1
        if s[i] != ",":
            raise _Bad()
        i += 1


def reference(data: bytes, top_object: bool = True) -> str:
    """'complete', 'prefix' (can still be completed) or 'invalid' for compact JSON ``data``."""
    pending = False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason != "unexpected end of data" or e.end != len(data):
            return "invalid"
        text, pending = data[:e.start].decode("utf-8"), True  # a character cut short, valid so far
    if top_object and text[:1] not in ("", "{") or not text and pending:
        return "invalid"
    try:
        end = _value(text, 0)
    except _End as e:
        return "prefix" if e.in_string or not pending else "invalid"
    except _Bad:
        return "invalid"
    if end < len(text) or pending:
        return "invalid"
    return "complete"

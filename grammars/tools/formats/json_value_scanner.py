"""Finds where one JSON value ends in a stream of characters, without parsing it.

The scanner tracks only what decides the end: whether it is inside a string, after a backslash,
and the nesting depth of objects and arrays. It does not validate; the grammar does that.
"""

from __future__ import annotations

SCALAR_TERMINATORS = frozenset(",}]")


class JsonValueScanner:
    """Feed one character at a time, starting with the value's first (non-whitespace) character."""

    __slots__ = ("_kind", "_depth", "_in_string", "_escape")

    def __init__(self) -> None:
        self._kind: str | None = None  # "container", "string" or "scalar" once the first char is seen
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, char: str) -> tuple[bool, bool]:
        """Returns (consumed, done). A scalar ends on a character that is not part of it: that
        character comes back unconsumed (consumed=False, done=True) for the caller to read again."""
        if self._kind is None:
            if char in "{[":
                self._kind, self._depth = "container", 1
            elif char == '"':
                self._kind, self._in_string = "string", True
            else:
                self._kind = "scalar"
            return True, False
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
                return True, self._kind == "string"
            return True, False
        if self._kind == "scalar":
            if char in SCALAR_TERMINATORS or char.isspace():
                return False, True
            return True, False
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            if self._depth == 0:
                return True, True
        return True, False

"""Errors raised by the grammars package.

Every error is a ``ValueError`` subclass so the server can turn it into a 400
response, and every message says what was wrong and how to fix it.
"""

from __future__ import annotations


class GrammarError(ValueError):
    """A constraint could not be built or was violated."""


class UnsupportedSchemaError(GrammarError):
    """A JSON schema uses a keyword the regex compiler would silently ignore.

    ``keyword`` is the offending keyword and ``path`` its JSON pointer in the schema.
    """

    def __init__(self, keyword: str, path: str, reason: str = "") -> None:
        self.keyword = keyword
        self.path = path
        detail = f" ({reason})" if reason else ""
        super().__init__(
            f"JSON schema keyword {keyword!r} at {path or '/'} is not supported for "
            f"constrained decoding{detail}; remove it from the schema or express the "
            f"constraint with supported keywords (type, properties, required, enum, const, "
            f"anyOf/oneOf/allOf, $ref, items, minItems/maxItems, minLength/maxLength, "
            f"pattern, format date/time/date-time/uuid/email/uri/byte, minimum/maximum next to "
            f"type integer/number), or list the keyword in "
            f"GrammarCompiler(ignore_keywords=...) to accept it unenforced."
        )


class CompileTimeout(GrammarError):
    """Compiling a grammar took longer than the compiler's time limit (the compile's own time, from
    when a worker took it; waiting for a free worker does not count)."""

    def __init__(self, limit_s: float, what: str = "grammar") -> None:
        self.limit_s = limit_s
        super().__init__(
            f"compiling the {what} took longer than the {limit_s:g} s limit; simplify the "
            f"schema (fewer alternatives, smaller bounds on minItems/maxItems/minLength/"
            f"maxLength, simpler patterns) or raise the limit with "
            f"GrammarCompiler(timeout_s=...) / the server's --grammar-timeout flag."
        )

"""GBNF, llama.cpp's grammar format, read into the regex the token index reads, where the grammar
is regular: rules are inlined into the rule `root`, so a rule that refers to itself (directly or
through others) is refused with a GbnfError naming the cycle; nested structures (JSON, arithmetic)
need the grammar engine this package does not have yet.

The notation: `name ::= alternatives` (names of letters, digits and `-`), sequences of string
literals ("..." with \\n \\t \\r \\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH escapes), character classes ([a-z],
[^...]), `.` (any character), rule names and ( ) groups, repeated with * + ? {m} {m,} {m,n} {,n};
`#` comments. The whole output matches `root`; no whitespace is implied.

`regexes()` gives two forms of one regex: the index's (every class and `.` leave out \\x02, the
index's own end mark, python_regex.py says why) and the one Python's `re` reads, which the output
check runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grammars.errors import GrammarError
from grammars.index.token_index import SENTINEL
from grammars.languages.python_regex import regex_char

MAX_REGEX = 200_000  # characters of the inlined regex: a grammar past it is refused, not compiled for minutes
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^", "/": "/"}


class GbnfError(GrammarError):
    """A GBNF grammar that cannot be read, or that is not regular."""


class NotRegularError(GbnfError):
    """A GBNF grammar whose rules refer to themselves: valid, but not enforced yet."""


@dataclass
class Parser:
    text: str
    at: int = 0

    def fail(self, why: str):
        line = self.text.count("\n", 0, self.at) + 1
        raise GbnfError(f"GBNF grammar, line {line}: {why}")

    def space(self) -> None:
        while self.at < len(self.text):
            c = self.text[self.at]
            if c == "#":
                end = self.text.find("\n", self.at)
                self.at = len(self.text) if end < 0 else end
            elif c.isspace():
                self.at += 1
            else:
                return

    def rule_starts(self) -> bool:
        """Whether a `name ::=` starts here (a new rule, which ends the expression before it)."""
        m = NAME.match(self.text, self.at)
        return bool(m) and self.text.startswith("::=", _skip_blank(self.text, m.end()))

    def rules(self) -> dict[str, tuple]:
        out = {}
        self.space()
        while self.at < len(self.text):
            m = NAME.match(self.text, self.at)
            if not m:
                self.fail(f"expected a rule name at {self.text[self.at:self.at + 20]!r}")
            self.at = _skip_blank(self.text, m.end())
            if not self.text.startswith("::=", self.at):
                self.fail(f"expected '::=' after rule name {m.group()!r}")
            self.at += 3
            if m.group() in out:
                self.fail(f"rule {m.group()!r} is defined twice")
            out[m.group()] = self.alternatives()
            self.space()
        return out

    def alternatives(self, nested: bool = False) -> tuple:
        options = [self.sequence(nested)]
        while self.at < len(self.text) and self.text[self.at] == "|":
            self.at += 1
            options.append(self.sequence(nested))
        return ("alt", options)

    def sequence(self, nested: bool) -> tuple:
        items = []
        while True:
            self.space()
            if self.at >= len(self.text) or self.text[self.at] in "|)" or (not nested and self.rule_starts()):
                return ("seq", items)
            items.append(self.repeat(self.atom()))

    def atom(self) -> tuple:
        c = self.text[self.at]
        if c == '"':
            return ("lit", self.literal())
        if c == "[":
            return self.char_class()
        if c == ".":
            self.at += 1
            return ("any",)
        if c == "(":
            self.at += 1
            inner = self.alternatives(nested=True)
            self.space()
            if self.at >= len(self.text) or self.text[self.at] != ")":
                self.fail("a '(' is not closed")
            self.at += 1
            return inner
        if c == "<":
            self.fail("token references (<...>) are not supported")
        m = NAME.match(self.text, self.at)
        if not m:
            self.fail(f"unexpected {c!r}")
        self.at = m.end()
        return ("ref", m.group())

    def repeat(self, item: tuple) -> tuple:
        if self.at >= len(self.text):
            return item
        c = self.text[self.at]
        if c in "*+?":
            self.at += 1
            return ("rep", item, {"*": 0, "+": 1, "?": 0}[c], 1 if c == "?" else None)
        if c == "{":
            end = self.text.find("}", self.at)
            body = self.text[self.at + 1:end].replace(" ", "") if end > 0 else ""
            m = re.fullmatch(r"(\d*)(,?)(\d*)", body)
            if end < 0 or not m or not (m.group(1) or m.group(3)):
                self.fail("a repetition is {m}, {m,}, {m,n} or {,n}")
            self.at = end + 1
            low = int(m.group(1) or 0)
            high = low if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
            if high is not None and high < low:
                self.fail(f"repetition {{{body}}} has its maximum below its minimum")
            return ("rep", item, low, high)
        return item

    def literal(self) -> str:
        self.at += 1
        out = []
        while True:
            if self.at >= len(self.text):
                self.fail("a string literal is not closed")
            c = self.text[self.at]
            if c == '"':
                self.at += 1
                return "".join(out)
            out.append(self.char())

    def char(self) -> str:
        if self.at >= len(self.text):
            self.fail("a string literal or character class is not closed")
        c = self.text[self.at]
        if c != "\\":
            self.at += 1
            return c
        kind = self.text[self.at + 1:self.at + 2]
        digits = {"x": 2, "u": 4, "U": 8}.get(kind)
        if digits:
            code = self.text[self.at + 2:self.at + 2 + digits]
            if len(code) != digits or not all(ch in "0123456789abcdefABCDEF" for ch in code):
                self.fail(f"bad escape \\{kind}{code}")
            self.at += 2 + digits
            return chr(int(code, 16))
        if kind not in ESCAPES:
            self.fail(f"unknown escape \\{kind}")
        self.at += 2
        return ESCAPES[kind]

    def char_class(self) -> tuple:
        self.at += 1
        negate = self.text.startswith("^", self.at)
        self.at += negate
        ranges = []
        while True:
            if self.at >= len(self.text):
                self.fail("a character class is not closed")
            if self.text[self.at] == "]":
                self.at += 1
                return ("class", negate, ranges)
            low = self.char()
            high = low
            if self.text.startswith("-", self.at) and not self.text.startswith("-]", self.at):
                self.at += 1
                high = self.char()
            if ord(high) < ord(low):
                self.fail(f"range {low!r}-{high!r} runs backwards")
            ranges.append((ord(low), ord(high)))


def _skip_blank(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t":
        at += 1
    return at


def regexes(text: str) -> tuple[str, str]:
    """(the token index's regex, Python's) of GBNF grammar `text`; raises GbnfError."""
    if not isinstance(text, str) or not text.strip():
        raise GbnfError("a GBNF grammar must be a non-empty string")
    rules = Parser(text).rules()
    if "root" not in rules:
        raise GbnfError("a GBNF grammar needs a rule named root (the whole output)")
    return _Emitter(rules, True).rule("root", ()), _Emitter(rules, False).rule("root", ())


@dataclass
class _Emitter:
    rules: dict
    index: bool  # the index's form: classes leave out the end mark

    def rule(self, name: str, path: tuple) -> str:
        if name not in self.rules:
            raise GbnfError(f"rule {name!r} is used but not defined")
        if name in path:
            cycle = " -> ".join((*path[path.index(name):], name))
            raise NotRegularError(f"rule {name!r} refers to itself ({cycle}): recursive grammars are not enforced yet; "
                            "write the repetition with * + ? or {m,n}")
        out = self.emit(self.rules[name], (*path, name))
        if len(out) > MAX_REGEX:
            raise GbnfError(f"the grammar inlined into one regex passes {MAX_REGEX} characters (at rule {name!r}); "
                            "use fewer nested references")
        return out

    def emit(self, node: tuple, path: tuple) -> str:
        kind = node[0]
        if kind == "alt":
            options = [self.emit(option, path) for option in node[1]]
            return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"
        if kind == "seq":
            return "".join(self.emit(item, path) for item in node[1])
        if kind == "lit":
            if chr(SENTINEL) in node[1]:
                raise GbnfError("a literal holds the control character \\x02, which cannot be generated")
            return "".join(regex_char(ord(c)) for c in node[1])
        if kind == "any":
            return f"[^{regex_char(SENTINEL)}]" if self.index else r"[\s\S]"
        if kind == "class":
            _, negate, ranges = node
            body = "".join(regex_char(lo) if lo == hi else f"{regex_char(lo)}-{regex_char(hi)}" for lo, hi in ranges)
            if negate:
                return f"[^{body}{regex_char(SENTINEL) if self.index else ''}]"
            return f"[{body}&&[^{regex_char(SENTINEL)}]]" if self.index else f"[{body}]"
        if kind == "ref":
            return "(?:" + self.rule(node[1], path) + ")"
        _, item, low, high = node  # rep
        bound = f"{{{low},}}" if high is None else f"{{{low},{high}}}"
        return "(?:" + self.emit(item, path) + ")" + bound

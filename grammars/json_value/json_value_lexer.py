r"""The byte-level lexical states of compact JSON and their one-byte transitions.

A JSON value automaton's runtime state is (q, stack): q is one of the lexical states below and
the stack holds the open containers (OBJECT or ARRAY), innermost last. The language is compact
JSON exactly as outlines-core's regexes write it with whitespace "": no whitespace between
tokens; strings ``"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"`` (no ``\u`` escapes; U+007F..U+009F
excluded) in strict UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF); numbers
``((-)?(0|[1-9][0-9]*))(\.[0-9]+)?([eE][+-][0-9]+)?`` (the exponent's sign is required);
``true``, ``false``, ``null``; objects with any string keys (duplicates too), arrays, ``{}``, ``[]``.

``TRANSITIONS[q][byte]`` is ``(op, arg, q2)``: REJECT, STEP to q2, PUSH container ``arg`` then
q2, POP container ``arg`` (it must be the innermost one) then q2, or COMMA (KEY if the innermost
container is an object, VALUE if an array; nothing at depth 0).  Whether a string is a key is
part of q (the K_* states), so the stack holds containers only.  Nesting is unbounded up to a
safety cap of MAX_DEPTH open containers: deeper, tokens that would open one more are masked.
``STRING_RUN`` matches a run of string content (whole characters and whole escapes) in one regex
call: the bulk of a vocabulary stays inside a string, and walking it byte by byte in Python would
be far too slow.  ``scan`` walks bytes from a (q, stack) state, for embedding the value elsewhere.
"""

from __future__ import annotations

import re

OBJECT, ARRAY = 0, 1  # container types on the stack
MAX_DEPTH = 256  # safety cap on open containers: past it, tokens that would open one more are masked
REJECT, STEP, PUSH, POP, COMMA = 0, 1, 2, 3, 4  # byte operations

# structural states
TOP_OBJECT = 0  # before the top-level object (OpenAI's json_object): only "{"
VALUE = 1  # a value expected
ARRAY_FIRST = 2  # after "[": a value or "]"
OBJECT_FIRST = 3  # after "{": a key or "}"
KEY = 4  # after "," in an object: a key
COLON = 5  # after a key: ":"
AFTER = 6  # after a value: "," or the innermost container's closer; at depth 0 the value is complete
# numbers
N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGITS = range(7, 15)
# literals, named by the text still to come
L_RUE, L_UE, L_E, L_ALSE, L_LSE, L_SE, L_ULL, L_LL, L_L = range(15, 24)
# strings: value strings (S_*) then key strings (K_*), each: body, after "\", and UTF-8 states
# C<n> (n continuation bytes to come) with the strict-UTF-8 range of the next one where narrowed
_STRING_PARTS = ("BODY", "ESC", "C1", "C1_A0", "C2", "C2_E0", "C2_ED", "C3", "C3_F0", "C3_F4")
S_BASE, K_BASE = 24, 24 + len(_STRING_PARTS)
NUM_STATES = K_BASE + len(_STRING_PARTS)
S_BODY, K_BODY = S_BASE, K_BASE
STRING_BODIES = (S_BODY, K_BODY)

COMPLETE = frozenset({AFTER, N_ZERO, N_INT, N_FRAC, N_EXP_DIGITS})  # complete at depth 0
NAMES = (["TOP_OBJECT", "VALUE", "ARRAY_FIRST", "OBJECT_FIRST", "KEY", "COLON", "AFTER",
          "N_MINUS", "N_ZERO", "N_INT", "N_DOT", "N_FRAC", "N_EXP", "N_EXP_SIGN", "N_EXP_DIGITS",
          "L_RUE", "L_UE", "L_E", "L_ALSE", "L_LSE", "L_SE", "L_ULL", "L_LL", "L_L"]
         + [f"S_{p}" for p in _STRING_PARTS] + [f"K_{p}" for p in _STRING_PARTS])

STRING_RUN = re.compile(
    rb'(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\/bfnrt]'
    rb"|\xc2[\xa0-\xbf]|[\xc3-\xdf][\x80-\xbf]"
    rb"|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]"
    rb"|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2})*"
)


def _span(lo: int, hi: int) -> range:
    return range(lo, hi + 1)


def _value_start(row: list) -> None:
    row[ord("{")] = (PUSH, OBJECT, OBJECT_FIRST)
    row[ord("[")] = (PUSH, ARRAY, ARRAY_FIRST)
    row[ord('"')] = (STEP, 0, S_BODY)
    row[ord("-")] = (STEP, 0, N_MINUS)
    row[ord("0")] = (STEP, 0, N_ZERO)
    for b in _span(ord("1"), ord("9")):
        row[b] = (STEP, 0, N_INT)
    row[ord("t")] = (STEP, 0, L_RUE)
    row[ord("f")] = (STEP, 0, L_ALSE)
    row[ord("n")] = (STEP, 0, L_ULL)


def _string_rows(table: list, base: int, end: int) -> None:
    """The ten states of one kind of string; ``end`` is the state after its closing quote."""
    body, esc, c1, c1_a0, c2, c2_e0, c2_ed, c3, c3_f0, c3_f4 = range(base, base + len(_STRING_PARTS))
    row = table[body]
    for b in list(_span(0x20, 0x7E)):
        row[b] = (STEP, 0, body)
    row[ord('"')] = (STEP, 0, end)
    row[ord("\\")] = (STEP, 0, esc)
    row[0xC2] = (STEP, 0, c1_a0)  # C2 80..9F would be U+0080..U+009F: excluded
    for lead, nxt in ((_span(0xC3, 0xDF), c1), ([0xE0], c2_e0), (_span(0xE1, 0xEC), c2), ([0xED], c2_ed),
                      (_span(0xEE, 0xEF), c2), ([0xF0], c3_f0), (_span(0xF1, 0xF3), c3), ([0xF4], c3_f4)):
        for b in lead:
            row[b] = (STEP, 0, nxt)
    for b in b'"\\/bfnrt':
        table[esc][b] = (STEP, 0, body)
    for state, lo, hi, nxt in ((c1, 0x80, 0xBF, body), (c1_a0, 0xA0, 0xBF, body), (c2, 0x80, 0xBF, c1),
                               (c2_e0, 0xA0, 0xBF, c1), (c2_ed, 0x80, 0x9F, c1), (c3, 0x80, 0xBF, c2),
                               (c3_f0, 0x90, 0xBF, c2), (c3_f4, 0x80, 0x8F, c2)):
        for b in _span(lo, hi):
            table[state][b] = (STEP, 0, nxt)


def _build_transitions() -> tuple[tuple[tuple[int, int, int], ...], ...]:
    dead = (REJECT, 0, 0)
    table = [[dead] * 256 for _ in range(NUM_STATES)]
    table[TOP_OBJECT][ord("{")] = (PUSH, OBJECT, OBJECT_FIRST)
    _value_start(table[VALUE])
    _value_start(table[ARRAY_FIRST])
    table[ARRAY_FIRST][ord("]")] = (POP, ARRAY, AFTER)
    table[OBJECT_FIRST][ord('"')] = (STEP, 0, K_BODY)
    table[OBJECT_FIRST][ord("}")] = (POP, OBJECT, AFTER)
    table[KEY][ord('"')] = (STEP, 0, K_BODY)
    table[COLON][ord(":")] = (STEP, 0, VALUE)
    table[AFTER][ord(",")] = (COMMA, 0, 0)
    table[AFTER][ord("}")] = (POP, OBJECT, AFTER)
    table[AFTER][ord("]")] = (POP, ARRAY, AFTER)
    digits = _span(ord("0"), ord("9"))
    table[N_MINUS][ord("0")] = (STEP, 0, N_ZERO)
    for b in _span(ord("1"), ord("9")):
        table[N_MINUS][b] = (STEP, 0, N_INT)
    for state in (N_ZERO, N_INT, N_FRAC, N_EXP_DIGITS):  # complete: any other byte ends the number
        table[state] = list(table[AFTER])
    for state, nxt in ((N_INT, N_INT), (N_DOT, N_FRAC), (N_FRAC, N_FRAC), (N_EXP_SIGN, N_EXP_DIGITS),
                       (N_EXP_DIGITS, N_EXP_DIGITS)):
        for b in digits:
            table[state][b] = (STEP, 0, nxt)
    for state in (N_ZERO, N_INT):
        table[state][ord(".")] = (STEP, 0, N_DOT)
    for state in (N_ZERO, N_INT, N_FRAC):
        table[state][ord("e")] = table[state][ord("E")] = (STEP, 0, N_EXP)
    table[N_EXP][ord("+")] = table[N_EXP][ord("-")] = (STEP, 0, N_EXP_SIGN)
    for state, char, nxt in ((L_RUE, "r", L_UE), (L_UE, "u", L_E), (L_E, "e", AFTER), (L_ALSE, "a", L_LSE),
                             (L_LSE, "l", L_SE), (L_SE, "s", L_E), (L_ULL, "u", L_LL), (L_LL, "l", L_L),
                             (L_L, "l", AFTER)):
        table[state][ord(char)] = (STEP, 0, nxt)
    _string_rows(table, S_BASE, AFTER)
    _string_rows(table, K_BASE, COLON)
    return tuple(tuple(row) for row in table)


TRANSITIONS = _build_transitions()
FIRST_BYTES = tuple(frozenset(b for b in range(256) if TRANSITIONS[q][b][0] != REJECT) for q in range(NUM_STATES))


def scan(state: tuple[int, tuple[int, ...]], data: bytes) -> tuple[tuple[int, tuple[int, ...]] | None, int]:
    """Walk ``data`` from ``state`` = (q, stack: container types, outermost first).

    Returns (new state, bytes consumed).  It stops right after the top-level value completes,
    returning (AFTER, ()), so a caller embedding a JSON value in a larger grammar can tell how many
    bytes of a token belong to the value; a top-level number completes before the first byte that
    cannot continue it (not consumed).  (None, i): byte i is not allowed there.
    """
    q, stack = state
    stack = list(stack)
    pos, n = 0, len(data)
    if q == AFTER and not stack:
        return (state, 0)
    while pos < n:
        if q in STRING_BODIES:
            pos = STRING_RUN.match(data, pos).end()
            if pos == n:
                break
        op, arg, q2 = TRANSITIONS[q][data[pos]]
        if not stack and q in COMPLETE and op in (REJECT, POP, COMMA):
            return ((AFTER, ()), pos)  # a top-level number ended at the byte before
        if op == REJECT:
            return (None, pos)
        if op == PUSH:
            if len(stack) >= MAX_DEPTH:
                return (None, pos)
            stack.append(arg)
        elif op == POP:
            if not stack or stack[-1] != arg:
                return (None, pos)
            stack.pop()
        elif op == COMMA:
            if not stack:
                return (None, pos)
            q2 = KEY if stack[-1] == OBJECT else VALUE
        q = q2
        pos += 1
        if q == AFTER and not stack:
            return ((AFTER, ()), pos)
    return ((q, tuple(stack)), pos)

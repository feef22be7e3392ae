"""Splits a model's streamed text into content and tool calls, incrementally.

One `StreamParser` per response: `feed(delta)` returns the events the new text completes,
`close()` the rest once the output has ended. Any split of the same text gives the same content
and the same calls. Text inside a call block is read one character at a time; text outside one
is searched for the opening delimiter, holding back a tail that may be the start of one.

Fallback for malformed blocks (possible when the output was not constrained): if the block breaks
before a call's name is complete, the raw text read since the last complete call (the opening
delimiter included) is released as `Content` and reading resumes as content at the character
that broke it. If it breaks after `CallStart`, the call is ended (`CallEnd`) with the arguments
read so far, and reading resumes as content. If the output ends inside a call, `close()` ends it.
Whitespace between call blocks and after the last one is dropped, not emitted as content.
"""

from __future__ import annotations

import json

from grammars.tools.formats.block_shape import BlockShape
from grammars.tools.formats.events import ArgsDelta, CallEnd, CallStart, Content, ParsedEvent
from grammars.tools.formats.json_value_scanner import SCALAR_TERMINATORS, JsonValueScanner

CONTENT = "content"
BLOCK_START, ITEM, OBJ_KEY, KEY, COLON, VALUE = "block_start", "item", "obj_key", "key", "colon", "value"
NAME, ARGS, SKIP, OBJ_NEXT, AFTER_ITEM, CLOSE_DELIM = "name", "args", "skip", "obj_next", "after_item", "close"


class MalformedBlock(Exception):
    """Internal: the call block does not have the format's shape at this character."""


class StreamParser:
    def __init__(self, shape: BlockShape) -> None:
        self._shape = shape
        self._state = CONTENT
        self._held = ""            # CONTENT text not yet released (partial delimiter or pending whitespace)
        self._at_start = True      # nothing released yet: a bare `{` may open a block
        self._after_call = False   # whitespace right after a block is dropped
        self._raw = ""             # block text since the last commit point, released on fallback
        self._commit = False       # the character being read completes a call or block: clear _raw after it
        self._calls = 0            # calls started so far; the next call's index
        self._call_open = False
        self._events: list[ParsedEvent] = []
        self._reset_object()

    # -- public -----------------------------------------------------------------------------------

    def feed(self, text: str) -> list[ParsedEvent]:
        buf, i = self._held + text, 0
        self._held = ""
        while i < len(buf):
            if self._state == CONTENT:
                i = self._read_content(buf, i)
                continue
            char = buf[i]
            try:
                consumed = self._read_block_char(char)
            except MalformedBlock:
                self._fall_back()
                continue  # read the same character again, as content
            if consumed:
                self._raw += char
                i += 1
            if self._commit:
                self._raw, self._commit = "", False
        return self._take_events()

    def close(self) -> list[ParsedEvent]:
        if self._state == CONTENT:
            # whitespace after a call block is dropped; a partial delimiter is text after all
            self._emit_content(self._held.lstrip() if self._after_call else self._held)
        elif self._call_open:
            self._end_call()
        elif self._state not in (AFTER_ITEM, CLOSE_DELIM):
            self._emit_content(self._raw)
        self._held, self._raw, self._state = "", "", CONTENT
        return self._take_events()

    # -- content outside calls ----------------------------------------------------------------------

    def _read_content(self, buf: str, i: int) -> int:
        """Reads buf from i in CONTENT state; returns where to continue (len(buf) when all is read)."""
        shape = self._shape
        if self._at_start or self._after_call:
            j = i
            while j < len(buf) and buf[j].isspace():
                j += 1
            rest = buf[j:]
            if not rest or (self._after_call and shape.open.startswith(rest)):
                self._held = buf[i:]
                return len(buf)
            if self._at_start and shape.bare_object_at_start and rest[0] == "{":
                self._at_start = False
                self._start_block("")
                return j
            if self._after_call and rest.startswith(shape.open):
                i = j  # drop the whitespace between blocks
            self._at_start = self._after_call = False
        k = buf.find(shape.open, i)
        if k >= 0:
            self._emit_content(buf[i:k])
            self._start_block(shape.open)
            return k + len(shape.open)
        keep = self._partial_delimiter_length(buf, i)
        self._emit_content(buf[i:len(buf) - keep])
        self._held = buf[len(buf) - keep:]
        return len(buf)

    def _partial_delimiter_length(self, buf: str, i: int) -> int:
        """Length of the longest tail of buf[i:] that is a proper prefix of the opening delimiter."""
        opening = self._shape.open
        for n in range(min(len(opening) - 1, len(buf) - i), 0, -1):
            if opening.startswith(buf[len(buf) - n:]):
                return n
        return 0

    # -- inside a call block --------------------------------------------------------------------------

    def _start_block(self, opening: str) -> None:
        self._state, self._raw, self._commit = BLOCK_START, opening, False
        self._at_start = self._after_call = False

    def _read_block_char(self, c: str) -> bool:
        """Advances the block state on c; False when c must be read again in the new state."""
        shape, state = self._shape, self._state
        if state in (ARGS, SKIP):
            consumed, done = self._scanner.feed(c)
            if consumed and state == ARGS:
                self._emit_args(c)
            if done:
                if state == ARGS:
                    self._args_seen = True
                self._state = OBJ_NEXT
            return consumed
        if state in (KEY, NAME):
            self._string_raw += c
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                try:
                    value = json.loads(self._string_raw)
                except ValueError:  # a bad escape or a raw control character
                    raise MalformedBlock from None
                self._finish_string(value)
            return True
        if state == CLOSE_DELIM:
            if c != shape.close[self._close_matched]:
                raise MalformedBlock
            self._close_matched += 1
            if self._close_matched == len(shape.close):
                self._end_block()
            return True
        if c.isspace():
            return True
        if state == BLOCK_START:
            if shape.list_open is None:
                self._state = ITEM
                return False
            self._expect(c, shape.list_open)
            self._state = ITEM
        elif state == ITEM:
            self._expect(c, "{")
            self._reset_object()
            self._state = OBJ_KEY
        elif state == OBJ_KEY:
            if c == "}":
                self._end_object()
            else:
                self._expect(c, '"')
                self._begin_string(KEY)
        elif state == COLON:
            self._expect(c, ":")
            self._state = VALUE
        elif state == VALUE:
            return self._begin_value(c)
        elif state == OBJ_NEXT:
            if c == "}":
                self._end_object()
            else:
                self._expect(c, ",")
                self._state = OBJ_KEY
        elif state == AFTER_ITEM:
            return self._after_item(c)
        return True

    def _after_item(self, c: str) -> bool:
        shape = self._shape
        if shape.separator is not None and c == shape.separator:
            self._state = ITEM
        elif shape.list_close is not None:
            self._expect(c, shape.list_close)
            if shape.close is None:
                self._end_block()
            else:
                self._state, self._close_matched = CLOSE_DELIM, 0
        elif shape.close is not None:
            self._state, self._close_matched = CLOSE_DELIM, 0
            return False
        else:  # the block ends at the end of the output; text after it is content
            self._state, self._commit = CONTENT, True
            return False
        return True

    def _begin_value(self, c: str) -> bool:
        if c in SCALAR_TERMINATORS:
            raise MalformedBlock
        if self._key in self._shape.name_keys and self._name is None:
            self._expect(c, '"')
            self._begin_string(NAME)
            return True
        if self._key in self._shape.args_keys and not self._args_seen:
            self._state = ARGS
        else:
            self._state = SKIP
        self._scanner = JsonValueScanner()
        return False

    def _begin_string(self, state: str) -> None:
        self._state, self._string_raw, self._escape = state, '"', False

    def _finish_string(self, value: str) -> None:
        if self._state == KEY:
            self._key, self._state = value, COLON
            return
        self._name, self._state = value, OBJ_NEXT
        self._events.append(CallStart(self._calls, value))
        self._call_open, self._commit = True, True
        if self._args_pending:
            self._emit_args("".join(self._args_pending))
            self._args_pending = []

    def _end_object(self) -> None:
        if self._name is None:
            raise MalformedBlock
        if not self._args_seen:
            self._emit_args("{}")
        self._end_call()
        self._state = AFTER_ITEM

    def _end_call(self) -> None:
        self._events.append(CallEnd(self._calls))
        self._calls += 1
        self._call_open, self._commit = False, True

    def _end_block(self) -> None:
        self._state, self._commit, self._after_call = CONTENT, True, True

    def _fall_back(self) -> None:
        if self._call_open:
            self._end_call()
        else:
            self._emit_content(self._raw)
        self._state, self._raw, self._commit = CONTENT, "", False

    def _reset_object(self) -> None:
        self._key: str | None = None
        self._name: str | None = None
        self._args_seen = False
        self._args_pending: list[str] = []
        self._string_raw, self._escape = "", False
        self._scanner = JsonValueScanner()
        self._close_matched = 0

    @staticmethod
    def _expect(c: str, wanted: str) -> None:
        if c != wanted:
            raise MalformedBlock

    # -- events -------------------------------------------------------------------------------------

    def _emit_content(self, text: str) -> None:
        if not text:
            return
        self._at_start = False
        if self._events and isinstance(self._events[-1], Content):
            self._events[-1] = Content(self._events[-1].text + text)
        else:
            self._events.append(Content(text))

    def _emit_args(self, text: str) -> None:
        if not self._call_open:
            self._args_pending.append(text)
            return
        last = self._events[-1] if self._events else None
        if isinstance(last, ArgsDelta) and last.index == self._calls:
            self._events[-1] = ArgsDelta(self._calls, last.text + text)
        else:
            self._events.append(ArgsDelta(self._calls, text))

    def _take_events(self) -> list[ParsedEvent]:
        events, self._events = self._events, []
        return events


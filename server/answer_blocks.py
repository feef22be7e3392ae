"""Output parts grouped into blocks, as the Messages and Responses APIs present an answer.

Both APIs show an answer as a list of blocks (Anthropic's content blocks, the Responses API's
output items): thinking, text, and one block per tool call. `BlockBuilder` turns the parts of
server/output_stream.py into open / delta / close events over those blocks; a streaming adapter
sends them as they come, a non-streaming one replays the same events into a list, so both give
the same blocks. Text that is only whitespace (the newlines a model writes between calls) opens
no block: it is held until text that is not whitespace follows it, and dropped otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from grammars import ArgsDelta, CallEnd, CallStart, Content
from server.output_stream import Finish, Reasoning, failure


@dataclass(frozen=True)
class Open:
    index: int  # position among the answer's blocks
    kind: str  # reasoning | text | call
    name: str | None = None  # the tool's name, for calls


@dataclass(frozen=True)
class Delta:
    index: int
    text: str


@dataclass(frozen=True)
class Close:
    index: int


BlockEvent = Union[Open, Delta, Close]


@dataclass
class Block:
    kind: str
    name: str | None = None
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class BlockBuilder:
    def __init__(self):
        self.count = 0  # blocks opened so far
        self._open: tuple[int, str] | None = None  # (index, kind) of the block open now
        self._held = ""  # whitespace-only text not yet shown

    def feed(self, parts: list) -> list[BlockEvent]:
        out: list[BlockEvent] = []
        for part in parts:
            if isinstance(part, Reasoning):
                self._write(out, "reasoning", part.text)
            elif isinstance(part, Content):
                if self._open is None or self._open[1] != "text":
                    if not (self._held + part.text).strip():
                        self._held += part.text
                        continue
                    part = Content(self._held + part.text)
                    self._held = ""
                self._write(out, "text", part.text)
            elif isinstance(part, CallStart):
                self._close(out)
                self._held = ""
                self._open = (self.count, "call")
                out.append(Open(self.count, "call", part.name))
                self.count += 1
            elif isinstance(part, ArgsDelta) and self._open is not None and part.text:
                out.append(Delta(self._open[0], part.text))
            elif isinstance(part, CallEnd):
                self._close(out)
        return out

    def finish(self) -> list[BlockEvent]:
        out: list[BlockEvent] = []
        self._close(out)
        return out

    def _write(self, out: list[BlockEvent], kind: str, text: str) -> None:
        if self._open is None or self._open[1] != kind:
            self._close(out)
            self._open = (self.count, kind)
            out.append(Open(self.count, kind))
            self.count += 1
        out.append(Delta(self._open[0], text))

    def _close(self, out: list[BlockEvent]) -> None:
        if self._open is not None:
            out.append(Close(self._open[0]))
            self._open = None


def replay(events: list[BlockEvent]) -> list[Block]:
    """The blocks a list of events describes."""
    blocks: list[Block] = []
    for event in events:
        if isinstance(event, Open):
            blocks.append(Block(event.kind, event.name))
        elif isinstance(event, Delta):
            blocks[event.index].pieces.append(event.text)
    return blocks


async def collect_blocks(stream) -> tuple[list[Block], Finish]:
    """Reads a step stream to its end into blocks; a failed generation raises its APIError (500; 504
    past the deadline)."""
    builder, events, finish = BlockBuilder(), [], None
    try:
        steps = [step async for step in stream]
    finally:
        await stream.aclose()  # a cancelled request (client gone) cancels its engine request now
    for step in steps:
        events += builder.feed(step.parts)
        finish = step.finish or finish
    events += builder.finish()
    if finish.reason == "error":
        raise failure(finish)
    return replay(events), finish

"""The events a tool-call stream parser emits, in the order the text produced them.

For one response the events read as: `Content` runs of plain text, and for each call, in order,
`CallStart(index, name)`, zero or more `ArgsDelta(index, text)` and `CallEnd(index)`. Indices are
0-based and contiguous over the whole response. The `ArgsDelta` texts of one call concatenate to
exactly the arguments JSON text the model wrote (no surrounding whitespace, never the wrapper's `}`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Content:
    """Text outside tool calls. Never contains an opening delimiter of a well-formed call."""
    text: str


@dataclass(frozen=True)
class CallStart:
    """A call's name is complete; its arguments follow as `ArgsDelta`s."""
    index: int
    name: str


@dataclass(frozen=True)
class ArgsDelta:
    """A fragment of the arguments JSON text of call `index`."""
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    """Call `index` is complete (or the output ended inside it: then its arguments may be cut short)."""
    index: int


ParsedEvent = Union[Content, CallStart, ArgsDelta, CallEnd]

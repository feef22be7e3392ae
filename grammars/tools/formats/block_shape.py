"""What the text of a tool-call block looks like to the stream parser, per format.

A block starts at the opening delimiter (or, where `bare_object_at_start`, at a `{` that is the
first non-whitespace character of the reply). Inside it: optional `list_open`, one or more call
objects separated by `separator`, optional `list_close`, then `close` if the format has one.
Each call object is a JSON object with the name under one of `name_keys` and the arguments under
one of `args_keys`; other keys (e.g. an `id`) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockShape:
    open: str
    close: str | None = None
    list_open: str | None = None
    list_close: str | None = None
    separator: str | None = None
    bare_object_at_start: bool = False
    name_keys: tuple[str, ...] = ("name",)
    args_keys: tuple[str, ...] = ("arguments", "parameters")

    def __post_init__(self) -> None:
        if not self.open:
            raise ValueError("BlockShape.open must be a non-empty delimiter, e.g. '<tool_call>'")
        if (self.list_open is None) != (self.list_close is None):
            raise ValueError("BlockShape needs both list_open and list_close, or neither")

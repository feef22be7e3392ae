"""`ToolFormat`: what one model family's tool calling looks like, end to end.

A format renders tools and past calls into the prompt (`prepare_messages`), names the delimiters
of a call block (`open`, `close`, `open_text()`), builds the regex of a call block
(`call_block_regex`), and reads calls back out of the output (`stream_parser()`, `parse()`).
Subclasses fill in the family specifics; everything here is shared.
"""

from __future__ import annotations

import copy
import json
import secrets
import string
from abc import ABC, abstractmethod

from grammars.tools.formats.block_shape import BlockShape
from grammars.tools.formats.call_regex import ArgsRegex, call_alternatives
from grammars.tools.formats.events import ArgsDelta, CallStart, Content
from grammars.tools.formats.stream_parser import StreamParser

ALPHANUMERIC = string.ascii_letters + string.digits


def random_alphanumeric(length: int) -> str:
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(length))


def arguments_object(arguments):
    """A call's `arguments` as the object chat templates apply `tojson` to.

    A JSON string becomes its value; an empty or missing one becomes {}; a string that is not JSON
    (e.g. a call cut short by max_tokens) is kept as the string, so the template still renders.
    """
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class ToolFormat(ABC):
    name: str
    shape: BlockShape

    @property
    def open(self) -> str:
        """The delimiter that opens a call block in the output."""
        return self.shape.open

    @property
    def close(self) -> str | None:
        """The delimiter that closes one call block, or None where the block ends at EOS."""
        return self.shape.close

    @property
    def call_may_open_reply(self) -> bool:
        """True where a reply whose first non-whitespace character is `{` is a call without any
        delimiter (llama3_json): a lazy constraint must then also arm on that `{`."""
        return self.shape.bare_object_at_start

    def open_text(self) -> str:
        """The text a caller forces before the block in required/named modes: the whole assistant
        output is then `open_text() + <text matching call_block_regex(...)>`, then EOS."""
        return self.shape.open

    # -- grammar ------------------------------------------------------------------------------------

    def call_block_regex(self, tools: list[dict] | None, args_regex: ArgsRegex, parallel: bool = False,
                         forced_name: str | None = None) -> str:
        """The regex of everything after the opening delimiter up to the end of the assistant turn.

        `args_regex(parameters_schema) -> str` gives the regex of one tool's arguments object.
        One call, or one or more when `parallel`, to one of `tools` (only `forced_name` if given).
        Raises ToolFormatError for bad tools or an unknown `forced_name`.
        """
        call = call_alternatives(tools, args_regex, forced_name, self.call_object_regex)
        return self._block_regex(call, parallel)

    @abstractmethod
    def call_object_regex(self, name_re: str, args_re: str) -> str:
        """The regex of one call object, given its escaped JSON name and its arguments regex."""

    @abstractmethod
    def _block_regex(self, call_re: str, parallel: bool) -> str:
        """The block regex around the call-object alternatives."""

    # -- parsing ------------------------------------------------------------------------------------

    def stream_parser(self) -> StreamParser:
        return StreamParser(self.shape)

    def parse(self, text: str) -> tuple[str | None, list[tuple[str, str]]]:
        """The whole output at once: (content, or None when there is none; [(name, arguments JSON)])."""
        parser = self.stream_parser()
        events = parser.feed(text) + parser.close()
        content = "".join(e.text for e in events if isinstance(e, Content))
        names: dict[int, str] = {}
        args: dict[int, list[str]] = {}
        for event in events:
            if isinstance(event, CallStart):
                names[event.index], args[event.index] = event.name, []
            elif isinstance(event, ArgsDelta):
                args[event.index].append(event.text)
        return (content or None), [(names[i], "".join(args[i])) for i in sorted(names)]

    def new_call_id(self) -> str:
        """A fresh id for a call in the response: `call_` and 24 random alphanumerics."""
        return "call_" + random_alphanumeric(24)

    # -- rendering ----------------------------------------------------------------------------------

    def prepare_messages(self, messages: list[dict], tools: list[dict] | None, template_supports_tools: bool,
                         *, chat_template: str | None = None) -> tuple[list[dict], list[dict] | None]:
        """(messages, tools) for `tokenizer.apply_chat_template(messages, tools=tools, ...)`.

        With a template that knows tools, the tools pass through and each past call's `arguments`
        becomes an object; otherwise the format renders tools and calls as text itself and returns
        tools=None. The caller's dicts are never changed; the same input gives the same output.
        `chat_template`, when given, lets a format choose roles the template knows (llama3_json).
        """
        if template_supports_tools:
            return self._template_messages(messages), (copy.deepcopy(tools) if tools else None)
        return self._builtin_messages(copy.deepcopy(messages), tools or None, chat_template), None

    def _template_messages(self, messages: list[dict]) -> list[dict]:
        out = []
        for message in messages:
            message = copy.deepcopy(message)
            if message.get("tool_calls"):
                calls = []
                for call in message["tool_calls"]:
                    function = dict(call.get("function") or {})
                    function["arguments"] = arguments_object(function.get("arguments"))
                    call = {**call, "function": function}
                    if call.get("id") is not None:
                        call["id"] = self.map_call_id(call["id"])
                    calls.append(call)
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls", None)  # templates test `'tool_calls' in message`
            if message.get("tool_call_id") is not None:
                message["tool_call_id"] = self.map_call_id(message["tool_call_id"])
            out.append(message)
        return out

    def map_call_id(self, call_id: str | None) -> str | None:
        """The id the model's template sees for a client's call id (unchanged unless overridden)."""
        return call_id

    @abstractmethod
    def _builtin_messages(self, messages: list[dict], tools: list[dict] | None,
                          chat_template: str | None) -> list[dict]:
        """Messages with tools, past calls and tool results rendered as text in the family's style."""

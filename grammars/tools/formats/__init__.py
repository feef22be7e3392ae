"""Tool-call formats by model family: `get_tool_format(name)`.

Known formats: `hermes` (Qwen2.5, Hermes: <tool_call>...</tool_call>), `llama3_json` (Llama 3.1 JSON
calls, optionally after <|python_tag|>), `mistral` ([TOOL_CALLS] [...]).
"""

from __future__ import annotations

from grammars.tools.formats.base import ToolFormat, arguments_object
from grammars.tools.formats.call_regex import NO_PARAMETERS_SCHEMA, ToolFormatError
from grammars.tools.formats.events import ArgsDelta, CallEnd, CallStart, Content, ParsedEvent
from grammars.tools.formats.hermes import HermesFormat
from grammars.tools.formats.llama3_json import Llama3JsonFormat
from grammars.tools.formats.mistral import MistralFormat
from grammars.tools.formats.stream_parser import StreamParser

TOOL_FORMATS: dict[str, ToolFormat] = {fmt.name: fmt for fmt in (HermesFormat(), Llama3JsonFormat(), MistralFormat())}


def get_tool_format(name: str) -> ToolFormat:
    """The format registered under `name`; formats are stateless, so one instance serves all requests."""
    try:
        return TOOL_FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_FORMATS))
        raise ToolFormatError(f"unknown tool format {name!r}; set the model's `tool_format` in models.yaml to one of: {known}") from None


__all__ = ["ArgsDelta", "CallEnd", "CallStart", "Content", "NO_PARAMETERS_SCHEMA", "ParsedEvent", "StreamParser",
           "TOOL_FORMATS", "ToolFormat", "ToolFormatError", "arguments_object", "get_tool_format"]

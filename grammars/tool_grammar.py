"""The grammar of a tool-call turn, split where outlines-core's index needs it split.

A turn with calls is: OPEN, then a block matching `inner` (compiled to a token index), then CLOSE;
with parallel calls, further blocks follow, each after SEPARATOR + OPEN. Only `inner` goes through
outlines-core. The delimiters are forced token by token (so a delimiter that is one added token,
as Qwen's `<tool_call>`, is written as that token), and the repetition of blocks is driven by the
constraint rather than by a regex: outlines-core 0.2.14 drops transitions out of an accepting state
(`a(;b)*` rejects `a;b`), which would forbid every call after the first.
"""

from __future__ import annotations

from dataclasses import dataclass

from grammars.tool_formats import get_tool_format
from grammars.tool_formats.call_regex import ArgsRegex, call_alternatives


@dataclass(frozen=True)
class ToolGrammar:
    format: str
    open: str  # forced before the first block in required/named modes ("" where the format has none)
    trigger: str  # the text that arms the constraint in auto mode
    bare_object_at_start: bool  # auto mode also arms on a reply that opens with `{` (llama3_json)
    inner: str  # regex of one block between OPEN and CLOSE
    close: str  # forced after each block ("" where none)
    separator: str | None  # between blocks; None: one block only (parallel calls off, or one list)
    parallel: bool


def tool_grammar(format_name: str, tools: list[dict], args_regex: ArgsRegex, parallel: bool,
                 forced_name: str | None = None) -> ToolGrammar:
    fmt = get_tool_format(format_name)
    call = call_alternatives(tools, args_regex, forced_name, fmt._call_object_regex)
    if format_name == "hermes":
        return ToolGrammar("hermes", "<tool_call>", "<tool_call>", False, r"\n" + call + r"\n",
                           "</tool_call>", "\n" if parallel else None, parallel)
    if format_name == "llama3_json":
        return ToolGrammar("llama3_json", "", fmt.open, True, call, "", "; " if parallel else None, parallel)
    if format_name == "mistral":  # one JSON list holds every call: no repetition of blocks needed
        return ToolGrammar("mistral", fmt.open, fmt.open, False, fmt._block_regex(call, parallel), "",
                           None, parallel)
    raise ValueError(f"tool format {format_name!r} has no grammar plan; add one in grammars/tool_grammar.py")

"""The grammar of a tool-call turn, split into units: one per tool, plus delimiters the constraint forces.

A turn with calls is: OPEN, then a block, then CLOSE; with parallel calls, further blocks follow,
each after SEPARATOR (+ OPEN). A block is one call to one tool, so each tool's block is its own
regex (`units`, one per tool): compiled and cached by its own text, it is shared by every request
that sends that tool, whatever else the tool list holds. The constraint chooses among the units
at run time (grammars/match/unit_union.py). The delimiters are forced token by token (so a delimiter that
is one added token, as Qwen's `<tool_call>`, is written as that token), and the repetition of
blocks is driven by the constraint rather than by a regex: outlines-core 0.2.14 drops transitions
out of an accepting state (`a(;b)*` rejects `a;b`), which would forbid every call after the first.

Mistral writes all calls in one JSON list: its first block opens the list (` [`), later blocks
follow `, `, and `]` (`end`) is forced after the last one; with one call only, the list's `]` is
part of the unit, so `}]` stays one token.
"""

from __future__ import annotations

from dataclasses import dataclass

from grammars.tools.formats import get_tool_format
from grammars.tools.formats.call_regex import ArgsRegex, chosen_specs, name_regex


@dataclass(frozen=True)
class ToolGrammar:
    format: str
    open: str  # forced before the first block in required/named modes ("" where the format has none)
    trigger: str  # the text that arms the constraint in auto mode
    bare_object_at_start: bool  # auto mode also arms on a reply that opens with `{` (llama3_json)
    names: tuple[str, ...]  # the tools a block may call, in the request's order
    units: tuple[str, ...]  # per tool: the regex of a first block between OPEN and CLOSE
    next_units: tuple[str, ...]  # per tool: the regex of a later block (== units except for mistral)
    close: str  # forced after each block ("" where none)
    separator: str | None  # between blocks; None: one block only (parallel calls off)
    end: str  # forced after the last block ("" where none)
    parallel: bool


def tool_grammar(format_name: str, tools: list[dict], args_regex: ArgsRegex, parallel: bool,
                 forced_name: str | None = None) -> ToolGrammar:
    fmt = get_tool_format(format_name)
    specs = chosen_specs(tools, forced_name)
    names = tuple(name for name, _ in specs)
    calls = [fmt.call_object_regex(name_regex(name), args_regex(parameters)) for name, parameters in specs]
    if format_name == "hermes":
        units = tuple(r"\n" + call + r"\n" for call in calls)
        return ToolGrammar("hermes", "<tool_call>", "<tool_call>", False, names, units, units,
                           "</tool_call>", "\n" if parallel else None, "", parallel)
    if format_name == "llama3_json":
        units = tuple(calls)
        return ToolGrammar("llama3_json", "", fmt.open, True, names, units, units, "",
                           "; " if parallel else None, "", parallel)
    if format_name == "mistral":
        if not parallel:
            units = tuple(r" ?\[" + call + r"\]" for call in calls)
            return ToolGrammar("mistral", fmt.open, fmt.open, False, names, units, units, "", None, "", False)
        return ToolGrammar("mistral", fmt.open, fmt.open, False, names, tuple(r" ?\[" + call for call in calls),
                           tuple(calls), "", ", ", "]", True)
    raise ValueError(f"tool format {format_name!r} has no grammar plan; add one in grammars/tools/tool_grammar.py")


@dataclass(frozen=True)
class ToolTokens:
    """The delimiters of a tool grammar as token ids of this tokenizer."""
    open: tuple[int, ...]
    close: tuple[int, ...]
    separator: tuple[int, ...] | None  # SEPARATOR + OPEN; None: one block only
    end: tuple[int, ...] = ()  # after the last block (mistral's `]`)


def tool_tokens(tokenizer, open_text: str, close_text: str, separator: str | None, end: str = "") -> ToolTokens:
    """The delimiters as this tokenizer writes them (an added token such as `<tool_call>` stays whole).
    Where the format has an `end` (mistral's list), later blocks follow the separator alone."""
    def encode(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False)) if text else ()
    following = "" if end else open_text
    return ToolTokens(open=encode(open_text), close=encode(close_text),
                      separator=encode(separator + following) if separator is not None else None, end=encode(end))

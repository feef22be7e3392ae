"""ToolCall: a request's tool calls, built once and shared read-only by its rows: the call
tokens, trigger masks and units (compiling), from which `row()` makes each row's constraint.

Built by `GrammarCompiler.tool_call` from the request's tools (their arguments' regexes already
made), the tool choice and the model's call format: each tool is one unit, so only tools not
compiled before cost a compile. The server waits on `units` (and `later`) and hands the results
to `attach` for each row; where the call may start before its units are compiled (name first,
grammars/tools/name_stage.py), `name_first` attaches the name stage instead.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable
from dataclasses import dataclass

from grammars.masks.trigger_mask import trigger_masks
from grammars.match.unit_union import UnitUnion
from grammars.tools.name_stage import name_stage
from grammars.tools.tool_constraint import ToolCallConstraint
from grammars.tools.tool_grammar import tool_grammar, tool_tokens


@dataclass
class ToolCall:
    row: Callable[[], ToolCallConstraint]  # a row's constraint: its own state over the shared tokens, masks, units
    names: tuple[str, ...]  # per unit: its tool's name
    positions: tuple[int, ...]  # per unit: its tool's position in the request's tools
    units: list[concurrent.futures.Future]  # CompiledGrammar per first-block unit
    later: list[concurrent.futures.Future] | None  # the same for later blocks (mistral), or None: the same units
    regexes: tuple[str, ...]  # per first-block unit
    keep: frozenset[int]  # special tokens of the call's delimiters, kept in the text
    name_first_ok: bool  # a required call whose units may not all be compiled yet
    prefer: Callable[..., None]  # the compiler's prefer(regex, now)
    _stage: object = None  # the name stage, built once for the rows (False: none can be built)
    _unions: tuple | None = None  # (first, later) UnitUnions, built once for the rows

    def name_first(self, constraint: ToolCallConstraint, vocabulary, budget: int | None, room: int) -> bool:
        """Whether the row may start before its units are compiled; then the server waits on them
        beside it. Builds the name stage for the first row (slow: call it off the event loop)."""
        if not self.name_first_ok or all(f.done() for f in self.units) or \
                any(f.done() and f.exception() is not None for f in self.units):  # known bad: the error now
            return False
        if self._stage is None:
            self._stage = name_stage(vocabulary, list(self.regexes), self.units, self.prefer) or False
        return self._stage is not False and constraint.attach_stage(self._stage, budget, room)

    def hurry(self) -> None:
        """The request waits on its units now: those submitted as background compiles (name first
        allowed them) compile as needed ones, not in the engine's idle time."""
        if self.name_first_ok:
            for regex in self.regexes:
                self.prefer(regex, now=False)

    def attach(self, constraint: ToolCallConstraint, first: list, later: list | None) -> None:
        """Gives a row the compiled units (CompiledGrammar, in the order of `units` and `later`)."""
        if self._unions is None:
            self._unions = (UnitUnion(first), UnitUnion(later) if later else None)
        constraint.attach(*self._unions)


def build_tool_call(compiler, tokenizer, tool_format: str, tools: list[dict], regex_of: Callable[[dict], str],
                    mode: str, name: str | None, parallel: bool,
                    on_compiled: Callable[[], None] | None = None) -> ToolCall:
    """GrammarCompiler.tool_call's work: mode auto | required | named (`name`); `regex_of` gives a
    tool's arguments regex from its parameters schema. Raises ToolFormatError for tools the format
    cannot write. A named choice is exactly one call of that tool, as in vLLM and SGLang (a tool with
    side effects must not run twice), whatever `parallel` says."""
    parallel = parallel and mode != "named"
    grammar = tool_grammar(tool_format, tools, regex_of, parallel, name)
    # a required call over several tools may start before its units are compiled (name first): until a
    # tool is chosen its units compile in the background, in the engine's idle time
    name_first_ok = mode == "required" and grammar.next_units == grammar.units and len(grammar.units) > 1
    units = [compiler.submit_regex(regex, background=name_first_ok) for regex in grammar.units]
    later = [compiler.submit_regex(regex) for regex in grammar.next_units] \
        if grammar.next_units != grammar.units else None
    if on_compiled is not None:
        for future in units + (later or []):
            future.add_done_callback(lambda _: on_compiled())
    tokens = tool_tokens(tokenizer, grammar.open, grammar.close, grammar.separator, grammar.end)
    trigger, tokens_of_trigger = None, set()
    if mode == "auto":
        trigger_ids = tuple(tokenizer.encode(grammar.trigger, add_special_tokens=False))
        single = trigger_ids if len(trigger_ids) == 1 else ()
        trigger = trigger_masks(compiler.vocabulary, grammar.trigger, single)
        tokens_of_trigger = set(single)
    keep = (set(tokens.open) | set(tokens.close) | set(tokens.separator or ()) | set(tokens.end)
            | tokens_of_trigger) & set(tokenizer.all_special_ids)
    row = functools.partial(ToolCallConstraint, tokens, required=mode != "auto", vocabulary=compiler.vocabulary,
                            trigger=trigger, bare_object_at_start=grammar.bare_object_at_start)
    names = [tool["function"]["name"] for tool in tools]
    return ToolCall(row, grammar.names, tuple(names.index(n) for n in grammar.names), units, later,
                    grammar.units, frozenset(keep), name_first_ok, compiler.prefer)

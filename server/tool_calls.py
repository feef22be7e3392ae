"""Tools, whichever API sent them: the call constraint built from per-tool grammar units."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from grammars import GrammarError, UnsupportedSchemaError
from grammars.tools.name_stage import name_stage
from grammars.tools.tool_constraint import ToolCallConstraint
from grammars.tools.formats import get_tool_format
from grammars.tools.formats.base import ToolFormat
from grammars.tools.formats.call_regex import NO_PARAMETERS_SCHEMA, ToolFormatError, chosen_specs
from grammars.tools.tool_grammar import tool_grammar, tool_tokens
from grammars.masks.trigger_mask import trigger_masks
from grammars.match.unit_union import UnitUnion
from server.errors import APIError
from server.schema_check import check_schema
from server.state import ServerState


@dataclass
class ToolChoice:
    mode: str  # none | auto | required | named
    name: str | None = None


async def _args_regexes(state: ServerState, tools: list[dict], forced_name: str | None, fields) -> dict[int, str]:
    """Each chosen tool's arguments regex, by id of its schema; built in the compile workers under the
    limit (side by side), and a schema error names the tool it came from."""
    try:
        specs = chosen_specs(tools, forced_name)
    except ToolFormatError as exc:
        raise APIError(str(exc), param=fields.tools) from exc
    positions = {id(t["function"].get("parameters") or NO_PARAMETERS_SCHEMA): i for i, t in enumerate(tools)}

    def check_shapes() -> None:  # the schema's shape first: a wrong one would compile to a grammar no output fits
        for _, schema in specs:
            position = positions.get(id(schema))
            check_schema(schema, fields.tool_schema.format(i=position) if position is not None else fields.tools)
    await asyncio.to_thread(check_shapes)  # off the event loop: a big tool list takes ~0.1 s per 700 KB

    async def one(schema: dict) -> str:
        try:
            return await state.compiler.schema_regex_async(schema)  # free-form values: the automaton's holes
        except GrammarError as exc:
            position = positions.get(id(schema))
            param = fields.tool_schema.format(i=position) if position is not None else fields.tools
            code = "unsupported_schema" if isinstance(exc, UnsupportedSchemaError) else "invalid_schema"
            raise APIError(str(exc), param=param, code=code) from exc
    schemas = [schema for _, schema in specs]
    return dict(zip(map(id, schemas), await asyncio.gather(*(one(schema) for schema in schemas))))


@dataclass
class PendingTools:
    """A tool constraint whose units are compiling: ``wait()`` attaches them, or raises the 400."""
    constraint: ToolCallConstraint
    names: tuple[str, ...]
    positions: tuple[int, ...]  # per unit: its tool's position in `tools`
    units: list  # concurrent.futures.Future[CompiledGrammar] per first-block unit
    later: list | None  # the same for later blocks (mistral), or None: the same units
    fields: object  # generation.Fields: how the API names the tools' schemas
    regexes: tuple[str, ...] = ()  # per first-block unit
    name_first_ok: bool = False  # a required call whose units may not all be compiled yet
    prefer: Callable[..., None] | None = None  # the compiler's prefer(regex, now)

    async def name_first(self, state: ServerState, budget: int | None, room: int) -> bool:
        """Whether the request may start before its units are compiled (grammars/tools/name_stage.py);
        then ``wait()`` runs beside it. The stage is built here, while the prompt prefills."""
        if not self.name_first_ok or all(f.done() for f in self.units) or \
                any(f.done() and f.exception() is not None for f in self.units):  # known bad: the 400 now
            return False
        stage = await asyncio.to_thread(name_stage, state.vocabulary, list(self.regexes), self.units,
                                        state.compiler.prefer)
        return stage is not None and self.constraint.attach_stage(stage, budget, room)

    def hurry(self) -> None:
        """The request waits on its units now: those submitted as background compiles (name first
        allowed them) compile as needed ones, not in the engine's idle time."""
        if self.name_first_ok:
            for regex in self.regexes:
                self.prefer(regex, now=False)

    async def wait(self) -> None:
        first = [await self._result(f, i) for i, f in enumerate(self.units)]
        later = [await self._result(f, i) for i, f in enumerate(self.later)] if self.later else None
        self.constraint.attach(UnitUnion(first), UnitUnion(later) if later else None)

    async def _result(self, future, i: int):
        try:
            return await asyncio.wrap_future(future)
        except GrammarError as exc:
            position = self.positions[i]
            raise APIError(f"the grammar of tool {self.names[i]!r} (tools[{position}]) failed: {exc}",
                           param=self.fields.tool_schema.format(i=position),
                           code="grammar_compilation_failed") from exc


async def build_tool_constraint(state: ServerState, tools: list[dict], choice: ToolChoice, parallel: bool,
                                fields) -> tuple[PendingTools, frozenset[int]]:
    """The call constraint for auto/required/named (its units compiling), and the special tokens to
    keep in the text. Each tool is one unit: only tools not compiled before cost a compile. A named
    choice is exactly one call of that tool, as in vLLM and SGLang (a tool with side effects must
    not run twice), whatever `parallel` says."""
    tools = [{**tool, "function": {k: v for k, v in tool["function"].items() if k != "strict"}} for tool in tools]
    parallel = parallel and choice.mode != "named"
    regexes = await _args_regexes(state, tools, choice.name, fields)
    try:
        grammar = await asyncio.to_thread(tool_grammar, state.tool_format, tools, lambda schema: regexes[id(schema)],
                                          parallel, choice.name)
    except ToolFormatError as exc:
        raise APIError(str(exc), param=fields.tools) from exc
    # a required call over several tools may start before its units are compiled (name first): until a
    # tool is chosen its units compile in the background, in the engine's idle time
    name_first_ok = choice.mode == "required" and grammar.next_units == grammar.units and len(grammar.units) > 1
    units = [state.compiler.submit_regex(regex, background=name_first_ok) for regex in grammar.units]
    later = [state.compiler.submit_regex(regex) for regex in grammar.next_units] \
        if grammar.next_units != grammar.units else None
    for future in units + (later or []):
        future.add_done_callback(lambda _: state.engine.wake())  # a row held for its unit goes on at once
    tokens = tool_tokens(state.tokenizer, grammar.open, grammar.close, grammar.separator, grammar.end)
    trigger = None
    if choice.mode == "auto":
        trigger_ids = tuple(state.tokenizer.encode(grammar.trigger, add_special_tokens=False))
        single = trigger_ids if len(trigger_ids) == 1 else ()
        trigger = await asyncio.to_thread(trigger_masks, state.vocabulary, grammar.trigger, single)
        tokens_of_trigger = set(single)
    else:
        tokens_of_trigger = set()
    special = set(state.tokenizer.all_special_ids)
    keep = (set(tokens.open) | set(tokens.close) | set(tokens.separator or ()) | set(tokens.end)
            | tokens_of_trigger) & special
    constraint = ToolCallConstraint(tokens, required=choice.mode != "auto", vocabulary=state.vocabulary,
                                    trigger=trigger, bare_object_at_start=grammar.bare_object_at_start)
    names = [tool["function"]["name"] for tool in tools]
    positions = tuple(names.index(name) for name in grammar.names)
    return PendingTools(constraint, grammar.names, positions, units, later, fields, grammar.units,
                        name_first_ok, state.compiler.prefer), frozenset(keep)


def tool_format_of(state: ServerState) -> ToolFormat:
    return get_tool_format(state.tool_format)

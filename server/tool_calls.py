"""Tools, whichever API sent them: the call constraint built from per-tool grammar units."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from grammars import (NO_PARAMETERS_SCHEMA, GrammarError, ToolFormat, ToolFormatError, UnsupportedSchemaError,
                      chosen_specs, get_tool_format)
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
    """A row's tool constraint whose units are compiling: ``wait()`` attaches them, or raises the 400."""
    call: object  # grammars.ToolCall: the request's calls and its units' futures, shared by its rows
    constraint: object  # this row's (call.row())
    fields: object  # generation.Fields: how the API names the tools' schemas

    async def name_first(self, state: ServerState, budget: int | None, room: int) -> bool:
        """Whether the request may start before its units are compiled (grammars/tools/name_stage.py);
        then ``wait()`` runs beside it. The stage is built here, while the prompt prefills."""
        return await asyncio.to_thread(self.call.name_first, self.constraint, state.vocabulary, budget, room)

    def hurry(self) -> None:
        self.call.hurry()

    async def wait(self) -> None:
        first = [await self._result(f, i) for i, f in enumerate(self.call.units)]
        later = [await self._result(f, i) for i, f in enumerate(self.call.later)] if self.call.later else None
        self.call.attach(self.constraint, first, later)

    async def _result(self, future, i: int):
        try:
            return await asyncio.wrap_future(future)
        except GrammarError as exc:
            position = self.call.positions[i]
            raise APIError(f"the grammar of tool {self.call.names[i]!r} (tools[{position}]) failed: {exc}",
                           param=self.fields.tool_schema.format(i=position),
                           code="grammar_compilation_failed") from exc


async def build_tool_call(state: ServerState, tools: list[dict], choice: ToolChoice, parallel: bool, fields):
    """The request's grammars.ToolCall for auto/required/named (its units compiling; once for its
    rows, each of which takes `PendingTools(call, call.row(), fields)`)."""
    tools = [{**tool, "function": {k: v for k, v in tool["function"].items() if k != "strict"}} for tool in tools]
    regexes = await _args_regexes(state, tools, choice.name, fields)
    try:
        call = await asyncio.to_thread(state.compiler.tool_call, state.tokenizer, state.tool_format, tools,
                                       lambda schema: regexes[id(schema)], choice.mode, choice.name, parallel,
                                       state.engine.wake)  # a row held for its unit goes on at once
    except ToolFormatError as exc:
        raise APIError(str(exc), param=fields.tools) from exc
    return call


def tool_format_of(state: ServerState) -> ToolFormat:
    return get_tool_format(state.tool_format)

"""Tools on /v1/chat/completions: tool_choice resolved, the call constraint built, output read back as tool_calls."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from grammars import GrammarError, UnsupportedSchemaError, schema_to_regex
from grammars.tool_constraint import ToolCallConstraint, tool_tokens
from grammars.tool_formats import ArgsDelta, CallStart, Content, get_tool_format
from grammars.tool_formats.base import ToolFormat
from grammars.tool_formats.call_regex import NO_PARAMETERS_SCHEMA, ToolFormatError
from grammars.tool_grammar import tool_grammar
from grammars.trigger_mask import trigger_masks
from grammars.unit_union import UnitUnion
from server.errors import APIError
from server.protocol import ChatCompletionRequest, FunctionCall, ToolCall
from server.state import ServerState


@dataclass
class ToolChoice:
    mode: str  # none | auto | required | named
    name: str | None = None


def resolve_tool_choice(body: ChatCompletionRequest) -> ToolChoice:
    choice, tools = body.tool_choice, body.tools or []
    names = [tool.function.name for tool in tools]
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise APIError(f"tool_choice {choice!r} needs `tools`; send the tools the model may call",
                           param="tool_choice")
        return ToolChoice(choice)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise APIError(f"tool_choice names function {name!r}, which is not among the tools {names}",
                           param="tool_choice.function.name")
        return ToolChoice("named", name)
    raise APIError("tool_choice must be 'none', 'auto', 'required' or "
                   "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")


def _args_regex_for(tools: list[dict]):
    """args_regex for the tool formats; a schema error names the tool it came from."""
    positions = {id(t["function"].get("parameters") or NO_PARAMETERS_SCHEMA): i for i, t in enumerate(tools)}

    def args_regex(schema: dict) -> str:
        try:
            return schema_to_regex(schema, free_values=True)  # free-form values: the JSON automaton's holes
        except GrammarError as exc:
            position = positions.get(id(schema))
            param = f"tools[{position}].function.parameters" if position is not None else "tools"
            raise APIError(str(exc), param=param, code="unsupported_schema"
                           if isinstance(exc, UnsupportedSchemaError) else "invalid_schema") from exc
    return args_regex


@dataclass
class PendingTools:
    """A tool constraint whose units are compiling: ``wait()`` attaches them, or raises the 400."""
    constraint: ToolCallConstraint
    names: tuple[str, ...]
    positions: tuple[int, ...]  # per unit: its tool's position in `tools`
    units: list  # concurrent.futures.Future[CompiledGrammar] per first-block unit
    later: list | None  # the same for later blocks (mistral), or None: the same units

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
                           param=f"tools[{position}].function.parameters",
                           code="grammar_compilation_failed") from exc


async def build_tool_constraint(state: ServerState, body: ChatCompletionRequest,
                                choice: ToolChoice) -> tuple[PendingTools, frozenset[int]]:
    """The call constraint for auto/required/named (its units compiling), and the special tokens to
    keep in the text. Each tool is one unit: only tools not compiled before cost a compile."""
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
    for tool in tools:
        tool["function"].pop("strict", None)
    parallel = body.parallel_tool_calls is not False
    try:
        grammar = await asyncio.to_thread(tool_grammar, state.tool_format, tools, _args_regex_for(tools), parallel,
                                          choice.name)
    except ToolFormatError as exc:
        raise APIError(str(exc), param="tools") from exc
    units = [state.compiler.submit_regex(regex) for regex in grammar.units]
    later = [state.compiler.submit_regex(regex) for regex in grammar.next_units] \
        if grammar.next_units != grammar.units else None
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
    return PendingTools(constraint, grammar.names, positions, units, later), frozenset(keep)


class ToolCallReader:
    """Output text -> content and tool calls, fed piece by piece; the same pieces give the same calls."""

    def __init__(self, fmt: ToolFormat):
        self.format = fmt
        self.parser = fmt.stream_parser()
        self.ids: dict[int, str] = {}
        self.names: dict[int, str] = {}
        self.arguments: dict[int, list[str]] = {}
        self.content: list[str] = []

    def feed(self, text: str, final: bool = False) -> list:
        """Returns the parsed events of this piece (Content / CallStart / ArgsDelta / CallEnd)."""
        events = self.parser.feed(text) if text else []
        if final:
            events += self.parser.close()
        for event in events:
            if isinstance(event, Content):
                self.content.append(event.text)
            elif isinstance(event, CallStart):
                self.ids[event.index] = self.format.new_call_id()
                self.names[event.index] = event.name
                self.arguments[event.index] = []
            elif isinstance(event, ArgsDelta):
                self.arguments[event.index].append(event.text)
        return events

    def tool_calls(self) -> list[ToolCall]:
        return [ToolCall(id=self.ids[i], function=FunctionCall(name=self.names[i],
                                                               arguments="".join(self.arguments[i]) or "{}"))
                for i in sorted(self.names)]

    def delta(self, event) -> dict | None:
        """The OpenAI tool_calls delta entry of one event, or None for content / call ends."""
        if isinstance(event, CallStart):
            return {"index": event.index, "id": self.ids[event.index], "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
        if isinstance(event, ArgsDelta):
            return {"index": event.index, "function": {"arguments": event.text}}
        return None


def tool_format_of(state: ServerState) -> ToolFormat:
    return get_tool_format(state.tool_format)

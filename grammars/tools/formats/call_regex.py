"""The pieces of a call-block regex that all formats share: the tools' names and argument regexes.

Regexes use the syntax outlines-core and Python's `re` both accept: plain groups, no lookaround,
no backreferences. A tool's name is written as its JSON string (`"get_weather"`), escaped.

A tool without `parameters` takes no arguments: its arguments regex is `args_regex` of
`NO_PARAMETERS_SCHEMA` (`{"type": "object", "properties": {}}`), which with outlines-core's builder
admits exactly `{}`. OpenAI documents an omitted `parameters` as "an empty parameter list".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

NO_PARAMETERS_SCHEMA: dict = {"type": "object", "properties": {}}

ArgsRegex = Callable[[dict], str]
CallObjectRegex = Callable[[str, str], str]  # (escaped JSON name, arguments regex) -> call object regex


class ToolFormatError(ValueError):
    """The tools or the request do not fit; the message says what was wrong and how to fix it."""


def function_specs(tools: list[dict] | None) -> list[tuple[str, dict]]:
    """(name, parameters schema) per tool, in the request's order, after checking the shape."""
    if not tools:
        raise ToolFormatError("no tools were given; send at least one entry in `tools` to constrain tool calls")
    specs: list[tuple[str, dict]] = []
    seen: set[str] = set()
    for position, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise ToolFormatError(f"tools[{position}] has type {kind!r}; only "
                                  "{'type': 'function', 'function': {...}} tools are supported")
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise ToolFormatError(f"tools[{position}].function.name is missing; give every function a name")
        if name in seen:
            raise ToolFormatError(f"tools[{position}].function.name {name!r} is used twice; tool names must be unique")
        seen.add(name)
        parameters = function.get("parameters")
        if parameters is None:
            parameters = NO_PARAMETERS_SCHEMA
        elif not isinstance(parameters, dict):
            raise ToolFormatError(f"tools[{position}].function.parameters must be a JSON schema object, "
                                  f"got {type(parameters).__name__}")
        specs.append((name, parameters))
    return specs


def name_regex(name: str) -> str:
    """The regex of the name as a JSON string, quotes included."""
    return re.escape(json.dumps(name, ensure_ascii=False))


def chosen_specs(tools: list[dict] | None, forced_name: str | None) -> list[tuple[str, dict]]:
    """function_specs of all tools, or only of `forced_name` (a ToolFormatError if it is not among them)."""
    specs = function_specs(tools)
    if forced_name is None:
        return specs
    chosen = [spec for spec in specs if spec[0] == forced_name]
    if not chosen:
        known = ", ".join(repr(name) for name, _ in specs)
        raise ToolFormatError(f"tool_choice names function {forced_name!r}, which is not in `tools` "
                              f"(known: {known}); name one of them or add it to `tools`")
    return chosen


def call_alternatives(tools: list[dict] | None, args_regex: ArgsRegex, forced_name: str | None,
                      call_object: CallObjectRegex) -> str:
    """One group matching a call object of any tool (or only of `forced_name`)."""
    specs = chosen_specs(tools, forced_name)
    alternatives = [call_object(name_regex(name), args_regex(parameters)) for name, parameters in specs]
    return "(" + "|".join(alternatives) + ")"


def repeated(first: str, separator: str, item: str) -> str:
    """`first` followed by zero or more `separator item`."""
    return f"{first}({separator}{item})*"

"""A structured output (json_object, json_schema, regex, choice or a GBNF grammar) becomes a
grammar matcher, whichever API asked."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from grammars import GrammarError, UnsupportedSchemaError
from grammars import UNSUPPORTED_KEYWORDS
from server.errors import APIError
from server.schema_check import check_schema
from server.state import ServerState


@dataclass(frozen=True)
class OutputFormat:
    kind: str  # json_object | json_schema | regex | choice | grammar
    schema: dict | None = None
    strict: bool | None = None
    pattern: str | None = None  # regex, grammar: Python's regex the whole output matches (the client's)
    choices: tuple[str, ...] | None = None  # choice: the output is one of them
    index_regex: str | None = None  # regex, choice, grammar: the token index's regex (server/constraint_fields.py)


async def build_format_constraint(state: ServerState, fmt: OutputFormat, fields):
    """A Matcher for the output format; `fields` (generation.Fields) names the API's fields in errors.

    `strict: false` on a json_schema relaxes only the keywords a regex cannot express (listed in
    grammars/schema/json_schema.py); everything else in the schema is still enforced. Otherwise an
    unsupported keyword is a 400 that names it.
    """
    if fmt.kind == "json_object":
        return state.compiler.json_object_matcher()  # the shared automaton, built at startup
    if fmt.index_regex is not None:
        try:
            grammar = await state.compiler.compile_regex_async(fmt.index_regex)
        except GrammarError as exc:
            raise APIError(f"{fields.format}: {exc}", param=fields.format, code=f"invalid_{fmt.kind}") from exc
        return grammar.matcher()
    param = fields.format_schema
    if fmt.schema is None:
        raise APIError("a json_schema output format needs its schema", param=param)
    await asyncio.to_thread(check_schema, fmt.schema, param)  # a walk over every subschema: ~0.1 s per 700 KB
    try:
        ignore = UNSUPPORTED_KEYWORDS if fmt.strict is False else ()
        regex = await state.compiler.schema_regex_async(fmt.schema, ignore)  # in a worker, under the limit
        grammar = await state.compiler.compile_regex_async(regex)
    except UnsupportedSchemaError as exc:
        raise APIError(str(exc), param=param, code="unsupported_schema") from exc
    except GrammarError as exc:
        raise APIError(str(exc), param=param, code="invalid_schema") from exc
    return grammar.matcher()

"""response_format on /v1/chat/completions: json_object and json_schema become a grammar matcher."""

from __future__ import annotations

import asyncio

from grammars import GrammarError, UnsupportedSchemaError, schema_to_regex
from grammars.json_schema import UNSUPPORTED_KEYWORDS
from server.errors import APIError
from server.protocol import ChatCompletionRequest
from server.state import ServerState


async def build_format_constraint(state: ServerState, body: ChatCompletionRequest):
    """A Matcher for the response format, or None for plain text.

    `strict: false` on a json_schema relaxes only the keywords a regex cannot express (listed in
    grammars/json_schema.py); everything else in the schema is still enforced. Otherwise an
    unsupported keyword is a 400 that names it.
    """
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    param = "response_format"
    try:
        if fmt.type == "json_object":
            return state.compiler.json_object_matcher()  # the shared automaton, built at startup
        else:
            param = "response_format.json_schema.schema"
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise APIError("response_format of type json_schema needs json_schema.schema", param=param)
            schema = fmt.json_schema.schema_
            ignore = UNSUPPORTED_KEYWORDS if fmt.json_schema.strict is False else ()
            regex = await asyncio.to_thread(schema_to_regex, schema, None, ignore, True)  # free values: holes
            grammar = await state.compiler.compile_regex_async(regex)
    except UnsupportedSchemaError as exc:
        raise APIError(str(exc), param=param, code="unsupported_schema") from exc
    except GrammarError as exc:
        raise APIError(str(exc), param=param, code="invalid_schema") from exc
    return grammar.matcher()

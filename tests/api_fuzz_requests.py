"""Hypothesis-built requests for fuzzing the HTTP API (tests/api_fuzz.py sends them and checks the answers).

Well-formed bodies for every route (chat, completions, messages, responses, tokenize, count_tokens), most
with tools or a JSON output format: small schemas the tiny model can satisfy in a few tokens (their 200s
are validated), and pathological ones (deep nesting, huge enums, recursive and external $ref, patterns
with catastrophic backtracking, impossible bounds, keywords of the wrong type); tool_choice naming an
absent tool, duplicate tools, unknown roles and models, empty messages, out-of-vocabulary token ids.
Then the same bodies with a field of the wrong type or missing, and bodies that are not JSON at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import strategies as st

MODEL = "tiny"


@dataclass
class Case:
    path: str
    body: object = None  # sent as JSON
    raw: bytes | None = None  # sent as is (bad JSON), instead of body
    method: str = "POST"

    def send(self, http):
        if self.method == "GET":
            return http.get(self.path)
        if self.raw is not None:
            return http.post(self.path, content=self.raw, headers={"content-type": "application/json"})
        return http.post(self.path, json=self.body)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                           max_leaves=12)
SHORT_TEXT = st.sampled_from(["hi", "", " ", "Call the tool.", "<tool_call>", "[TOOL_CALLS]", "{\"a\":", "\x00",
                              "é 🦜", "<|im_end|>", "<|python_tag|>"]) | st.text(max_size=20)
NAMES = st.sampled_from(["f", "get_weather", "a.b-c_1", "x" * 64])

# Schemas the tiny model can satisfy in a few tokens: their 200s are checked against them.
LEAVES = st.one_of(
    st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": "integer", "minimum": 0, "maximum": 9},
                     {"type": "string", "maxLength": 3}, {"enum": ["a", "bb", 3, None]}, {"const": "fixed text"},
                     {"type": "number"}, {"type": "string", "pattern": "^[a-c]{1,2}$"}, {"type": "string", "format": "date"},
                     {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, {}]),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-10**6, 10**6), st.integers(0, 100)),
)
SMALL_VALUE = st.recursive(LEAVES, lambda inner: st.one_of(
    st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n}, inner, st.integers(0, 2)),
    st.builds(lambda props, extra: {"type": "object", "properties": props, "required": sorted(props)[:1],
                                    "additionalProperties": extra},
              st.dictionaries(st.sampled_from(["a", "b", "key", "é"]), inner, max_size=3), st.booleans())),
    max_leaves=4)
SMALL_SCHEMAS = st.builds(lambda props, required: {"type": "object", "properties": props,
                                                   "required": [k for k in sorted(props) if required],
                                                   "additionalProperties": False},
                          st.dictionaries(st.sampled_from(["a", "b", "city", "n"]), SMALL_VALUE, max_size=3),
                          st.booleans())


def _nested(depth: int, kind: str) -> dict:
    schema: dict = {"type": "string", "maxLength": 2}
    if kind not in ("object", "array"):
        depth = min(depth, 12)  # each level holds the one below twice: 2**depth copies
    for _ in range(depth):
        if kind == "object":
            schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
        elif kind == "array":
            schema = {"type": "array", "items": schema, "minItems": 1}
        else:  # nested oneOf / anyOf / allOf (the issue's 12 levels of oneOf)
            schema = {kind: [schema, {"type": "object", "properties": {"x": schema}}]}
    return schema


CATASTROPHIC_PATTERNS = ["^(a+)+$", "^(a|a)*$", "(x+x+)+y", "^(\\w+\\s?)*$", "((a*)*)*b", "^(a|aa)+$",
                         "(.*a){20}", "^([a-z]+)*[0-9]{50}$", "(", "[", "a{99999}", "\\p{L}+", "(?=a)a", "(a)\\1",
                         "^.{1000000}$", "[^\\x00-\\x{10FFFF}]", "a{3,1}"]
RECURSIVE = [
    {"$ref": "#"},
    {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
     "$ref": "#/$defs/a"},
    {"definitions": {"t": {"type": "array", "items": {"$ref": "#/definitions/t"}, "minItems": 1}},
     "$ref": "#/definitions/t"},
    {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}, "required": ["a"]},
    {"$ref": "http://127.0.0.1:9/never-fetched.json"},
    {"$ref": "#/properties/a", "properties": {"a": {"$ref": "#/properties/a"}}},
    {"$ref": 5}, {"$ref": "#/$defs/~1~0%%"},
]
PATHOLOGICAL = st.one_of(
    st.builds(_nested, st.integers(5, 120), st.sampled_from(["object", "array", "oneOf", "anyOf", "allOf"])),
    st.builds(lambda n, strings: {"enum": [f"value number {i}" if strings else i for i in range(n)]},
              st.integers(500, 20000), st.booleans()),
    st.builds(lambda p: {"type": "object", "properties": {"s": {"type": "string", "pattern": p}}, "required": ["s"]},
              st.sampled_from(CATASTROPHIC_PATTERNS)),
    st.sampled_from(RECURSIVE),
    st.builds(lambda n: {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
                         "required": [f"p{i}" for i in range(n)]}, st.integers(100, 1500)),
    st.sampled_from([{"type": "string", "minLength": 100000}, {"type": "array", "minItems": 10**6},
                     {"type": "string", "maxLength": 10**12}, {"type": "integer", "minimum": 10, "maximum": 1},
                     {"type": "number", "minimum": 1e308, "exclusiveMinimum": 1e308}, {"type": "integer", "multipleOf": 0},
                     {"type": "number", "multipleOf": 1e-300}, {"type": "integer", "minimum": 10**30},
                     {"type": 5}, {"type": ["string", 7]}, {"type": "strnig"}, {"properties": []}, {"required": "a"},
                     {"enum": []}, {"enum": "x"}, {"items": 5}, {"minLength": -1}, {"minLength": "3"}, {"pattern": 5},
                     {"allOf": {}}, {"not": {}}, {"oneOf": []}, {"if": {"type": "string"}, "then": False},
                     {"type": "object", "properties": {"a": False}, "required": ["a"]}, {"const": {"deep": [1, {}]}},
                     {"type": "object", "patternProperties": {"(a+)+": {"type": "integer"}}, "minProperties": 3},
                     {"type": "object", "additionalProperties": {"$ref": "#"}, "minProperties": 1}]),
    st.dictionaries(st.sampled_from(["type", "properties", "items", "enum", "const", "required", "anyOf", "oneOf",
                                     "allOf", "$ref", "pattern", "minimum", "maxLength", "format", "prefixItems"]),
                    JSON_VALUES, max_size=4),
)
SCHEMAS = st.one_of(SMALL_SCHEMAS, PATHOLOGICAL)


def _tool(name, schema):
    return {"type": "function", "function": {"name": name, "parameters": schema}}


TOOLS = st.one_of(
    st.lists(st.builds(_tool, NAMES, SCHEMAS), min_size=1, max_size=3),
    st.builds(lambda schema: [_tool("f", schema), _tool("f", {"type": "object"})], SCHEMAS),  # duplicate names
    st.lists(JSON_VALUES, max_size=2),
)
TOOL_CHOICES = st.one_of(st.sampled_from([None, "auto", "required", "none", "any", ""]),
                         st.builds(lambda n: {"type": "function", "function": {"name": n}},
                                   NAMES | st.sampled_from(["absent_tool"])),
                         JSON_VALUES)
ROLES = st.sampled_from(["user", "user", "system", "developer", "assistant", "tool", "function", "bogus", ""])
MESSAGE = st.fixed_dictionaries({"role": ROLES, "content": st.one_of(SHORT_TEXT, st.none(), JSON_VALUES)})
MESSAGES = st.one_of(st.just([{"role": "user", "content": "hi"}]), st.lists(MESSAGE, max_size=3))
MODELS = st.sampled_from([MODEL, MODEL, MODEL, "gpt-4o", "", "TINY"])
FREE_BUDGET = st.integers(1, 4)
CONSTRAINED_BUDGET = st.sampled_from([1, 2, 4, 8, 16, 32, 48])


def _formats(schema_strategy):
    return st.one_of(st.none(), st.just({"type": "json_object"}), st.just({"type": "text"}),
                     st.builds(lambda s, strict: {"type": "json_schema", "json_schema": {"name": "out", "schema": s,
                                                                                       "strict": strict}},
                               schema_strategy, st.sampled_from([None, True, False])))


def _chat(model, messages, budget, stream, tools, choice, fmt, extra):
    body = {"model": model, "messages": messages, "max_tokens": budget, "stream": stream, **extra}
    if tools is not None:
        body["tools"], body["tool_choice"] = tools, choice
    if fmt is not None:
        body["response_format"] = fmt
    return body


SAMPLING_EXTRAS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0, 0.7, 2.0]), "seed": st.integers(-2**70, 2**70),
    "logit_bias": st.dictionaries(st.sampled_from(["0", "2", "49151", "49152", "999999999", "-1", "x"]),
                                  st.sampled_from([-100, 5, 100, 101]), max_size=2),
    "stop": st.one_of(SHORT_TEXT, st.lists(SHORT_TEXT, max_size=5)), "n": st.integers(1, 3),
    "stop_token_ids": st.lists(st.sampled_from([2, 0, -1, 49151, 49152, 10**12]), max_size=2),
    "top_logprobs": st.integers(0, 21), "logprobs": st.booleans(), "top_k": st.integers(0, 10**6),
    "parallel_tool_calls": st.booleans(), "ignore_eos": st.booleans(),
})
CHAT = st.builds(_chat, MODELS, MESSAGES, st.one_of(FREE_BUDGET, CONSTRAINED_BUDGET), st.booleans(),
                 st.one_of(st.none(), TOOLS), TOOL_CHOICES, _formats(SCHEMAS), SAMPLING_EXTRAS)
# Mostly-valid constrained chats: the 200s whose outputs are validated.
CONSTRAINED_CHAT = st.builds(
    lambda budget, stream, tools, choice, fmt: _chat(MODEL, [{"role": "user", "content": "hi"}], budget, stream,
                                                     tools, choice, None if tools else fmt, {"temperature": 1.0}),
    CONSTRAINED_BUDGET, st.booleans(),
    st.one_of(st.none(), st.lists(st.builds(_tool, st.sampled_from(["f", "g", "h"]), SMALL_SCHEMAS),
                                  min_size=1, max_size=2, unique_by=lambda t: t["function"]["name"])),
    st.sampled_from(["auto", "required", {"type": "function", "function": {"name": "f"}}]),
    _formats(SMALL_SCHEMAS).filter(lambda f: f is not None))


def _messages(model, messages, budget, stream, tools, choice, schema):
    body = {"model": model, "messages": messages, "max_tokens": budget, "stream": stream}
    if tools is not None:
        body["tools"] = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
                         if isinstance(t, dict) and isinstance(t.get("function"), dict) else t for t in tools]
        body["tool_choice"] = choice
    if schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    return body


ANTHROPIC_CHOICES = st.one_of(st.none(), st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                                           {"type": "tool", "name": "f"}, {"type": "tool"},
                                                           {"type": "tool", "name": "absent_tool"}, {"type": "bogus"}]),
                              JSON_VALUES)
MESSAGES_BODY = st.builds(_messages, MODELS, MESSAGES, st.one_of(FREE_BUDGET, CONSTRAINED_BUDGET), st.booleans(),
                          st.one_of(st.none(), TOOLS), ANTHROPIC_CHOICES, st.one_of(st.none(), SCHEMAS))


def _responses(model, text_input, budget, stream, tools, choice, schema):
    body = {"model": model, "input": text_input, "max_output_tokens": budget, "stream": stream}
    if tools is not None:
        body["tools"] = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
                         if isinstance(t, dict) and isinstance(t.get("function"), dict) else t for t in tools]
        body["tool_choice"] = choice
    if schema is not None:
        body["text"] = {"format": {"type": "json_schema", "name": "out", "schema": schema}}
    return body


RESPONSES_BODY = st.builds(_responses, MODELS, st.one_of(SHORT_TEXT, st.lists(JSON_VALUES, max_size=2), MESSAGES),
                           st.one_of(FREE_BUDGET, CONSTRAINED_BUDGET), st.booleans(), st.one_of(st.none(), TOOLS),
                           st.one_of(st.sampled_from(["auto", "required", "none", {"type": "function", "name": "f"},
                                                      {"type": "function", "name": "absent_tool"}]), JSON_VALUES),
                           st.one_of(st.none(), SCHEMAS))
TOKEN_IDS = st.lists(st.sampled_from([0, 1, 2, 100, 49151, 49152, -1, 2**31, 2**64]), max_size=4)
COMPLETIONS_BODY = st.fixed_dictionaries(
    {"model": MODELS, "prompt": st.one_of(SHORT_TEXT, TOKEN_IDS, st.lists(SHORT_TEXT, max_size=2),
                                          st.lists(TOKEN_IDS, max_size=2)), "max_tokens": FREE_BUDGET},
    optional={"stream": st.booleans(), "echo": st.booleans(), "logprobs": st.integers(0, 21)})
OTHER = st.one_of(
    st.builds(lambda body: Case("/tokenize", body), st.fixed_dictionaries({}, optional={
        "prompt": SHORT_TEXT, "messages": MESSAGES, "tools": TOOLS, "model": MODELS})),
    st.builds(lambda ids: Case("/detokenize", {"tokens": ids}), TOKEN_IDS | JSON_VALUES),
    st.builds(lambda body: Case("/v1/messages/count_tokens", body), MESSAGES_BODY),
    st.builds(lambda rid: Case(f"/v1/responses/{rid}", method="GET"), st.sampled_from(["resp_1", "x", "%00", "..", "a" * 300])),
    st.sampled_from([Case("/v1/models", method="GET"), Case("/metrics", method="GET"), Case("/nowhere", {}),
                     Case("/v1/chat/completions", method="GET")]),
)
WELL_FORMED = st.one_of(
    st.builds(lambda b: Case("/v1/chat/completions", b), CHAT),
    st.builds(lambda b: Case("/v1/chat/completions", b), CONSTRAINED_CHAT),
    st.builds(lambda b: Case("/v1/messages", b), MESSAGES_BODY),
    st.builds(lambda b: Case("/v1/responses", b), RESPONSES_BODY),
    st.builds(lambda b: Case("/v1/completions", b), COMPLETIONS_BODY),
    OTHER,
)
FIELDS = ["model", "messages", "max_tokens", "stream", "tools", "tool_choice", "response_format", "temperature", "n",
          "stop", "input", "prompt", "output_config", "text", "system", "seed", "top_p", "stream_options"]


def _wrong_type(case: Case, field: str, value, delete: bool) -> Case:
    body = dict(case.body) if isinstance(case.body, dict) else {}
    if delete:
        body.pop(field, None)
    else:
        body[field] = value
    return Case(case.path, body)


BAD_JSON = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"{", b'{"model": "tiny", "messages": [', b"null", b"[]", b"42", b'"x"', b"\xff\xfe{}",
                     b'{"model": "tiny"} trailing', b'{"a": NaN}', b'{"model": "tiny", "model": 5}', b"[" * 5000,
                     b'{"messages": [{"role": "user", "content": "\\ud800"}], "model": "tiny"}']),
    st.builds(lambda b: json.dumps(b).encode()[:-1], st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3)),
)
CASES = st.one_of(
    WELL_FORMED, WELL_FORMED, st.builds(lambda b: Case("/v1/chat/completions", b), CONSTRAINED_CHAT),
    st.builds(_wrong_type, WELL_FORMED.filter(lambda c: c.method == "POST"), st.sampled_from(FIELDS), JSON_VALUES,
              st.booleans()),
    st.builds(lambda path, raw: Case(path, raw=raw), st.sampled_from(["/v1/chat/completions", "/v1/messages",
                                                                     "/v1/responses", "/v1/completions", "/tokenize"]),
              BAD_JSON),
)

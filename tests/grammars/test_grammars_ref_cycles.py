"""A local $ref cycle that no finite value can leave is refused by the compiler itself (grammars/schema/json_schema.py).

Found by the API fuzz: ``{"$ref": "#/properties/a", "properties": {"a": {"$ref": "#/properties/a"}}}``
compiled (outlines-core dropped the property: the regex was ``\\{()?\\}``), and only server/schema_check.py
stood between it and an output check that recursed without end. A cycle whose every step is mandatory
(a required property, allOf, items with minItems >= 1) compiled too, to a regex whose every match the
schema rejects (outlines-core closes its recursion cut with ``{}``). Optional recursion, which a value
can end, is kept.
"""

from __future__ import annotations

import json

import pytest

from grammar_fixtures import _byte_worker, byte_automaton, compact
from grammars import UnsupportedSchemaError, check_schema, schema_to_regex

REFUSED = [  # (schema, where the $ref is, how the message says it loops)
    ({"$ref": "#/properties/a", "properties": {"a": {"$ref": "#/properties/a"}}}, "/$ref", "through $ref alone"),
    ({"type": "object", "properties": {"a": {"$ref": "#/properties/b"}, "b": {"$ref": "#/properties/a"}}},
     "/properties/b/$ref", "through $ref alone"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "type": "object",
      "properties": {"x": {"$ref": "#/$defs/a"}}}, "/properties/x/$ref", "through $ref alone"),
    ({"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]},
     "/properties/child/$ref", "nest without end"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"},
     "/$ref", "nest without end"),
    ({"$defs": {"n": {"allOf": [{"$ref": "#/$defs/n"}]}}, "type": "object", "properties": {"q": {"$ref": "#/$defs/n"}}},
     "/properties/q/$ref", "nest without end"),
    ({"$defs": {"n": {"anyOf": [{"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]},
                                {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 2}]}},
      "$ref": "#/$defs/n"}, "/$ref", "nest without end"),
]

KEPT = [  # (schema, a valid value its regex matches)
    ({"type": "object", "properties": {"child": {"$ref": "#"}, "v": {"type": "integer"}}, "required": ["v"]},
     {"child": {"v": 2}, "v": 1}),
    ({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
                         "required": ["v"]}}, "$ref": "#/$defs/node"}, {"next": {"v": 2}, "v": 1}),
    ({"$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
                                                   "required": ["n"]}]}}, "$ref": "#/$defs/n"}, {"n": None}),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "integer"}}, "type": "object",
      "properties": {"x": {"$ref": "#/$defs/a"}}}, {"x": 3}),
]


@pytest.mark.parametrize("schema, where, how", REFUSED)
def test_a_cycle_no_value_can_leave_is_refused_naming_the_ref(schema, where, how):
    with pytest.raises(UnsupportedSchemaError) as raised:
        schema_to_regex(schema)
    assert raised.value.keyword == "$ref" and raised.value.path == where
    assert how in str(raised.value) and "make a step of the cycle optional" in str(raised.value)
    with pytest.raises(UnsupportedSchemaError):
        check_schema(schema)


@pytest.mark.parametrize("schema, value", KEPT)
def test_recursion_a_value_can_end_still_compiles(schema, value):
    assert byte_automaton(schema_to_regex(schema))(compact(value))


def test_the_compile_worker_answers_the_refusal_with_its_message():
    schema = json.dumps(REFUSED[0][0])
    with pytest.raises(UnsupportedSchemaError) as raised:
        _byte_worker().schema_regex(schema, (), False, 10.0)
    assert raised.value.keyword == "$ref" and "'#/properties/a' at /$ref leads back to itself" in str(raised.value)


def test_the_walk_needs_no_recursion_on_a_deep_schema():
    from grammars.schema.ref_cycles import check_ref_cycles

    schema = leaf = {"type": "object", "properties": {}, "required": ["k"]}
    for _ in range(5000):  # deeper than Python's recursion limit
        inner = {"type": "object", "properties": {}, "required": ["k"]}
        leaf["properties"]["k"] = inner
        leaf = inner
    leaf["properties"]["k"] = {"$ref": "#"}
    with pytest.raises(UnsupportedSchemaError, match="nest without end"):
        check_ref_cycles(schema)
    leaf["required"] = []
    check_ref_cycles(schema)  # the cycle can end at the bottom now

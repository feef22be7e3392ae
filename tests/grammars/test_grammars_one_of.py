"""oneOf: compiled as anyOf where no output can match two branches, else refused naming how to fix it."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammars import UnsupportedSchemaError, schema_to_regex

INT, STR = {"type": "integer"}, {"type": "string"}
PETS = {  # pydantic's discriminated union: branches by $ref, a required const tells them apart
    "$defs": {"Cat": {"type": "object", "properties": {"pet": {"const": "cat"}, "lives": INT}, "required": ["pet"]},
              "Dog": {"type": "object", "properties": {"pet": {"const": "dog"}, "lives": INT}, "required": ["pet"]}},
    "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}]}


@pytest.mark.parametrize("schema, valid, invalid", [
    ({"oneOf": [STR, INT, {"type": "null"}]}, ['"a"', "3", "null"], ["1.5", "true"]),  # types
    ({"oneOf": [{"type": "number"}, {"type": "boolean"}]}, ["1.5", "false"], ['"x"']),
    ({"oneOf": [{"enum": ["a", 1]}, {"const": "b"}, {"enum": [True, None]}]}, ['"a"', "1", '"b"', "true"], ["2"]),
    ({"oneOf": [{"const": 1}, {"type": "string"}, {"type": "boolean"}]}, ["1", '"1"', "true"], ["2"]),  # true != 1
    (PETS, ['{"pet":"cat","lives":9}', '{"pet":"dog"}'], ['{"pet":"cow"}', '{"lives":1}']),
    ({"type": "object", "properties": {"shape": {"oneOf": [  # a discriminator given by enum, one side only required
        {"type": "object", "properties": {"kind": {"enum": ["circle"]}, "r": INT}, "required": ["kind", "r"]},
        {"type": "object", "properties": {"kind": {"enum": ["square", "box"]}, "side": INT}}]}}, "required": ["shape"]},
     ['{"shape":{"kind":"circle","r":1}}', '{"shape":{"kind":"box"}}', '{"shape":{}}'], ['{"shape":{"kind":"circle"}}']),
    ({"oneOf": [  # closed objects: each requires a name the other rules out
        {"type": "object", "properties": {"a": INT}, "required": ["a"], "additionalProperties": False},
        {"type": "object", "properties": {"b": INT, "c": INT}, "required": ["b"], "additionalProperties": False}]},
     ['{"a":1}', '{"b":2,"c":3}'], ['{"a":1,"b":2}', "{}"]),
    ({"oneOf": [  # outlines-core writes only listed names: {"a":1,"b":2} would match both, and is never written
        {"type": "object", "properties": {"a": INT}, "required": ["a"]},
        {"type": "object", "properties": {"b": INT}, "required": ["b"]}]}, ['{"a":1}', '{"b":2}'], ['{"a":1,"b":2}']),
    ({"oneOf": [{"type": "string", "pattern": "^https?://.+$"}, {"type": "string", "pattern": "^\\./.+$"},
                {"type": "string", "maxLength": 0}]}, ['"http://x"', '"./a"', '""'], ['"x"']),
    ({"type": "object", "properties": {"status": {"oneOf": [  # a value against a pattern; item counts
        {"type": "string", "pattern": "^[0-9a-f]{4}$"}, {"enum": ["", "none"]}]}, "tags": {"oneOf": [
        {"type": "array", "items": STR, "maxItems": 1}, {"type": "array", "items": INT, "minItems": 2}]}},
        "required": ["status", "tags"], "additionalProperties": False},
     ['{"status":"00ff","tags":[]}', '{"status":"none","tags":[1,2]}'], ['{"status":"none","tags":[1]}']),
    ({"type": "array", "items": {"oneOf": [  # nested: an anyOf branch is told apart alternative by alternative
        {"anyOf": [STR, {"type": "null"}]}, {"oneOf": [{"type": "array", "items": INT}, INT]}]}},
     ['["a",null,[1],2]'], ['[true]']),
])
def test_exclusive_branches_compile_to_exactly_their_union(schema, valid, invalid):
    regex = re.compile(schema_to_regex(schema))
    for text in valid:
        assert regex.fullmatch(text), text
        jsonschema.validate(json.loads(text), schema)  # exactly one branch matches
    for text in invalid:
        assert not regex.fullmatch(text), text


@pytest.mark.parametrize("schema, path", [
    ({"oneOf": [INT, {"type": "number"}]}, "/oneOf"),  # 1 is both
    ({"oneOf": [STR, {"type": "string", "format": "uuid"}]}, "/oneOf"),
    ({"oneOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "string", "pattern": "^[0-9]+$"}]}, "/oneOf"),
    ({"oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]}, "/oneOf"),
    ({"oneOf": [{"type": "number"}, {"const": 2.0}]}, "/oneOf"),  # 2.0 is a number
    ({"type": "object", "properties": {"p": {"oneOf": [  # {} matches both: the discriminator is not required
        {"type": "object", "properties": {"kind": {"const": "a"}}, "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "b"}}, "additionalProperties": False}]}}}, "/properties/p/oneOf"),
    ({"$defs": {"u": {"oneOf": [STR, {"type": "string", "minLength": 2}]}},
      "type": "array", "items": {"$ref": "#/$defs/u"}}, "/$defs/u/oneOf"),
    ({"oneOf": [{"type": "object", "properties": {"a": INT}}, {"type": "object", "properties": {"b": INT}}]}, "/oneOf"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"s": STR},  # up to draft 7 a $ref
      "oneOf": [{"$ref": "#/definitions/s", "type": "integer"}, STR]}, "/oneOf"),  # hides its siblings: "a" is both
])
def test_overlapping_branches_are_refused_saying_how_to_fix_it(schema, path):
    with pytest.raises(UnsupportedSchemaError) as info:
        schema_to_regex(schema)
    assert info.value.keyword == "oneOf" and info.value.path == path
    message = str(info.value)
    assert "may both match one value" in message and "use anyOf" in message and "discriminator" in message


def test_overlapping_one_of_is_compiled_as_any_of_when_listed_as_ignored():
    """The library's explicit opt-out (the server never passes it: not even strict: false relaxes it)."""
    schema = {"oneOf": [INT, {"type": "number"}]}
    regex = re.compile(schema_to_regex(schema, ignore_keywords=["oneOf"]))
    assert regex.fullmatch("1") and regex.fullmatch("1.5")


def test_a_recursive_schema_is_refused_not_looped_over():
    schema = {"$defs": {"t": {"oneOf": [{"$ref": "#/$defs/t"}, {"$ref": "#/$defs/t"}]}}, "$ref": "#/$defs/t"}
    with pytest.raises(UnsupportedSchemaError, match="oneOf"):
        schema_to_regex(schema)

"""lower_object_branches: object-level anyOf/oneOf and dependencies become plain, sound branches."""

from __future__ import annotations

import copy
import functools
import gzip
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest

from grammar_fixtures import decode_within, shared_compiler, smollm2_tokenizer
from grammars import GrammarError, UnsupportedSchemaError, check_schema, schema_to_regex
from grammars.schema.object_branches import lower_object_branches

NUM, INT, STR = {"type": "number"}, {"type": "integer"}, {"type": "string"}


def obj(props, required=None, **rest):
    out = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return {**out, **rest}


GLAIVE = Path(__file__).resolve().parents[3] / "shared" / "data" / "maskbench" / "Glaiveai2K.jsonl.gz"


@functools.lru_cache(maxsize=1)
def _glaive():
    if not GLAIVE.exists():
        pytest.skip("MaskBench data not present (../shared beside the repository)")
    with gzip.open(GLAIVE, "rt") as f:
        return [json.loads(line)["schema"] for line in f]


def glaive(line):
    return copy.deepcopy(_glaive()[line])


# --- anyOf / oneOf next to properties --------------------------------------------------------------

def test_required_only_branches_become_disjoint_branches():
    schema = {"type": "object", "description": "d", "properties": {"r": NUM, "l": NUM, "w": NUM},
              "oneOf": [{"required": ["r"]}, {"required": ["l", "w"]}]}
    assert lower_object_branches(schema) == {"description": "d", "anyOf": [
        obj({"r": NUM}, ["r"]), obj({"l": NUM, "w": NUM}, ["l", "w"])]}


def test_anyof_branches_are_merged_without_exclusivity():
    schema = {"type": "object", "properties": {"r": NUM, "l": NUM}, "required": ["l"],
              "anyOf": [{"required": ["r"]}, {"properties": {"x": STR}}]}
    assert lower_object_branches(schema) == {"anyOf": [
        obj({"r": NUM, "l": NUM}, ["l", "r"]), obj({"r": NUM, "l": NUM, "x": STR}, ["l"])]}


def test_discriminated_branches_intersect_enums_and_stay_whole():
    schema = {"type": "object", "required": ["kind"],
              "properties": {"kind": {"type": "string", "enum": ["a", "b", "c"], "description": "k"}, "x": NUM},
              "oneOf": [{"properties": {"kind": {"const": "a"}, "y": INT}}, {"properties": {"kind": {"enum": ["b", 1]}}}]}
    assert lower_object_branches(schema) == {"anyOf": [
        obj({"kind": {"enum": ["a"]}, "x": NUM, "y": INT}, ["kind"]), obj({"kind": {"enum": ["b"]}, "x": NUM}, ["kind"])]}


@pytest.mark.parametrize("base,branch,merged", [
    ({"type": "number", "description": "a"}, {"type": "number", "title": "b"}, {"type": "number", "description": "a"}),
    ({"description": "any"}, INT, INT),
    (INT, {}, INT),
    ({"type": "integer"}, {"enum": [True, 1, 2.5, "1"]}, {"enum": [1]}),  # bool is not an integer
    ({"type": "boolean"}, {"enum": [True, 1]}, {"enum": [True]}),
    ({"enum": [1, 2, 3]}, {"enum": [3, 2]}, {"enum": [2, 3]}),
])
def test_property_intersection(base, branch, merged):
    schema = {"type": "object", "properties": {"p": base}, "anyOf": [{"properties": {"p": branch}}]}
    assert lower_object_branches(schema) == {"anyOf": [obj({"p": merged})]}


def test_empty_intersection_drops_the_branch_or_the_property():
    schema = {"type": "object", "properties": {"p": {"enum": ["a"]}, "q": {"const": 1}},
              "anyOf": [{"properties": {"p": {"const": "b"}}, "required": ["p"]},  # p required: unsatisfiable
                        {"properties": {"q": {"const": 2}}}]}  # q optional: it just never appears
    assert lower_object_branches(schema) == {"anyOf": [obj({"p": {"enum": ["a"]}})]}


def test_true_is_not_1():
    schema = {"type": "object", "properties": {"p": {"const": True}}, "anyOf": [{"properties": {"p": {"const": 1}}}]}
    assert lower_object_branches(schema) == {"anyOf": [obj({})]}


def test_additional_properties_false_limits_the_merged_properties():
    schema = {"type": "object", "properties": {"a": INT, "b": INT}, "additionalProperties": False,
              "anyOf": [{"properties": {"c": INT}}, {"required": ["c"]},  # c can never appear: unsatisfiable
                        {"properties": {"a": INT}, "additionalProperties": False}]}  # b then can never appear
    assert lower_object_branches(schema) == {"anyOf": [
        obj({"a": INT, "b": INT}, additionalProperties=False), obj({"a": INT}, additionalProperties=False)]}


def test_oneof_drops_a_branch_whose_required_names_include_anothers():
    schema = {"type": "object", "properties": {"a": INT, "b": INT, "c": STR},
              "oneOf": [{"required": ["a"]}, {"required": ["b"]}, {"required": ["b", "c"]}]}
    # {"b":1,"c":"x"} matches branches 1 and 2: branch 2 alone can never be the one match; branch 0 keeps c
    # (without b it cannot match branch 2), branch 1 loses c (with it, it would)
    assert lower_object_branches(schema) == {"anyOf": [obj({"a": INT, "c": STR}, ["a"]), obj({"b": INT}, ["b"])]}


def test_oneof_whose_branches_all_match_each_other_is_an_error():
    schema = {"type": "object", "properties": {"dims": {"type": "object", "properties": {"r": NUM, "l": NUM},
              "required": ["r", "l"], "oneOf": [{"required": ["r"]}, {"required": ["l"]}]}}}
    with pytest.raises(GrammarError, match="no branch of oneOf at /properties/dims/oneOf"):
        lower_object_branches(schema)


def test_anyof_with_no_satisfiable_branch_is_an_error():
    schema = {"type": "object", "properties": {"a": {"const": 1}}, "anyOf": [
        {"properties": {"a": {"const": 2}}, "required": ["a"]}]}
    with pytest.raises(GrammarError, match="no branch of anyOf at /anyOf"):
        check_schema(schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": INT}, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},  # b unlisted
    {"type": "object", "properties": {"a": INT}, "additionalProperties": True, "oneOf": [{"required": ["a"]}]},
    {"type": "object", "properties": {"a": INT}, "oneOf": [{"$ref": "#/$defs/x"}], "$defs": {"x": {}}},
    {"type": "object", "properties": {"a": INT}, "oneOf": [{"required": ["a"], "anyOf": [{"required": ["a"]}]}]},
    {"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}, "oneOf": [
        {"properties": {"a": {"const": "x"}}}]},
    {"type": "object", "properties": {"a": NUM}, "oneOf": [{"properties": {"a": INT}}]},  # type vs type
    {"type": "object", "properties": {"a": INT}, "anyOf": [{"required": ["a"]}], "oneOf": [{"required": ["a"]}]},
    # no required names to tell the branches apart, and they do not match each other ({} matches both)
    {"type": "object", "properties": {"k": STR}, "oneOf": [{"properties": {"k": {"const": "a"}}},
                                                          {"properties": {"k": {"const": "b"}}}]},
])
def test_nodes_it_cannot_lower_are_left_alone_and_refused(schema):
    before = copy.deepcopy(schema)
    assert lower_object_branches(schema) == before == schema
    with pytest.raises(UnsupportedSchemaError):
        check_schema(schema)


def test_walks_every_subschema_and_never_mutates_its_input():
    node = {"type": "object", "properties": {"a": INT, "b": INT}, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    lowered = {"anyOf": [obj({"a": INT}, ["a"]), obj({"b": INT}, ["b"])]}
    schema = {"$defs": {"n": node}, "type": "array", "items": {"anyOf": [node, {"$ref": "#/$defs/n"}]}}
    before = copy.deepcopy(schema)
    assert lower_object_branches(schema) == {"$defs": {"n": lowered}, "type": "array",
                                             "items": {"anyOf": [lowered, {"$ref": "#/$defs/n"}]}}
    assert schema == before


# --- dependencies / dependentRequired --------------------------------------------------------------

@pytest.mark.parametrize("keyword", ["dependencies", "dependentRequired"])
def test_dependency_on_a_listed_property_becomes_required(keyword):
    schema = {"type": "object", "properties": {"card": STR, "billing": STR}, keyword: {"card": ["billing"]}}
    assert lower_object_branches(schema) == obj({"card": STR, "billing": STR}, ["billing"])


def test_dependency_of_a_property_never_emitted_is_dropped():
    schema = {"type": "object", "properties": {"r": NUM}, "required": ["r"],
              "dependencies": {"shape": ["circle"], "other": {"required": ["r"]}}}
    assert lower_object_branches(schema) == obj({"r": NUM}, ["r"])


def test_dependency_on_an_unlisted_property_removes_the_optional_one():
    # base needs triangle, which is never emitted; then nothing may need base either
    schema = {"type": "object", "properties": {"base": NUM, "top": NUM, "h": NUM},
              "dependencies": {"top": ["base"], "base": ["triangle"]}}
    assert lower_object_branches(schema) == {"type": "object", "properties": {"h": NUM}}


def test_dependency_of_a_required_property_on_an_unlisted_one_lists_it():
    # MaskBench Glaiveai2K #61: JSON Schema allows "t" as an additional property, so it is generated
    schema = {"type": "object", "properties": {"base": NUM}, "required": ["base"], "dependencies": {"base": ["t"]}}
    assert lower_object_branches(schema) == obj({"base": NUM, "t": {}}, ["base", "t"])
    regex = re.compile(schema_to_regex(schema))
    assert regex.fullmatch('{"base":1,"t":null}') and not regex.fullmatch('{"base":1}')


def test_dependency_of_a_required_property_on_one_it_can_never_have_is_an_error():
    schema = {"type": "object", "properties": {"base": NUM}, "required": ["base"], "additionalProperties": False,
              "dependencies": {"base": ["t"]}}
    with pytest.raises(GrammarError, match="dependencies at /dependencies/base requires 't'"):
        schema_to_regex(schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "dependencies": {"a": ["b"]}},  # no properties: any name may be emitted
    {"type": "object", "properties": {"a": INT}, "dependencies": {"a": {"required": ["a"]}}},
    {"type": "object", "properties": {"a": INT}, "dependentSchemas": {"a": {"required": ["a"]}}},
    {"type": "object", "properties": {"a": INT}, "additionalProperties": INT, "dependencies": {"a": ["b"]}},
])
def test_dependencies_it_cannot_lower_are_left_and_refused(schema):
    assert lower_object_branches(schema) == schema
    with pytest.raises(UnsupportedSchemaError):
        check_schema(schema)


# --- regexes of real MaskBench schemas (Glaiveai2K lines) ----------------------------------------

REGEX_CASES = [  # (line, matching texts, non-matching texts)
    (72, ['{"dimensions":{"radius":2},"shape":"circle"}', '{"dimensions":{"length":1,"width":2},"shape":"x"}'],
     ['{"dimensions":{"length":1,"radius":2,"width":3},"shape":"circle"}', '{"dimensions":{},"shape":"circle"}',
      '{"dimensions":{"length":1},"shape":"circle"}',
      '{"dimensions":{"base":1,"radius":2},"shape":"circle"}']),  # valid, but the rewrite is narrower
    (159, ['{"radius":5,"shape":"circle"}', '{"height":1,"radius":5,"shape":"circle"}',
           '{"length":1,"shape":"rectangle","width":2}'],
     ['{"radius":"five","shape":"circle"}', '{"shape":"circle"}', '{"length":1,"shape":"circle","width":2}',
      '{"radius":5}']),
    (238, ['{"shape":"square","side":5}', '{"length":2,"shape":"square"}', '{"shape":"circle"}'],
     ['{"shape":"square","side":"5"}', '{"side":5}', '{"shape":"hexagon"}']),
    (36, ['{"dimensions":{"base":1,"height":2,"length":3,"radius":4,"width":5},"shape":"circle"}'],
     ['{"dimensions":{"base":1,"height":2,"length":3,"radius":4},"shape":"circle"}',
      '{"dimensions":{"base":1,"height":2,"length":3,"radius":4,"width":5},"shape":"square"}']),
]


@pytest.mark.parametrize("line,valid,invalid", REGEX_CASES, ids=[f"glaive{c[0]}" for c in REGEX_CASES])
def test_maskbench_schemas_compile_to_the_rewritten_language(line, valid, invalid):
    regex = re.compile(schema_to_regex(glaive(line)))
    for text in valid:
        assert regex.fullmatch(text), text
    for text in invalid:
        assert not regex.fullmatch(text), text


# --- soundness: random outputs of the compiled grammar validate against the original schema -------

HANDMADE = [
    {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "x": INT, "y": {"type": "boolean"}},
     "required": ["kind"], "additionalProperties": False,
     "oneOf": [{"properties": {"kind": {"const": "a"}}, "required": ["x"]},
               {"properties": {"kind": {"const": "b"}}, "required": ["y"]}]},
    {"type": "object", "properties": {"a": INT, "b": INT, "c": STR},
     "oneOf": [{"required": ["a"]}, {"required": ["b"]}, {"required": ["b", "c"]}]},
    {"type": "object", "properties": {"card": STR, "billing": STR, "note": STR, "base": INT},
     "dependencies": {"card": ["billing"], "note": ["missing"], "gone": ["card"]}, "dependentRequired": {"base": ["card"]}},
]
SAMPLES = 20


def _decode(grammar, seed, slack=30):
    """One output under ``grammar``, each token the argmax of random logits over the allowed ones,
    with a budget of its shortest length + ``slack`` (budget-aware masks close it)."""
    matcher = grammar.matcher()
    ids = decode_within(matcher, grammar.min_tokens(grammar.initial_state) + slack, random.Random(seed), favour=[])
    assert matcher.finished()
    return smollm2_tokenizer().decode([t for t in ids if t not in grammar.vocabulary.eos_token_ids])


@pytest.mark.parametrize("schema", [72, 159, 238, 36, *HANDMADE],
                         ids=["glaive72", "glaive159", "glaive238", "glaive36", "oneof_kind", "oneof_sub", "deps"])
def test_sampled_outputs_are_valid_against_the_original_schema(schema):
    schema = glaive(schema) if isinstance(schema, int) else schema
    grammar = shared_compiler().compile_json_schema(schema)
    for seed in range(SAMPLES):
        instance = json.loads(_decode(grammar, seed))
        for validator in (jsonschema.Draft7Validator, jsonschema.Draft202012Validator):  # dependencies, dependentRequired
            validator(schema).validate(instance)


@pytest.mark.parametrize("schema,listed", [
    (obj({"a": INT}, ["a", "b"]), obj({"a": INT, "b": {}}, ["a", "b"])),
    ({"type": "object", "required": ["b"]}, {"type": "object", "required": ["b"], "properties": {"b": {}}}),
    (obj({"a": INT}, ["b"], additionalProperties=STR), obj({"a": INT, "b": STR}, ["b"], additionalProperties=STR)),
])
def test_required_names_missing_from_properties_are_listed(schema, listed):
    assert lower_object_branches(schema) == listed
    regex = re.compile(schema_to_regex(schema))
    assert not regex.fullmatch('{"a":1}') and not regex.fullmatch("{}")
    assert regex.fullmatch('{"b":"x"}') or regex.fullmatch('{"a":1,"b":"x"}')


def test_a_branch_requiring_a_name_it_can_never_have_is_dropped():
    # MaskBench Github_trivial #3 (PutRequest): the second branch requires "keys", never listed
    ok = obj({"key": STR}, ["key"], additionalProperties=False)
    schema = {"type": "object", "oneOf": [ok, obj({"keyValues": INT}, ["keys"], additionalProperties=False)]}
    assert lower_object_branches(schema) == {"anyOf": [ok]}
    regex = re.compile(schema_to_regex(schema))
    assert regex.fullmatch('{"key":"a"}') and not regex.fullmatch('{"keyValues":1}')


def test_a_required_name_that_can_never_appear_is_an_error():
    with pytest.raises(GrammarError, match="nothing to generate"):
        schema_to_regex(obj({"a": INT}, ["a", "b"], additionalProperties=False))


@pytest.mark.parametrize("extra", [{}, {"additionalProperties": False}, {"additionalProperties": True},
                                   {"additionalProperties": INT}])
def test_outlines_core_never_emits_an_unlisted_property(extra):
    # what the rewrites rest on (outlines-core 0.2.14): removing a name from `properties` forbids it
    regex = re.compile(schema_to_regex({"type": "object", "properties": {"a": INT}, **extra}))
    assert regex.fullmatch('{"a":1}') and regex.fullmatch("{}")
    assert not regex.fullmatch('{"a":1,"b":2}') and not regex.fullmatch('{"b":2}')

"""Every constraint grammars/ builds has every method of engine/constraint.py's Constraint: the
engine calls them all and probes none."""

import pytest

from engine.constraint import Constraint
from grammar_fixtures import shared_compiler
from grammars.json_value.json_value_matcher import JsonValueMatcher
from grammars.match.hole_matcher import HoleMatcher
from grammars.match.matcher import Matcher
from grammars.match.unit_union import UnionMatcher
from grammars.tools.name_stage import NameFirstMatcher
from grammars.tools.tool_constraint import ToolCallConstraint

METHODS = [name for name, member in vars(Constraint).items() if callable(member) and not name.startswith("_")]


def test_the_protocol_names_what_the_engine_calls():
    assert {"ready", "fill", "sparse_mask", "advance", "rollback", "forced", "free_text", "closed",
            "is_terminated", "min_tokens"} <= set(METHODS)


@pytest.mark.parametrize("kind", [Matcher, HoleMatcher, JsonValueMatcher, UnionMatcher, NameFirstMatcher,
                                  ToolCallConstraint])
def test_each_constraint_class_has_every_method(kind):
    assert [name for name in METHODS if not callable(getattr(kind, name, None))] == []


@pytest.mark.parametrize("schema", [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                    {"type": "object", "properties": {"data": {}}, "required": ["data"]}])
def test_built_constraints_are_constraints_and_ready(schema):
    compiler = shared_compiler()
    for constraint in (compiler.compile_json_schema(schema).matcher(), compiler.json_object_matcher()):
        assert isinstance(constraint, Constraint)
        assert constraint.ready() and not constraint.free_text() and constraint.budget_forced is False

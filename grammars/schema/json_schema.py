"""JSON schema -> regex, refusing keywords the regex would silently not enforce.

``outlines_core`` turns a schema into a regex but ignores some validation keywords
(``uniqueItems``, ``not``, ``multipleOf``, ...): the output would then match the regex and
still be invalid against the schema.  ``schema_to_regex`` walks the schema first and
raises ``UnsupportedSchemaError`` naming the keyword and its JSON path.  Pass
``ignore_keywords`` to accept such schemas knowingly (the keyword is then not enforced).

Numeric bounds (``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, draft-4
boolean exclusives too) are enforced by maskd itself (numeric_bounds.py): on a node of type
``integer`` or ``number`` (alone, or in a type list) they become an exact range regex, and
next to ``enum``/``const`` they filter the values.  Bounded numbers are generated without
exponents (except when every bound is 0).  Bounds next to ``multipleOf``, ``anyOf``,
``$ref``, ... or on a node without ``type`` are still refused.

``anyOf``/``oneOf`` next to ``properties``/``required`` and ``dependencies`` /
``dependentRequired`` are rewritten into plain branches where that is sound
(object_branches.py); the others are refused.  Any other ``oneOf`` is compiled as ``anyOf``, so it
is refused unless its branches are provably exclusive (one_of.py).

Whitespace is compact by default (``""``: no whitespace between JSON tokens), so the
regex has one canonical form per value and no unbounded whitespace runs to loop in.
Properties come in the order the schema lists them; additional properties are only
generated when ``additionalProperties`` is a schema and ``properties`` is absent (outlines-core's
behaviour: beside ``properties`` it emits only the listed names, whatever ``additionalProperties`` says).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from outlines_core.json_schema import (
    BOOLEAN,
    NULL,
    NUMBER,
    STRING,
    build_regex_from_schema,
)

from grammars.errors import GrammarError, UnsupportedSchemaError
from grammars.schema.free_values import fill_free_values, mark_free_values
from grammars.schema.numeric_bounds import bound_numbers, fill_placeholders
from grammars.schema.object_branches import lower_object_branches
from grammars.schema.one_of import check_one_of
from grammars.schema.ref_cycles import check_ref_cycles
from grammars.schema.schema_normalizer import ANNOTATIONS, normalize_schema

COMPACT_WHITESPACE = ""
_BOUNDS_LEFT = ("numeric bounds are enforced only on a node with a type and without "
                "multipleOf/anyOf/oneOf/allOf/$ref/not/if next to them")

# Keyword -> why it is refused (each verified to be ignored by outlines-core 0.2.14). (`oneOf` is refused
# only where its branches may overlap: one_of.py.)
UNSUPPORTED_KEYWORDS: dict[str, str] = {
    "not": "negation is not expressible as a regex here",
    "if": "conditional schemas are ignored by the regex compiler",
    "then": "conditional schemas are ignored by the regex compiler",
    "else": "conditional schemas are ignored by the regex compiler",
    "dependentRequired": "property dependencies are ignored",
    "dependentSchemas": "property dependencies are ignored",
    "dependencies": "property dependencies are ignored",
    "patternProperties": "ignored: any property name would be allowed",
    "propertyNames": "ignored: any property name would be allowed",
    "minProperties": "property counts are ignored",
    "maxProperties": "property counts are ignored",
    "uniqueItems": "uniqueness is not expressible as a regex",
    "contains": "ignored: arrays would not be required to contain a match",
    "minContains": "ignored together with contains",
    "maxContains": "ignored together with contains",
    "multipleOf": "divisibility is ignored",
    # Bounds left after numeric_bounds.bound_numbers has enforced the ones it can:
    "minimum": _BOUNDS_LEFT,
    "maximum": _BOUNDS_LEFT,
    "exclusiveMinimum": _BOUNDS_LEFT,
    "exclusiveMaximum": _BOUNDS_LEFT,
    "$dynamicRef": "dynamic references are not resolved",
    "$recursiveRef": "recursive references are not resolved",
}

# Keywords whose value is a sub-schema / map of sub-schemas / list of sub-schemas.
_SUBSCHEMA = ("items", "additionalProperties", "unevaluatedProperties", "unevaluatedItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
# Values that are data, never schemas: do not walk into them.
_DATA = ("enum", "const", "default", "examples", "example")


def _check(node: Any, path: str, allowed: frozenset[str]) -> None:
    """Raise UnsupportedSchemaError for the first refused keyword under ``node``."""
    if not isinstance(node, dict):
        if isinstance(node, list):  # e.g. draft-4 tuple "items": [...]
            for i, sub in enumerate(node):
                _check(sub, f"{path}/{i}", allowed)
        return
    _check_combinator(node, path, allowed)
    for key, value in node.items():
        if key in _DATA:
            continue
        if key in UNSUPPORTED_KEYWORDS and key not in allowed:
            raise UnsupportedSchemaError(key, f"{path}/{key}", UNSUPPORTED_KEYWORDS[key])
        if key in ("unevaluatedProperties", "unevaluatedItems") and value not in (True, False):
            if key not in allowed:
                raise UnsupportedSchemaError(key, f"{path}/{key}", "only true/false is enforced")
        if key in _SUBSCHEMA:
            _check(value, f"{path}/{key}", allowed)
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                _check(sub, f"{path}/{key}/{name}", allowed)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                _check(sub, f"{path}/{key}/{i}", allowed)


_COMBINATORS = ("anyOf", "oneOf", "allOf")
_COMBINATOR_SIBLINGS = ANNOTATIONS | {"type", "$defs", "definitions"}
_TYPED = ("type", "$ref", "const", "enum", "anyOf", "oneOf", "allOf")


def _check_combinator(node: dict, path: str, allowed: frozenset[str]) -> None:
    """outlines-core keeps only one side of a node that has anyOf/oneOf/allOf *and* other keywords:
    beside `properties` it drops the combinator, otherwise it drops the siblings (`required`, `enum`,
    `type`, ...); a branch that only lists `required` names is not enforced either. Refuse those."""
    present = [k for k in _COMBINATORS if isinstance(node.get(k), list)]
    if not present or present[0] in allowed:
        return
    key = present[0]
    if len(present) > 1:
        raise UnsupportedSchemaError(present[1], f"{path}/{present[1]}", f"next to `{key}` it is ignored by the "
                                     f"regex compiler, which keeps only one combinator; nest one inside the other")
    for sibling in node:
        if sibling != key and sibling not in _COMBINATOR_SIBLINGS:
            raise UnsupportedSchemaError(key, f"{path}/{key}", f"next to `{sibling}` one of the two is ignored by the "
                                         f"regex compiler; move `{sibling}` into each branch")
    for i, branch in enumerate(node[key]):
        if not isinstance(branch, dict):
            continue
        if "type" in node and not any(k in branch for k in _TYPED):
            raise UnsupportedSchemaError(key, f"{path}/{key}/{i}", "the node's `type` is ignored next to it and "
                                         "this branch has none; give the branch its own `type`")
        if "required" in branch and "properties" not in branch and "$ref" not in branch:
            raise UnsupportedSchemaError(key, f"{path}/{key}/{i}", "a branch that only lists `required` names is "
                                         "not enforced; give the branch its `properties` (and `type`)")


def check_schema(schema: dict, ignore_keywords: Iterable[str] = ()) -> None:
    """Raise UnsupportedSchemaError if ``schema`` uses a keyword the regex cannot enforce."""
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(
            f"a JSON schema must be an object (or true/false), got {type(schema).__name__}; "
            f"send the schema as a JSON object"
        )
    _check_lowered(lower_object_branches(schema), ignore_keywords)
    check_ref_cycles(schema)


def _check_lowered(schema: dict, ignore_keywords: Iterable[str]) -> None:
    """check_schema on a schema lower_object_branches has rewritten already."""
    allowed = frozenset(ignore_keywords)
    _check(bound_numbers(schema)[0], "", allowed)  # bounds it enforces are fine
    if "oneOf" not in allowed:  # listed: oneOf knowingly compiled as anyOf (exclusivity unenforced)
        check_one_of(schema)


def schema_to_regex(
    schema: dict | str,
    whitespace: str | None = None,
    ignore_keywords: Iterable[str] = (),
    free_values: bool = False,
) -> str:
    """Regex matching exactly the JSON texts the schema allows (compact by default).

    ``whitespace`` is a regex for the whitespace allowed between JSON tokens
    (default ``""``: none).  Raises ``UnsupportedSchemaError`` for keywords the regex
    would not enforce, and ``GrammarError`` for schemas outlines-core cannot read.
    ``free_values``: free-form values (``{}``, ``{"type": "object"}``, ...) become holes for the
    JSON-value automaton (grammars/schema/free_values.py) instead of depth-limited regexes.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"the JSON schema is not valid JSON ({e}); fix its syntax") from None
    if not isinstance(schema, (dict, bool)):
        check_schema(schema)  # raises the error naming what a schema must be
    lowered = lower_object_branches(schema)  # object-level anyOf/oneOf and dependencies it can enforce
    _check_lowered(lowered, ignore_keywords)
    check_ref_cycles(schema)  # on the schema as sent: its $refs point into it
    schema = lowered
    schema, numbers = bound_numbers(schema)
    hole = None
    if free_values:
        schema, hole = mark_free_values(schema)
    ws = COMPACT_WHITESPACE if whitespace is None else whitespace
    normalized = normalize_schema(schema)
    try:
        regex = fill_placeholders(build_regex_from_schema(json.dumps(normalized), ws), numbers)
        return fill_free_values(regex, hole) if hole else regex
    except ValueError as e:
        msg = str(e).split("\n")[0]
        if msg.startswith("Format ") and "not supported" in msg:
            raise UnsupportedSchemaError("format", "", msg) from None
        raise GrammarError(
            f"the JSON schema cannot be compiled to a grammar: {msg}; use the keywords "
            f"listed in maskd's documentation (type, properties, required, items, enum, "
            f"const, anyOf/oneOf/allOf, local $ref, pattern, format, lengths)"
        ) from None


def json_value_regex(depth: int = 3) -> str:
    """Regex for any compact JSON value nesting objects/arrays at most ``depth`` deep."""
    scalar = rf"({STRING}|{NUMBER}|{BOOLEAN}|{NULL})"
    value = scalar
    for _ in range(depth):
        obj = rf"\{{({STRING}:{value}(,{STRING}:{value})*)?\}}"
        arr = rf"\[({value}(,{value})*)?\]"
        value = rf"({scalar}|{obj}|{arr})"
    return value


def json_object_regex(depth: int = 3) -> str:
    """Regex for OpenAI's ``response_format: {"type": "json_object"}``: any JSON object."""
    value = json_value_regex(depth - 1)
    return rf"\{{({STRING}:{value}(,{STRING}:{value})*)?\}}"


JSON_OBJECT_REGEX = json_object_regex()

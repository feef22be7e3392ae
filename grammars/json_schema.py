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
from grammars.free_values import fill_free_values, mark_free_values
from grammars.numeric_bounds import bound_numbers, fill_placeholders
from grammars.object_branches import lower_object_branches
from grammars.one_of import check_one_of
from grammars.schema_normalizer import ANNOTATIONS, normalize_schema

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


def check_ref_cycles(schema: Any) -> None:
    """Raise UnsupportedSchemaError for a local ``$ref`` cycle that no finite value can leave: one
    through ``$ref`` alone (``{"$ref": "#/properties/a", "properties": {"a": {"$ref": "#/properties/a"}}}``),
    or one whose every step is mandatory (a required property, allOf, all branches of anyOf/oneOf,
    items with minItems >= 1).
    outlines-core cuts recursion at a few levels: it dropped the first kind silently and closed the
    second with a value the schema rejects. Optional recursion (a tree whose children may be absent) is
    kept, cut at outlines-core's depth. Runs without recursion, in time linear in the schema."""
    nodes: dict[int, tuple[dict, str]] = {}  # id -> (schema node, JSON pointer), reachable from the root
    groups: dict[int, list[list[int]]] = {}  # id -> groups: the node ends iff every group has a member that ends
    stack, has_ref = [(schema, "")], False
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict) or id(node) in nodes:
            continue
        nodes[id(node)] = (node, path)
        need: list[list[tuple[Any, str]]] = []
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            has_ref, target = True, _resolve(schema, ref)
            if isinstance(target, dict):  # unresolved: outlines-core names it; true: any value ends
                need.append([(target, ref[1:])])
        for key in ("allOf", "anyOf", "oneOf"):
            branches = [(b, f"{path}/{key}/{i}") for i, b in enumerate(node.get(key) or ())]
            if key == "allOf":
                need += [[b] for b in branches if isinstance(b[0], dict)]
            elif branches and all(isinstance(b, dict) for b, _ in branches):  # a `true` branch ends
                need.append(branches)
        kinds = node.get("type", "object" if "properties" in node or "required" in node else None)
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        if kinds == "object" and "const" not in node and "enum" not in node:
            need += [[(props[name], f"{path}/properties/{name}")] for name in node.get("required") or ()
                     if isinstance(name, str) and isinstance(props.get(name), dict)]
        min_items = node.get("minItems") if isinstance(node.get("minItems"), int) else 0
        if kinds == "array" and min_items > 0 and isinstance(node.get("items"), dict):
            need.append([(node["items"], f"{path}/items")])
        groups[id(node)] = [[id(sub) for sub, _ in group] for group in need]
        stack += [sub for group in need for sub in group]
        stack += [(sub, f"{path}/properties/{name}") for name, sub in props.items()]
        for key in ("items", "prefixItems", "additionalProperties"):
            value = node.get(key)
            stack += [(sub, f"{path}/{key}/{i}") for i, sub in enumerate(value)] if isinstance(value, list) else \
                [(value, f"{path}/{key}")]
    if not has_ref:
        return  # a tree without references: every value can end
    ends = _ending(groups)
    for key, (node, path) in nodes.items():
        if key not in ends and isinstance(node.get("$ref"), str):
            ref, where = node["$ref"], f"{path}/$ref"
            why = ("leads back to itself through $ref alone, so it names no value" if _ref_chain_loops(schema, node)
                   else "recurses at every turn (required properties, allOf, every branch of anyOf/oneOf, the items "
                   "of a non-empty array), so no finite value is valid (its grammar would have to nest without end)")
            error = UnsupportedSchemaError("$ref", where)
            error.args = (f"the JSON schema's $ref {ref!r} at {where} {why}; make a step of the cycle optional (a "
                          "property not required, an anyOf branch that ends, minItems 0) or break the cycle",)
            raise error


def _resolve(root: Any, ref: str) -> Any:
    """The node a local JSON pointer (``#/a/b``) names, or None."""
    node = root
    for part in (p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _ending(groups: dict[int, list[list[int]]]) -> set[int]:
    """The nodes some finite value satisfies (least fixpoint: a node ends once each group has an ending member)."""
    waiting = {key: [set(group) for group in need if group] for key, need in groups.items()}
    parents: dict[int, list[int]] = {}
    for key, need in waiting.items():
        for member in set().union(*need) if need else ():
            parents.setdefault(member, []).append(key)
    ends, ready = set(), [key for key, need in waiting.items() if not need]
    while ready:
        key = ready.pop()
        if key in ends:
            continue
        ends.add(key)
        for parent in parents.get(key, ()):
            need = waiting[parent] = [group for group in waiting[parent] if key not in group]
            if not need and parent not in ends:
                ready.append(parent)
    return ends


def _ref_chain_loops(root: Any, node: dict) -> bool:
    """Whether following ``$ref`` alone from node comes back to a node already passed."""
    seen = set()
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        if id(node) in seen:
            return True
        seen.add(id(node))
        node = _resolve(root, node["$ref"])
    return False


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
    JSON-value automaton (grammars/free_values.py) instead of depth-limited regexes.
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

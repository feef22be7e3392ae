"""Free-form values in a schema become holes that the shared JSON-value automaton fills.

`{}`, `true`, `{"type": "object"}` (no properties, any additional ones: metadata, headers, kwargs)
and `{"type": "array"}` without item schema accept any JSON value, object or array. outlines-core
expands such a value into a regex of nested objects and arrays cut at a fixed depth: 6-26 thousand
characters and seconds of compile per occurrence. Instead, `mark_free_values` puts a placeholder
where any value may stand (an object's property values, an array's items), and after the regex is
built `fill_free_values` swaps it for HOLE, a control byte that no JSON text contains. The unit's
index then steps over a free value in one sentinel token, and at run time the JSON-value automaton
(grammars/json_value/json_value.py) is entered there instead (grammars/match/hole_matcher.py): any depth, no regex.
"""

from __future__ import annotations

import json
from typing import Any

from grammars.schema.schema_normalizer import ANNOTATIONS, map_subschemas

HOLE = "\x01"  # in a unit's regex: one JSON value of any shape (never a byte of JSON text)
HOLE_REGEX = r"\x01"
_OBJECT_KEYS = ANNOTATIONS | {"type", "additionalProperties"}
_ARRAY_KEYS = ANNOTATIONS | {"type", "items", "minItems", "maxItems"}


def _any(node: Any) -> bool:
    """Whether ``node`` accepts every JSON value."""
    return node is True or (isinstance(node, dict) and set(node) <= ANNOTATIONS)


def _mark(node: Any, path: str, placeholder: dict) -> Any:
    if _any(node):
        return dict(placeholder)
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "object" and set(node) <= _OBJECT_KEYS and _any(node.get("additionalProperties", True)):
        return {"type": "object", "additionalProperties": dict(placeholder)}
    if kind == "array" and set(node) <= _ARRAY_KEYS and _any(node.get("items", True)):
        return {**{k: v for k, v in node.items() if k not in ANNOTATIONS}, "items": dict(placeholder)}
    return map_subschemas(node, path, lambda sub, sub_path: _mark(sub, sub_path, placeholder))


def mark_free_values(schema: Any) -> tuple[Any, str]:
    """``schema`` with every free-form value replaced by a string placeholder, and the placeholder."""
    name, text = "maskdfree", json.dumps(schema)
    while name in text:  # must not collide with the schema's own strings
        name += "x"
    return _mark(schema, "", {"const": name}), name


def fill_free_values(regex: str, placeholder: str) -> str:
    """Swap the placeholder's quoted-string regex (outlines-core's const) for the hole."""
    return regex.replace(f'"{placeholder}"', HOLE_REGEX)

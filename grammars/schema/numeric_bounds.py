"""bound_numbers: enforce minimum/maximum/exclusiveMinimum/exclusiveMaximum with regexes.

outlines-core ignores numeric bounds.  So before it sees the schema, every bounded
``integer``/``number`` node is replaced by a string ``const`` placeholder, and once
outlines-core has built the regex, ``fill_placeholders`` swaps each quoted placeholder
for the node's range regex (numeric_range.py): the value stays a bare JSON number.

* Bounds may be draft-6+ (``exclusiveMinimum: 3``) or draft-4 (``minimum: 3`` with
  ``exclusiveMinimum: true``), integers or decimals; the tighter of two bounds wins.
* ``type: ["integer", "null"]`` becomes an ``anyOf`` of the bounded number and the rest.
* Bounds next to ``enum``/``const`` filter those values instead.
* Bounds on a node whose ``type`` has no numeric type constrain nothing: they are dropped.
* Keywords for other types (``minLength``, ``items``, ...) and unknown ones constrain no
  number, so the placeholder may replace them; bounds next to keywords that do apply to
  numbers (``multipleOf``, ``anyOf``, ``$ref``, ...) or on a node without ``type`` are left
  in place, for json_schema.py to refuse.
* Bounds no value satisfies (``minimum`` above ``maximum``) are a GrammarError.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from grammars.errors import GrammarError, UnsupportedSchemaError
from grammars.schema.numeric_range import integer_bounds, integer_range_regex, number_range_regex
from grammars.schema.schema_normalizer import map_subschemas

BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
NUMERIC_TYPES = ("integer", "number")
# Keywords that constrain numbers too: a placeholder would drop them, so their node is kept.
_NUMERIC_APPLICATORS = {"multipleOf", "anyOf", "oneOf", "allOf", "$ref", "not", "if", "then",
                        "else", "$dynamicRef", "$recursiveRef"}
MAX_DIGITS = 350  # longest bound (digits written out, e.g. 1e300) we build a regex for

Bounds = tuple[Decimal | None, bool, Decimal | None, bool]  # lo, lo_strict, hi, hi_strict


def _decimal(value: Any, keyword: str, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GrammarError(f"JSON schema keyword {keyword!r} at {path} must be a number, "
                           f"got {json.dumps(value)}; fix the schema")
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise GrammarError(f"JSON schema keyword {keyword!r} at {path} must be a finite "
                           f"number, got {value}; fix the schema")
    if len(format(abs(number), "f")) > MAX_DIGITS:
        raise UnsupportedSchemaError(keyword, path, f"bounds longer than {MAX_DIGITS} digits "
                                     f"written out are not enforced")
    return number


def _side(node: dict, path: str, inclusive: str, exclusive: str, lower: bool):
    """One side's bound and strictness: the tighter of ``inclusive`` and ``exclusive``."""
    bound, strict = None, False
    if inclusive in node:
        bound = _decimal(node[inclusive], inclusive, f"{path}/{inclusive}")
        strict = node.get(exclusive) is True  # draft-4 boolean form
    value = node.get(exclusive)
    if value is not None and not isinstance(value, bool):
        other = _decimal(value, exclusive, f"{path}/{exclusive}")
        if bound is None or (other >= bound if lower else other <= bound):
            bound, strict = other, True
    return bound, strict


def read_bounds(node: dict, path: str) -> Bounds:
    """(lo, lo_strict, hi, hi_strict) of a node; a None bound is unbounded."""
    lo, lo_strict = _side(node, path, "minimum", "exclusiveMinimum", lower=True)
    hi, hi_strict = _side(node, path, "maximum", "exclusiveMaximum", lower=False)
    return lo, lo_strict, hi, hi_strict


def in_bounds(value: Decimal, bounds: Bounds) -> bool:
    lo, lo_strict, hi, hi_strict = bounds
    return ((lo is None or value > lo or (value == lo and not lo_strict))
            and (hi is None or value < hi or (value == hi and not hi_strict)))


def _describe(bounds: Bounds) -> str:
    lo, lo_strict, hi, hi_strict = bounds
    return " and ".join(([f"{'>' if lo_strict else '>='} {lo}"] if lo is not None else [])
                        + ([f"{'<' if hi_strict else '<='} {hi}"] if hi is not None else []))


def range_regex(integer: bool, bounds: Bounds, path: str) -> str:
    """The regex for the integers (or numbers) within ``bounds``; GrammarError if none."""
    lo, lo_strict, hi, hi_strict = bounds
    try:
        if integer:
            return integer_range_regex(*integer_bounds(lo, hi, lo_strict, hi_strict))
        return number_range_regex(lo, hi, lo_strict, hi_strict)
    except ValueError:
        kind = "integer" if integer else "number"
        raise GrammarError(f"no {kind} is {_describe(bounds)} (JSON schema at {path or '/'}); "
                           f"fix minimum/maximum so the range is not empty") from None


def _filter_values(node: dict, bounds: Bounds, path: str) -> dict:
    """Bounds next to enum/const: drop the numeric values out of bounds."""
    def inside(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True  # bounds only constrain numbers
        return in_bounds(Decimal(repr(value)) if isinstance(value, float) else Decimal(value), bounds)

    out = {k: v for k, v in node.items() if k not in BOUND_KEYWORDS}
    if isinstance(node.get("enum"), list):
        out["enum"] = [v for v in node["enum"] if inside(v)]
    if ("const" in node and not inside(node["const"])) or out.get("enum") == []:
        raise GrammarError(f"no value of enum/const at {path or '/'} is {_describe(bounds)}; "
                           f"fix the values or the bounds")
    return out


def _rewrite(node: Any, path: str, regexes: dict[str, str], prefix: str) -> Any:
    if not isinstance(node, dict):
        return node
    node = map_subschemas(node, path, lambda sub, p: _rewrite(sub, p, regexes, prefix))
    if not any(k in node for k in BOUND_KEYWORDS):
        return node
    bounds = read_bounds(node, path)
    if "enum" in node or "const" in node:
        return _filter_values(node, bounds, path)
    types = [node["type"]] if isinstance(node.get("type"), str) else node.get("type")
    if isinstance(types, list) and not set(types) & set(NUMERIC_TYPES):
        return {k: v for k, v in node.items() if k not in BOUND_KEYWORDS}  # nothing to bound
    if not isinstance(types, list) or set(node) & _NUMERIC_APPLICATORS:
        return node
    placeholder = f"{prefix}{len(regexes)}"
    regexes[placeholder] = range_regex("number" not in types, bounds, path)
    others = [t for t in types if t not in NUMERIC_TYPES]
    if not others:
        return {"const": placeholder}
    rest = {k: v for k, v in node.items() if k not in BOUND_KEYWORDS}
    return {"anyOf": [{"const": placeholder}, {**rest, "type": others}]}


def bound_numbers(schema: Any) -> tuple[Any, dict[str, str]]:
    """``schema`` with bounded numeric nodes replaced by placeholders, and their regexes."""
    prefix, text = "maskdbound", json.dumps(schema)
    while prefix in text:  # a placeholder must not collide with the schema's own strings
        prefix += "x"
    regexes: dict[str, str] = {}
    return _rewrite(schema, "", regexes, prefix), regexes


def fill_placeholders(regex: str, regexes: dict[str, str]) -> str:
    """Swap each placeholder's quoted-string regex (outlines-core's const) for its range."""
    for placeholder, number in regexes.items():
        regex = regex.replace(f'"{placeholder}"', f"({number})")
    return regex

"""check_one_of: `oneOf` is compiled as `anyOf`, so it is accepted only where the two are the same.
(Over 300 lines: one idea, the rules that tell branches apart, which read better side by side.)

outlines-core turns `oneOf` into the same alternation as `anyOf`, so an output matching two branches
could be written although `oneOf` forbids it (and the server's output check would then withhold it as
an error). Where nothing a branch's regex writes is valid against another branch, "at least one" is
"exactly one" and the alternation is exact. So every `oneOf` left after object_branches.py (which
makes object-level ones exclusive itself) must have its branches pairwise told apart, one of:

* their JSON types are disjoint (`integer` is a `number`; `const`/`enum` values count by their type);
* one lists its values (`const`/`enum`) and none of them passes the other's type/const/enum;
* a value of both could only be an object, and a property required in both has sub-schemas told
  apart by these rules (a discriminator: `"kind": {"const": "circle"}` / `{"const": "square"}`);
* a value of both could only be an object, and one branch requires a name the other rules out
  (`additionalProperties: false` without it in `properties`), or does not list in `properties`
  (without `additionalProperties`): outlines-core writes only listed names, so what the other
  writes never has it. (Likewise a branch with `properties` writes only objects.)

A branch is read through local `$ref`s (the target alone: up to draft 7 a `$ref` hides its siblings),
`allOf` (one member told apart is enough) and nested `anyOf`/`oneOf` (each alternative must be told
apart). Other keywords (`pattern`, bounds, lengths,
formats) are not compared: such branches are refused, and the message says how to fix the schema.
Each pair's proof is a bounded search (_STEPS): branches too big to tell apart are refused too.
"""

from __future__ import annotations

import re
from typing import Any

from grammars.errors import UnsupportedSchemaError
from grammars.schema.ref_cycles import resolve_pointer
from grammars.schema.schema_normalizer import map_subschemas

_ALL = frozenset({"null", "boolean", "object", "array", "string", "integer", "fraction"})
# JSON Schema type name -> the parts of _ALL it covers ("fraction": a number that is not an integer)
_TYPES = {"null": {"null"}, "boolean": {"boolean"}, "object": {"object"}, "array": {"array"},
          "string": {"string"}, "integer": {"integer"}, "number": {"integer", "fraction"}}
_WRITTEN_BY = ("properties", "allOf", "anyOf", "oneOf", "prefixItems", "enum", "const", "$ref", "type")
_STEPS = 20_000  # steps to prove one pair of branches disjoint before giving up (nested alternatives multiply)
_REF_DEPTH = 32  # nesting followed through $ref/anyOf/allOf (a recursive schema refers to itself)


def check_one_of(schema: Any) -> None:
    """Raise UnsupportedSchemaError for the first `oneOf` whose branches may overlap."""
    def visit(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            if isinstance(node.get("oneOf"), list):
                _check_branches(node["oneOf"], f"{path}/oneOf", schema)
            map_subschemas(node, path, visit)
        return node
    visit(schema, "")


def _check_branches(branches: list, path: str, root: Any) -> None:
    for j in range(len(branches)):
        for i in range(j):
            if not (_Proof(root).apart(branches[i], branches[j], True)
                    and _Proof(root).apart(branches[j], branches[i], True)):
                raise UnsupportedSchemaError("oneOf", path, (
                    f"branches {i} and {j} may both match one value, and oneOf is compiled as anyOf, so such "
                    f"an output (invalid under oneOf) could be written; use anyOf if a value may match both, "
                    f"or make the branches exclusive: different types, different const/enum values, or in "
                    f"object branches a property required in each with a different const (a discriminator)"))


def _value_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):  # before int: True is an int in Python
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "fraction"  # JSON Schema: 1.0 is an integer
    return {str: "string", list: "array", dict: "object"}.get(type(v), "object")


def _equal(a: Any, b: Any) -> bool:
    """JSON equality (1 == 1.0, but true != 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_equal, a, b))
    return a == b


class _Proof:
    """One proof within a schema (for its local $refs), within a step budget: past it every answer is
    the cautious one (not apart, any type, values unknown, nothing required)."""

    def __init__(self, root: Any) -> None:
        self.root, self.steps = root, _STEPS

    def _tick(self) -> bool:
        self.steps -= 1
        return self.steps >= 0

    def view(self, s: Any) -> Any:
        """s, or what its `$ref` chain points to: up to draft 7 a `$ref` hides its siblings (and later
        drafts only add them as constraints), so the target alone is a sound reading. True (any value)
        for a `$ref` that cannot be followed."""
        for _ in range(_REF_DEPTH):
            if not (isinstance(s, dict) and "$ref" in s):
                return s
            s = self.target(s)
        return True

    def apart(self, x: Any, y: Any, emitted: bool, depth: int = 0) -> bool:
        """True only if no value of x is valid against y; with ``emitted``, only the values x's regex
        writes are meant (a subset of x's valid values: see _written_by). False: maybe, or unsure."""
        if depth > _REF_DEPTH or not self._tick():
            return False
        if isinstance(x, dict) and "$ref" in x:
            emitted = emitted and _written_by(x) == "$ref"  # else its regex is not the target's
        x, y = self.view(x), self.view(y)
        tx, ty = self.types(x, emitted), self.types(y)
        if x is False or y is False or not tx & ty:
            return True
        if self._values_apart(x, y) or self._values_apart(y, x):
            return True
        deeper = depth + 1
        if isinstance(x, dict):  # x's values all lie in each of these, or in one of these alternatives
            if any(self.apart(m, y, False, deeper) for m in _list(x, "allOf")):
                return True
            for key in ("anyOf", "oneOf"):
                if _list(x, key) and all(self.apart(alt, y, emitted and _written_by(x) == key, deeper)
                                         for alt in _list(x, key)):
                    return True
        if isinstance(y, dict):  # y's valid values all lie in each of these, or in one alternative
            if any(self.apart(x, m, emitted, deeper) for m in _list(y, "allOf")):
                return True
            for key in ("anyOf", "oneOf"):
                if _list(y, key) and all(self.apart(x, alt, emitted, deeper) for alt in _list(y, key)):
                    return True
        common = tx & ty
        if common <= {"object"}:  # a value of both is an object: required names are in it
            for name in self.required(x) | self.required(y):  # a discriminator, or a name one side rules out
                if any(self.apart(sx, sy, False, deeper) for sx in self.property(x, name)
                       for sy in self.property(y, name)):
                    return True
            if emitted and isinstance(x.get("properties"), dict) and x.get("additionalProperties", False) is False:
                # outlines-core writes only the names listed in `properties` (object_branches.py relies on
                # it too): a name y requires and x does not list is never written
                if any(name not in x["properties"] for name in self.required(y)):
                    return True
        for kind, low, high in (("string", "minLength", "maxLength"), ("array", "minItems", "maxItems")):
            if common <= {kind}:  # lengths or item counts that no value has in both
                (lo_x, hi_x), (lo_y, hi_y) = self.bounds(x, low, high), self.bounds(y, low, high)
                if max(lo_x, lo_y) > min(hi_x, hi_y):
                    return True
        if common <= {"string"}:  # anchored patterns whose literal starts differ
            starts_x = [_literal_start(p.get("pattern")) for p in self.parts(x)]
            starts_y = [_literal_start(p.get("pattern")) for p in self.parts(y)]
            if any(a and b and not (a.startswith(b) or b.startswith(a)) for a in starts_x for b in starts_y):
                return True
        return False

    def _values_apart(self, x: Any, y: Any) -> bool:
        """x lists its values and none of them is valid against y."""
        values = self.values(x)
        return values is not None and not any(self.admits(y, v) for v in values)

    def target(self, s: dict) -> Any:
        """What a local `$ref` points to (True, any value, if it cannot be followed)."""
        ref = s.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return True
        return resolve_pointer(self.root, ref, missing=True)

    def types(self, s: Any, emitted: bool = False, depth: int = 0) -> frozenset:
        """The JSON types (parts of _ALL) a value valid against s can have, a superset; with
        ``emitted``, of the values s's regex writes."""
        if isinstance(s, dict) and "$ref" in s:
            emitted = emitted and _written_by(s) == "$ref"
        s = self.view(s)
        if s is False:
            return frozenset()
        if not isinstance(s, dict) or depth > _REF_DEPTH or not self._tick():
            return _ALL
        types = _ALL
        if emitted and isinstance(s.get("properties"), dict):  # written from `properties`: an object
            types = frozenset({"object"})
        if isinstance(s.get("type"), (str, list)):
            names = [s["type"]] if isinstance(s["type"], str) else s["type"]
            types &= frozenset().union(*(_TYPES.get(n, _ALL) for n in names if isinstance(n, str)))
        values = self._own_values(s)
        if values is not None:
            types &= frozenset(map(_value_type, values))
        for key in ("anyOf", "oneOf"):
            if _list(s, key):
                alternatives = (self.types(alt, emitted and _written_by(s) == key, depth + 1) for alt in _list(s, key))
                types &= frozenset().union(*alternatives)
        for member in _list(s, "allOf"):
            types &= self.types(member, False, depth + 1)
        return types

    def values(self, s: Any, depth: int = 0) -> list | None:
        """Every value valid against s can be found in this list (None: s does not list its values)."""
        s = self.view(s)
        if s is False:
            return []
        if not isinstance(s, dict) or depth > _REF_DEPTH or not self._tick():
            return None
        if self._own_values(s) is not None:
            return self._own_values(s)
        for key in ("anyOf", "oneOf"):
            if _list(s, key):
                alternatives = [self.values(alt, depth + 1) for alt in _list(s, key)]
                if all(v is not None for v in alternatives):
                    return [v for vs in alternatives for v in vs]
        return None

    @staticmethod
    def _own_values(s: dict) -> list | None:
        if "const" in s:
            return [s["const"]]
        return list(s["enum"]) if isinstance(s.get("enum"), list) else None

    def admits(self, s: Any, v: Any) -> bool:
        """False only if v is certainly invalid against s (by type, const, enum, pattern, lengths)."""
        if _value_type(v) not in self.types(s):
            return False
        values = self.values(s)
        if values is not None and not any(_equal(v, w) for w in values):
            return False
        return not any(_fails(p, v) for p in self.parts(s))

    def parts(self, s: Any, depth: int = 0) -> list[dict]:
        """s and the schemas every value of s is valid against too: its allOf members (read through $ref)."""
        s = self.view(s)
        if not isinstance(s, dict) or depth > _REF_DEPTH or not self._tick():
            return []
        found = [s]
        for member in _list(s, "allOf"):
            found += self.parts(member, depth + 1)
        return found

    def required(self, s: Any) -> set[str]:
        return {n for p in self.parts(s) for n in _list(p, "required") if isinstance(n, str)}

    def property(self, s: Any, name: str) -> list:
        """The sub-schemas the value of property ``name`` satisfies in every object valid against s
        (False where `additionalProperties: false` rules the name out)."""
        found = []
        for p in self.parts(s):
            props = p.get("properties") if isinstance(p.get("properties"), dict) else {}
            if name in props:
                found.append(props[name])
            elif "patternProperties" not in p and isinstance(p.get("additionalProperties"), (dict, bool)):
                found.append(p["additionalProperties"])
        return found

    def bounds(self, s: Any, low: str, high: str) -> tuple[float, float]:
        """The tightest [low, high] range of minLength/maxLength or minItems/maxItems over s's parts."""
        parts = self.parts(s)
        lows = [p[low] for p in parts if isinstance(p.get(low), int) and not isinstance(p[low], bool)]
        if low == "minLength":  # a pattern's literal start is as long as its shortest match, at least
            lows += [len(_literal_start(p.get("pattern"))) for p in parts]
        highs = [p[high] for p in parts if isinstance(p.get(high), int) and not isinstance(p[high], bool)]
        return max(lows, default=0), min(highs, default=float("inf"))


def _fails(s: dict, v: Any) -> bool:
    """Whether v fails s's pattern or lengths (Python's re, as the server's output check uses)."""
    if isinstance(v, str):
        if isinstance(s.get("pattern"), str):
            try:
                if not re.search(s["pattern"], v):
                    return True
            except re.error:
                pass
        low, high = s.get("minLength", 0), s.get("maxLength", float("inf"))
        return isinstance(low, (int, float)) and isinstance(high, (int, float)) and not low <= len(v) <= high
    if isinstance(v, list):
        low, high = s.get("minItems", 0), s.get("maxItems", float("inf"))
        return isinstance(low, (int, float)) and isinstance(high, (int, float)) and not low <= len(v) <= high
    return False


def _literal_start(pattern: Any) -> str:
    """The text every match of an anchored pattern starts with ("" if unknown): `^https?://` -> "http"."""
    if not isinstance(pattern, str) or not pattern.startswith("^") or "|" in pattern:
        return ""
    out, i = [], 1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern) or pattern[i + 1].isalnum():
                break  # a class (\d, \w, ...) or an escape we do not read
            c, i = pattern[i + 1], i + 1
        elif c in ".^$*+?()[]{}":
            break
        if i + 1 < len(pattern) and pattern[i + 1] in "?*{":
            break  # this character may be left out or repeated
        out.append(c)
        if i + 1 < len(pattern) and pattern[i + 1] == "+":
            break
        i += 1
    return "".join(out)


def _written_by(s: dict) -> str | None:
    """The keyword outlines-core 0.2.14 builds a node's regex from: the first of these it has (the
    others are dropped, or refused by json_schema.py's checks)."""
    return next((k for k in _WRITTEN_BY if k in s), None)


def _list(s: dict, key: str) -> list:
    value = s.get(key)
    return value if isinstance(value, list) else []

"""lower_object_branches: object-level anyOf/oneOf and property dependencies, as plain branches.

outlines-core 0.2.14 drops `anyOf`/`oneOf` next to `properties` and ignores `dependencies` /
`dependentRequired`, yet function-calling schemas use them to say which properties go together
(MaskBench Glaiveai2K: `"oneOf": [{"required": ["radius"]}, {"required": ["length", "width"]}]`
next to `properties`). The rewrites below turn them into schemas it does enforce. They are sound
(whatever the rewritten schema's regex produces is valid against the original) and sometimes
narrower (some valid instances are no longer produced).

They rest on one outlines-core behaviour, verified: an object node with `properties` never emits a
property not listed there, whatever `additionalProperties` says (we rely on it only where that is
absent or false). So a name can be removed from `properties` to forbid it.

* `anyOf`/`oneOf` next to `properties`/`required`/`additionalProperties: false`/`type: object`,
  whose branches use only those keywords, becomes an `anyOf` of the node merged with each branch
  (properties intersected, required united, unsatisfiable branches dropped). For `oneOf` each merged
  branch must fail every other branch: either a name the other requires has disjoint values or is
  not emitted, or the names the other requires (and this one does not) are removed from its
  properties; a branch requiring all the other's names matches it too and is dropped.
* `dependencies` (array form) / `dependentRequired` `A: [B, ...]`: dropped when A is never emitted;
  otherwise the Bs are added to `required`, exact when A is required and narrower when it is not (the
  Bs then always appear). If some B is not in `properties`, an optional A is removed from them; a
  required A gets the Bs listed with the `additionalProperties` schema or any value (an error when
  that is false). A schema-valued `dependencies` / `dependentSchemas` entry is dropped only when A is
  never emitted.

* An object node whose `required` names a property missing from `properties` (outlines-core would
  ignore the name) gets it listed with the `additionalProperties` schema, or any value; an error
  when `additionalProperties` is false.

Anything else is left as it is, for json_schema's checks to refuse.
"""

from __future__ import annotations

import json
from typing import Any

from grammars.errors import GrammarError
from grammars.schema.schema_normalizer import ANNOTATIONS, map_subschemas

_OBJECT_KEYS = {"properties", "required", "additionalProperties", "type"}
_SCALAR_KEYS = ANNOTATIONS | {"type", "enum", "const"}
_DEPENDENCIES = ("dependencies", "dependentRequired", "dependentSchemas")
_PY_TYPES = {"string": str, "number": (int, float), "integer": int, "boolean": bool,
             "null": type(None), "object": dict, "array": list}


class NothingToGenerate(GrammarError):
    """No instance of the (sub-)schema can be generated; a combinator branch like that is dropped."""


def lower_object_branches(schema: Any) -> Any:
    """A copy of ``schema`` with the rewrites above applied at every sub-schema (input untouched)."""
    return _lower(schema, "")


def _lower(node: Any, path: str) -> Any:
    if not isinstance(node, dict):
        return node
    lowered = {}
    for key in ("anyOf", "oneOf"):  # a branch with nothing to generate matches nothing: drop it
        if isinstance(node.get(key), list):
            kept = []
            for i, branch in enumerate(node[key]):
                try:
                    kept.append(_lower(branch, f"{path}/{key}/{i}"))
                except NothingToGenerate:
                    continue
            if not kept:
                raise NothingToGenerate(f"the JSON schema leaves nothing to generate: no branch of {path}/{key} "
                                        "can be generated")
            lowered[key] = kept
    rest = map_subschemas({k: v for k, v in node.items() if k not in lowered}, path, _lower)
    node = {k: lowered[k] if k in lowered else rest[k] for k in node}
    node = _lower_dependencies(node, path)
    merged = _lower_branches(node, path)
    if merged is not node:  # its anyOf branches are new: the walk above did not see them
        merged = {**merged, "anyOf": [_list_required(b, f"{path}/anyOf/{i}") for i, b in enumerate(merged["anyOf"])]}
    return _list_required(merged, path)


def _list_required(node: Any, path: str) -> Any:
    """An object node whose `required` names a property missing from `properties` gets it listed,
    with the `additionalProperties` schema (any value when absent or true): outlines-core ignores
    required names that are not listed, and emits only listed names once there are some."""
    if not isinstance(node, dict) or not isinstance(node.get("required"), list):
        return node
    if "properties" not in node and node.get("type") != "object":
        return node  # a bare `required` fragment (a combinator branch): lowered above or refused
    props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    missing = [name for name in node["required"] if isinstance(name, str) and name not in props]
    if not missing:
        return node
    extra = node.get("additionalProperties", True)
    if extra is False:
        raise NothingToGenerate(
            f"the JSON schema leaves nothing to generate: {path or '/'} requires {missing[0]!r}, which is not "
            f"in its `properties`, and `additionalProperties` is false; list {missing[0]!r} in `properties`")
    return {**node, "properties": {**props, **{name: {} if extra is True else extra for name in missing}}}


def _lower_dependencies(node: dict, path: str) -> dict:
    keys = [k for k in _DEPENDENCIES if isinstance(node.get(k), dict)]
    if not keys:
        return node
    props, required = dict(node.get("properties") or {}), list(node.get("required") or [])
    closed = isinstance(node.get("properties"), dict) and node.get("additionalProperties", False) is False

    def emitted(name: str) -> bool:
        return name in props or not closed

    arrays = [(k, a, bs) for k in keys for a, bs in node[k].items() if isinstance(bs, list)]
    changed = True
    while changed:  # removing A may leave another entry's B never emitted
        changed = False
        for k, a, bs in arrays:
            missing = [b for b in bs if not emitted(b)]
            extra = node.get("additionalProperties", True)
            if a in props and missing and a in required and extra is not False:
                # JSON Schema allows the Bs as additional properties: list them so they are generated
                props.update({b: {} if extra is True else extra for b in missing})
                changed = True
            elif a in props and missing:
                if a in required:
                    raise NothingToGenerate(
                        f"the JSON schema leaves nothing to generate: {k} at {path}/{k}/{a} requires "
                        f"{missing[0]!r} whenever {a!r} (a required property) is present, but only the properties "
                        f"listed in `properties` are generated and {missing[0]!r} is not one of them; list it")
                del props[a]
                changed = True
    out = {k: v for k, v in node.items() if k not in keys}
    for k in keys:
        left = {}
        for a, dep in node[k].items():
            if not emitted(a):
                continue
            if isinstance(dep, list) and all(b in props for b in dep):
                required += [b for b in dep if b not in required]
            else:
                left[a] = dep
        if left:
            out[k] = left
    if "properties" in node:
        out["properties"] = props
    if required:
        out["required"] = required
    return out


def _lower_branches(node: dict, path: str) -> dict:
    present = [k for k in ("anyOf", "oneOf", "allOf") if k in node]
    if len(present) != 1 or present[0] == "allOf" or not isinstance(node[present[0]], list):
        return node
    key = present[0]
    base = {k: v for k, v in node.items() if k != key}
    if not _OBJECT_KEYS & set(base) or not all(_object_only(s) for s in [base, *node[key]]):
        return node
    merged = [_merge(base, branch) for branch in node[key]]
    if any(m is None for m in merged):
        return node
    if key == "oneOf":
        merged = _exclusive(merged)
        if merged is None:
            return node
    kept = [m for m in merged if m is not False]
    if not kept:
        raise NothingToGenerate(
            f"the JSON schema leaves nothing to generate: no branch of {key} at {path}/{key} can be satisfied "
            f"together with the properties/required next to it" + (" without also matching another branch (oneOf "
            "allows exactly one)" if key == "oneOf" else "") + "; fix the schema")
    return {**{k: v for k, v in base.items() if k in ANNOTATIONS}, "anyOf": kept}


def _object_only(s: Any) -> bool:
    return (isinstance(s, dict) and set(s) <= _OBJECT_KEYS | ANNOTATIONS and s.get("type", "object") == "object"
            and s.get("additionalProperties", False) is False and isinstance(s.get("properties", {}), dict)
            and isinstance(s.get("required", []), list))


def _merge(base: dict, branch: dict) -> dict | bool | None:
    """One object schema for base and branch together; False if nothing satisfies both; None if unsure."""
    closed = [s.get("properties", {}) for s in (base, branch) if s.get("additionalProperties") is False]
    props: dict[str, Any] = {}
    for s in (base, branch):
        for name, sub in s.get("properties", {}).items():
            if any(name not in c for c in closed):
                continue  # the other side's additionalProperties: false forbids it
            props[name] = _intersect(props[name], sub) if name in props else sub
            if props[name] is None:
                return None
    required = list(dict.fromkeys([*base.get("required", []), *branch.get("required", [])]))
    for name in required:
        if name not in props and not closed:
            return None  # outlines-core would ignore this required name
        if props.get(name, False) is False:
            return False
    merged = {"type": "object", "properties": {n: s for n, s in props.items() if s is not False}}
    if required:
        merged["required"] = required
    if closed:
        merged["additionalProperties"] = False
    return merged


def _intersect(a: Any, b: Any) -> Any:
    """A schema for the values valid against both; False if there are none; None if unsure."""
    if _same(a, b) or _is_any(b):
        return a
    if _is_any(a):
        return b
    if not all(isinstance(s, dict) and set(s) <= _SCALAR_KEYS for s in (a, b)):
        return None
    values = _values(a) if _values(a) is not None else _values(b)
    if values is None:
        return None
    kept = [v for v in values if _admits(a, v) and _admits(b, v)]
    return {"enum": kept} if kept else False


def _exclusive(merged: list) -> list | None:
    """Each satisfiable oneOf branch narrowed to fail every other branch, or False (dropped); None if
    a branch can neither be told apart from another nor be shown to match it."""
    out = list(merged)
    for i, mine in enumerate(merged):
        if mine is False:
            continue
        props, mine_req = dict(mine["properties"]), set(mine.get("required", []))
        for j, other in enumerate(merged):
            if j == i or other is False:
                continue
            other_req = other.get("required", [])
            if any(n not in props or _disjoint(props[n], other["properties"][n]) for n in other_req):
                continue  # what branch i produces never has what branch j requires
            if set(other_req) <= mine_req:
                if not _matches(props, other):
                    return None  # branch i might fail branch j, but nothing here makes sure it does
                out[i] = False  # whatever branch i produces satisfies branch j too
                break
            for name in other_req:
                if name not in mine_req:
                    props.pop(name, None)
        else:
            out[i] = {**mine, "properties": props}
    return out


def _matches(props: dict, other: dict) -> bool:
    """Whether every object made of these properties (each present or not) satisfies other's."""
    theirs = other["properties"]
    if other.get("additionalProperties") is False and not set(props) <= set(theirs):
        return False
    return all(_is_any(theirs[n]) or _same(theirs[n], s) for n, s in props.items() if n in theirs)


def _disjoint(a: Any, b: Any) -> bool:
    """True when no value is valid against both sub-schemas (False when unsure)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    for s, other in ((a, b), (b, a)):
        if _values(s) is not None:
            return not any(_admits(other, v) for v in _values(s))
    ta, tb = ({"number"} | ts if "integer" in ts else ts for ts in (_types(a), _types(b)))
    return bool(ta and tb) and not ta & tb  # an integer is a number


def _same(a: Any, b: Any) -> bool:
    """Equal once annotations are dropped (as JSON: Python has True == 1)."""
    strip = lambda s: {k: v for k, v in s.items() if k not in ANNOTATIONS} if isinstance(s, dict) else s  # noqa: E731
    return json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)


def _is_any(s: Any) -> bool:
    return s is True or (isinstance(s, dict) and set(s) <= ANNOTATIONS)


def _values(s: dict) -> list | None:
    if "const" in s:
        return [s["const"]]
    return list(s["enum"]) if isinstance(s.get("enum"), list) else None


def _admits(s: dict, v: Any) -> bool:
    """Whether v passes s's type/enum/const (other keywords are not looked at)."""
    equal = lambda x: (type(x) is bool) == (type(v) is bool) and x == v  # noqa: E731 (True == 1 in Python)
    if ("const" in s and not equal(s["const"])) or ("enum" in s and not any(map(equal, s["enum"]))):
        return False
    types = _types(s)
    return not types or any(isinstance(v, _PY_TYPES.get(t, ())) and not (type(v) is bool and t != "boolean")
                            for t in types)


def _types(s: dict) -> set[str]:
    t = s.get("type")
    return {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()

"""Local `$ref` cycles that no finite value can leave, refused before compiling (see
check_ref_cycles); optional recursion is left to outlines-core's depth cut."""

from __future__ import annotations

from typing import Any

from grammars.errors import UnsupportedSchemaError


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
            has_ref, target = True, resolve_pointer(schema, ref)
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


def resolve_pointer(root: Any, ref: str, missing: Any = None) -> Any:
    """The node a local JSON pointer (``#/a/b``) names, or ``missing``."""
    node = root
    for part in (p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return missing
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
        node = resolve_pointer(root, node["$ref"])
    return False

"""A client's JSON schema must have JSON Schema's shape before it is compiled: a 400 naming what is wrong otherwise.

The grammar compiler reads the keywords it knows and trusts their shapes; a keyword of the wrong shape
(`"type": []`, `"pattern": 5`) once compiled into a grammar whose outputs could not be valid (the
output check withheld them: a 500) or failed inside the compiler (a 500). This walk checks the shape of
every keyword that shapes a grammar, in every subschema, in one pass over the schema without recursion
(a full metaschema validation took seconds on a schema of 12 nested oneOf levels, on the event loop).
It checks shapes only: whether a schema is satisfiable, or compiles in time, is the compiler's business.
"""

from __future__ import annotations

from server.errors import APIError

TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
             "additionalItems", "unevaluatedProperties", "unevaluatedItems")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
NUMBERS = ("minimum", "maximum", "multipleOf")
STRINGS = ("pattern", "format", "$ref")


def _shape_error(value, shape: str) -> str | None:
    if shape == "type":
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in TYPES for n in names):
            return f"must be one of {sorted(TYPES)} or a non-empty list of them, got {value!r:.80}"
    elif shape == "count" and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return f"must be a non-negative integer, got {value!r:.80}"
    elif shape == "number" and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return f"must be a number, got {value!r:.80}"
    elif shape == "exclusive" and not isinstance(value, (int, float)):  # a boolean in draft 4
        return f"must be a number, got {value!r:.80}"
    elif shape == "string" and not isinstance(value, str):
        return f"must be a string, got {value!r:.80}"
    elif shape == "required" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return f"must be a list of property names, got {value!r:.80}"
    elif shape == "enum" and not (isinstance(value, list) and value):
        return f"must be a non-empty list, got {value!r:.80}"
    return None


def check_schema(schema, param: str) -> None:
    """Raises a 400 (`invalid_schema`) naming the first keyword whose value has the wrong shape, or a
    local `$ref` that leads back to itself through nothing but `$ref`s (no instance could be checked)."""
    stack = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            _refuse(param, where, f"a schema must be an object or a boolean, got {node!r:.80}")
        if isinstance(node.get("$ref"), str) and _ref_cycle(schema, node):
            _refuse(param, f"{where}.$ref", f"{node['$ref']!r} leads back to itself through $refs alone")
        for key, value in node.items():
            shape = ("type" if key == "type" else "count" if key in COUNTS else "number" if key in NUMBERS else
                     "exclusive" if key in ("exclusiveMinimum", "exclusiveMaximum") else
                     "string" if key in STRINGS else key if key in ("required", "enum") else None)
            error = _shape_error(value, shape) if shape else None
            if error:
                _refuse(param, f"{where}.{key}", error)
            if key in SUBSCHEMA and not (key == "items" and isinstance(value, list)):
                stack.append((value, f"{where}.{key}"))
            elif key in SCHEMA_LISTS or key == "items":
                if not isinstance(value, list) or (key != "items" and not value):
                    _refuse(param, f"{where}.{key}", f"must be a non-empty list of schemas, got {value!r:.80}")
                stack.extend((item, f"{where}.{key}[{i}]") for i, item in enumerate(value))
            elif key in SCHEMA_MAPS:
                if not isinstance(value, dict):
                    _refuse(param, f"{where}.{key}", f"must be an object of schemas, got {value!r:.80}")
                stack.extend((item, f"{where}.{key}.{name}") for name, item in value.items())


def _ref_cycle(root, node) -> bool:
    """Whether following `$ref` from node (local refs only) comes back to a schema already passed."""
    seen = set()
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        if id(node) in seen:
            return True
        seen.add(id(node))
        target = root
        for part in (p.replace("~1", "/").replace("~0", "~") for p in node["$ref"][1:].split("/") if p):
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                return False  # unresolvable: the compiler names it
        node = target
    return False


def _refuse(param: str, where: str, error: str) -> None:
    raise APIError(f"{param} is not a valid JSON Schema: at schema{where or ' (the root)'}, {error}; fix the schema",
                   param=param, code="invalid_schema")

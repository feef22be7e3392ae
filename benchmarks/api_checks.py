"""What is wrong with one api_bench answer, or between a streamed answer and its non-streamed twin."""

from __future__ import annotations

import json

import jsonschema

from api_calls import anthropic_name


def schema_errors(instance, schema: dict) -> str | None:
    """None when valid; else the first validation error, short."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        error = jsonschema.exceptions.best_match(cls(schema).iter_errors(instance))
    except jsonschema.SchemaError as exc:
        return f"schema error: {exc.message[:200]}"
    return None if error is None else f"{list(error.absolute_path)}: {error.message[:200]}"


def duplicate_keys(text: str) -> list[str]:
    """Object keys written twice in one object (JSON parsers keep one silently; the schema check cannot see it)."""
    found = []

    def pairs(items):
        keys = [k for k, _ in items]
        found.extend(sorted({k for k in keys if keys.count(k) > 1}))
        return dict(items)
    try:
        json.loads(text, object_pairs_hook=pairs)
    except ValueError:
        pass
    return found


def verdict(answer: dict, functions: dict[str, dict], mode: dict) -> list[str]:
    """What is wrong with one answer's calls and stop reason; [] when valid."""
    by_name = {anthropic_name(n) if mode["api"] == "messages" else n: p for n, p in functions.items()}
    wanted = anthropic_name(next(iter(functions))) if mode["choice"] == "tool" else None
    problems = []
    calls = [b for b in answer["blocks"] if b[0] in ("tool_use", "function_call")]
    if not calls:
        problems.append(f"no call (blocks: {[b[0] for b in answer['blocks']]})")
    for index, (_, name, value) in enumerate(calls):
        if name not in by_name:
            problems.append(f"call {index}: unknown tool {name!r}")
            continue
        if wanted is not None and name != wanted:
            problems.append(f"call {index}: tool {name!r}, tool_choice named {wanted!r}")
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                problems.append(f"call {index}: arguments do not parse ({exc}): {value[:200]!r}")
                continue
        error = schema_errors(value, by_name[name])
        if error:
            problems.append(f"call {index}: invalid input {json.dumps(value)[:300]}: {error}")
    expected = "tool_use" if mode["api"] == "messages" else "completed"
    if answer["stop_reason"] != expected:
        problems.append(f"stop_reason {answer['stop_reason']!r}, expected {expected!r}")
    return problems


def key_order(answer: dict, functions: dict[str, dict], api: str) -> list[str]:
    """Calls whose top-level keys do not follow the order of the schema's `properties` (maskd writes
    properties in the schema's order; a schema check cannot see order)."""
    by_name = {anthropic_name(n) if api == "messages" else n: p for n, p in functions.items()}
    out = []
    calls = [b for b in answer["blocks"] if b[0] in ("tool_use", "function_call")]
    for index, (_, name, value) in enumerate(calls):
        try:
            value = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            continue
        declared = list((by_name.get(name) or {}).get("properties") or {})
        if not isinstance(value, dict) or not declared:
            continue
        written = [k for k in value if k in declared]
        if written != [k for k in declared if k in value]:
            out.append(f"call {index}: keys {written}, schema order {declared}")
    return out


def differences(plain: dict, streamed: dict) -> list[str]:
    """How a streamed answer differs from its non-streamed twin (ids are not compared)."""
    out = []
    if plain["stop_reason"] != streamed["stop_reason"]:
        out.append(f"stop_reason {plain['stop_reason']!r} vs streamed {streamed['stop_reason']!r}")
    a, b = plain["blocks"], streamed["blocks"]
    if len(a) != len(b):
        out.append(f"{len(a)} blocks {[x[0] for x in a]} vs streamed {len(b)} {[x[0] for x in b]}")
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            out.append(f"block {index}: {json.dumps(x)[:400]} vs streamed {json.dumps(y)[:400]}")
    return out

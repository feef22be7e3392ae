r"""normalize_schema: rewrite a JSON schema so outlines-core's regex means what it says.

Works around three outlines-core 0.2.14 behaviours found on MaskBench:

* An empty sub-schema (``{}`` or ``true``: any value) becomes an unparenthesised
  alternation, so its ``|`` splits the *whole* regex (``{"a":{}}`` then matches a bare
  ``null``).  We replace it with an explicit list of every JSON type, which it wraps.
* ``pattern`` is pasted between the quotes verbatim: ``.`` and negated classes could
  emit a raw ``"`` or control character (invalid JSON), a lone ``^``/``$`` anchor
  makes the regex unsatisfiable, and an unanchored pattern (a *search* in JSON schema)
  is treated as a full match.  We rewrite patterns into anchored, JSON-safe form.
* ``format`` regexes: ``date`` uses ``\d`` (any Unicode digit in Rust regex),
  ``date-time``/``time`` accept a time without the offset RFC 3339 requires, ``uri``
  and ``email`` can emit a raw ``"``; ``byte`` (OpenAPI's base64), ``ipv4`` and ``uri-template``
  have no regex there (``binary`` constrains nothing).  We replace
  these formats by ASCII, JSON-safe patterns (FORMAT_PATTERNS); ``\d``/``\w`` in user patterns become ASCII classes.
* ``pattern`` together with ``minLength``/``maxLength`` silently drops the pattern.
  We fold the lengths into a ``^C+$``/``^C*$`` pattern, and refuse other combinations.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from grammars.errors import UnsupportedSchemaError

ANY_VALUE = {"type": ["string", "number", "boolean", "null", "object", "array"]}
ANNOTATIONS = {"title", "description", "examples", "example", "default", "$comment",
                "deprecated", "readOnly", "writeOnly", "$schema", "$id", "id"}
_JSON_CHAR = r'[^"\\\x00-\x1F\x7F-\x9F]'  # one unescaped JSON string character
_STRING_CHAR = rf'(?:{_JSON_CHAR}|\\["\\/bfnrt])'
_CLASS_EXCLUDE = r'"\\\x00-\x1F\x7F-\x9F'
_CLASS_SHORTHAND = {"d": "0-9", "w": "a-zA-Z0-9_"}
_SHORTHAND = {"d": "[0-9]", "w": "[a-zA-Z0-9_]", "s": " ", "S": rf"[^{_CLASS_EXCLUDE} ]", "D": rf"[^{_CLASS_EXCLUDE}0-9]",
              "W": rf"[^{_CLASS_EXCLUDE}a-zA-Z0-9_]"}
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_ATOM = r"[a-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
_URI_EXCLUDE = r'"\\\x00-\x20\x7F-\x9F'
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_PCT = r"%[0-9A-Fa-f]{2}"
_URI_LITERAL = rf"[^\x00-\x20\x7F-\x9F\"'%<>\\^`{{|}}]|{_PCT}"
_VARCHAR = rf"([A-Za-z0-9_]|{_PCT})"
_VARSPEC = rf"{_VARCHAR}+(\.{_VARCHAR}+)*(:[1-9][0-9]{{0,3}}|\*)?"
FORMAT_PATTERNS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "email": rf"^{_ATOM}(\.{_ATOM})*@({_LABEL}\.)+{_LABEL}$",
    "uri": (rf"^((https?|ftp)://([a-zA-Z0-9.-]+\.[a-zA-Z]{{2,}}|localhost)(:[0-9]+)?"
            rf"(/[^{_URI_EXCLUDE}?#]*)?(\?[^{_URI_EXCLUDE}#]*)?(#[^{_URI_EXCLUDE}]*)?"
            rf"|urn:[a-zA-Z0-9][a-zA-Z0-9-]{{0,31}}:[^{_URI_EXCLUDE}]+)$"),
    "byte": r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",  # base64 (RFC 4648, OpenAPI)
    "ipv4": rf"^({_OCTET}\.){{3}}{_OCTET}$",
    "uri-template": rf"^({_URI_LITERAL}|\{{[+#./;?&=,!@|]?{_VARSPEC}(,{_VARSPEC})*\}})*$",  # RFC 6570
}
# OpenAPI's `binary` (file content) puts no constraint on a JSON string's text.
FORMATS_WITHOUT_CONSTRAINT = {"binary"}
_SINGLE_ATOM = re.compile(r"^\^?(\[(?:[^\]\\]|\\.)+\]|\\[dw]|[A-Za-z0-9])([+*])\$?$")


def _json_safe(pattern: str) -> str:
    """Make ``.``, negated classes and \\s\\S\\D\\W unable to emit '"', '\\' or controls."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in _SHORTHAND and not in_class:
                out.append(_SHORTHAND[nxt])
            elif nxt in _CLASS_SHORTHAND and in_class:
                out.append(_CLASS_SHORTHAND[nxt])
            else:
                out.append(c + nxt)
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^" + _CLASS_EXCLUDE)
                i += 2
                continue
            out.append(c)
        elif c == ".":
            out.append(_JSON_CHAR)
        elif c == '"':
            out.append(r'\\"')
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _anchored(pattern: str) -> str:
    """JSON schema ``pattern`` is a search: anchor it explicitly, JSON-safe."""
    start = pattern.startswith("^")
    end = pattern.endswith("$") and not pattern.endswith("\\$")
    core = pattern[1 if start else 0: len(pattern) - (1 if end else 0)]
    lead = "" if start else f"{_STRING_CHAR}*"
    tail = "" if end else f"{_STRING_CHAR}*"
    return f"^{lead}(?:{_json_safe(core)}){tail}$"


def _string_node(node: dict, path: str) -> dict:
    node = dict(node)
    pattern = node.pop("pattern")
    lo, hi = node.pop("minLength", None), node.pop("maxLength", None)
    if lo is None and hi is None:
        node["pattern"] = _anchored(pattern)
        return node
    m = _SINGLE_ATOM.match(pattern)
    if not m or not (pattern.startswith("^") and pattern.endswith("$")):
        raise UnsupportedSchemaError(
            "pattern", f"{path}/pattern",
            "pattern combined with minLength/maxLength is only supported for patterns of "
            "the form ^X+$ or ^X*$; put the length bounds into the pattern itself",
        )
    atom, quant = m.group(1), m.group(2)
    lo = max(int(lo or 0), 1 if quant == "+" else 0)
    node["pattern"] = f"^(?:{_json_safe(atom)}){{{lo},{'' if hi is None else int(hi)}}}$"
    return node


def map_subschemas(node: dict, path: str, fn: Callable[[Any, str], Any]) -> dict:
    """A shallow copy of ``node`` with ``fn(sub, sub_path)`` applied to each direct sub-schema
    (the places outlines-core reads schemas from)."""
    out = {}
    for key, value in node.items():
        sub = f"{path}/{key}"
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {k: fn(v, f"{sub}/{k}") for k, v in value.items()}
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems", "items") and isinstance(value, list):
            out[key] = [fn(v, f"{sub}/{i}") for i, v in enumerate(value)]
        elif key in ("items", "additionalProperties") and (isinstance(value, dict) or value is True):
            out[key] = fn(value, sub)
        else:
            out[key] = value
    return out


def normalize_schema(node: Any, path: str = "") -> Any:
    """A copy of ``node`` with the rewrites above applied at every sub-schema."""
    if node is True or (isinstance(node, dict) and set(node) <= ANNOTATIONS):
        return dict(ANY_VALUE)
    if not isinstance(node, dict):
        return node
    out = map_subschemas(node, path, normalize_schema)
    if out.get("format") in FORMATS_WITHOUT_CONSTRAINT:
        out.pop("format")
    if out.get("format") in FORMAT_PATTERNS and "pattern" not in out:
        out["pattern"] = FORMAT_PATTERNS[out.pop("format")]
        return out  # already anchored and JSON-safe
    if isinstance(out.get("pattern"), str):
        out = _string_node(out, path)
    return out

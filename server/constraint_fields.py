"""The fields besides response_format in which clients of other servers ask for a constrained
output, read into one OutputFormat: vLLM's `structured_outputs` (exactly one of json, regex, choice,
grammar, json_object, structural_tag) and its older `guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar`; llama.cpp's `json_schema` and `grammar`. A request may ask in one field only.
A regex, a choice and a GBNF grammar are read into the token index's regex here, once per
request. A GBNF grammar is enforced where it is regular (grammars/languages/gbnf.py); a recursive one, a
Lark grammar (llama.cpp marks one with a first line `%llguidance`) or a structural tag is refused
with a 400 that says so: an unenforced constraint is never answered as if it were."""

from __future__ import annotations

import json
from dataclasses import replace

from grammars import GrammarError, NotRegularError, choice_regex, gbnf_regexes, index_regex
from server.errors import APIError
from server.structured_output import OutputFormat

KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
OPTIONS = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
FIELDS = (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
          ("guided_grammar", "grammar"), ("json_schema", "json"), ("grammar", "grammar"))


def asked_formats(body) -> list[tuple[str, OutputFormat]]:
    """(field, format) for each of these fields the request fills."""
    found = []
    outputs = body.structured_outputs
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise APIError("structured_outputs must be an object holding one of " + ", ".join(KINDS),
                           param="structured_outputs")
        unknown = sorted(set(outputs) - set(KINDS) - set(OPTIONS))
        if unknown:
            raise APIError(f"structured_outputs has unknown field(s) {unknown}; it takes one of {', '.join(KINDS)}",
                           param="structured_outputs")
        kinds = [k for k in KINDS if outputs.get(k) is not None and outputs.get(k) is not False]
        if len(kinds) != 1:
            raise APIError(f"structured_outputs takes exactly one of {', '.join(KINDS)}; got "
                           f"{', '.join(kinds) or 'none'}", param="structured_outputs")
        field = f"structured_outputs.{kinds[0]}"
        found.append((field, _format(kinds[0], outputs[kinds[0]], field)))
    for field, kind in FIELDS:
        value = getattr(body, field)
        if value is not None:
            found.append((field, _format(kind, value, field)))
    return found


def one_format(asked: list[tuple[str, OutputFormat]], fields):
    """(the format, `fields` (generation.Fields) naming its field in errors); (None, fields) where
    none was asked; a 400 where more than one was."""
    if not asked:
        return None, fields
    if len(asked) > 1:
        names = [field for field, _ in asked]
        raise APIError(f"ask for one constrained output, not several: {', '.join(names)}", param=names[1])
    field, fmt = asked[0]
    if field == "response_format":
        return fmt, fields
    return fmt, replace(fields, format=field, format_schema=field)


def _format(kind: str, value, field: str) -> OutputFormat:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise APIError(f"{field} is not valid JSON ({exc})", param=field) from None
        if not isinstance(value, dict):
            raise APIError(f"{field} must be a JSON schema (an object)", param=field)
        return OutputFormat("json_schema", value)
    if kind == "json_object":
        if value is not True:
            raise APIError(f"{field} must be true", param=field)
        return OutputFormat("json_object")
    if kind == "regex":
        if not isinstance(value, str):
            raise APIError(f"{field} must be a string (a regex in Python's syntax)", param=field)
        return OutputFormat("regex", pattern=value, index_regex=_read(index_regex, value, field, "invalid_regex"))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise APIError(f"{field} must be a non-empty list of strings", param=field)
        return OutputFormat("choice", choices=tuple(value),
                            index_regex=_read(choice_regex, value, field, "invalid_choice"))
    if kind == "grammar" and not isinstance(value, str):
        raise APIError(f"{field} must be a string (a GBNF grammar)", param=field)
    if kind == "grammar" and not _lark(value):
        index, check = _read(gbnf_regexes, value, field, "invalid_grammar")
        return OutputFormat("grammar", pattern=check, index_regex=index)
    what = "a Lark grammar" if kind == "grammar" else "a structural tag"
    raise APIError(f"{field}: maskd does not enforce {what} yet, and does not answer one unenforced; "
                   "constrain the output with a JSON schema, a regex, a choice or a GBNF grammar", param=field,
                   code="unsupported_constraint")


def _read(reader, value, field: str, code: str):
    """reader(value), its GrammarError a 400 naming `field` (a grammar that is valid but not
    regular: unsupported_constraint)."""
    try:
        return reader(value)
    except GrammarError as exc:
        raise APIError(f"{field}: {exc}", param=field,
                       code="unsupported_constraint" if isinstance(exc, NotRegularError) else code) from None


def _lark(text: str) -> bool:
    """Whether a grammar is Lark rather than GBNF: llama.cpp's `%llguidance` mark, or rules written
    `name: ...` with no `::=` anywhere."""
    return text.lstrip().startswith("%llguidance") or ("::=" not in text and ":" in text)

"""The last gate: every constrained output is validated against the client's schema before it leaves.

The grammar makes outputs valid by construction; this check makes sure no bug ever hands back an
invalid call as a valid one. A failure is counted (`maskd_output_validation_failures_total`), logged
with the schema's id (a hash of its JSON), and the request ends as an error, never as a valid answer.
Outputs cut by the token budget (finish `length`) are reported as cut and not checked; a json_schema
sent with `strict: false` (some keywords relaxed, README) and json_object are checked as JSON
objects only; a regex output by Python's own `re.fullmatch` of the client's regex (\\d \\w \\s
ASCII, as the mask has them), a GBNF
grammar's by that of its regex, a choice by membership.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from functools import lru_cache

import jsonschema
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("maskd.server")
REGISTRY = CollectorRegistry()
CHECKED = Counter("maskd_outputs_validated", "Constrained outputs validated before leaving the server", ["kind"],
                  registry=REGISTRY)
FAILED = Counter("maskd_output_validation_failures", "Constrained outputs that failed validation (answered as "
                 "errors)", ["kind"], registry=REGISTRY)


def schema_id(schema: dict) -> str:
    return hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()[:16]


@lru_cache(maxsize=1024)
def _validator(schema_json: str):
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


class OutputCheck:
    def __init__(self, tool_schemas: dict[str, dict] | None = None, format_schema: dict | None = None,
                 format_kind: str | None = None, pattern: str | None = None, choices: tuple[str, ...] | None = None):
        self.tool_schemas = tool_schemas or {}
        self.format_schema, self.format_kind = format_schema, format_kind
        self.pattern, self.choices = pattern, choices  # a regex output's (Python's re), a choice's

    def call(self, name: str, arguments: str) -> str | None:
        """None if the call is valid, else why not."""
        CHECKED.labels("tool_call").inc()
        if name not in self.tool_schemas:
            return self._fail("tool_call", f"the model called {name!r}, which is not among the tools", {})
        schema = self.tool_schemas[name]
        return self._check("tool_call", arguments or "{}", schema, f"the arguments of {name!r}")

    def text(self, text: str) -> str | None:
        if self.format_kind is None:
            return None
        CHECKED.labels("structured_output").inc()
        if self.format_kind in ("regex", "grammar"):  # by Python's re, not by the token index the mask ran on
            return None if re.fullmatch(self.pattern, text, re.ASCII) else \
                self._fail("structured_output", f"the output {text[:200]!r} does not match the regex", {})
        if self.format_kind == "choice":
            return None if text in self.choices else \
                self._fail("structured_output", f"the output {text[:200]!r} is none of the choices", {})
        return self._check("structured_output", text, self.format_schema, "the structured output")

    def _check(self, kind: str, text: str, schema: dict | None, what: str) -> str | None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return self._fail(kind, f"{what} are not JSON ({exc})", schema or {})
        if schema is None:
            return None if isinstance(value, dict) else self._fail(kind, f"{what} is not a JSON object", {})
        try:
            error = jsonschema.exceptions.best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
        except RecursionError:  # fail closed: an output that cannot be checked is not handed back as valid
            return self._fail(kind, f"{what} could not be checked (the schema's $refs recurse without end)", schema)
        return None if error is None else self._fail(kind, f"{what} do not match the schema: {error.message}", schema)

    @staticmethod
    def _fail(kind: str, reason: str, schema: dict) -> str:
        FAILED.labels(kind).inc()
        log.error("output validation failed (schema %s): %s", schema_id(schema), reason)
        return f"the output failed validation and was withheld ({reason}); this is a maskd bug, please report it"

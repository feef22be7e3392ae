"""grammars: JSON schema -> regex -> token index -> bitmask, with a compile cache.

Names are imported lazily so that the compile worker process (which imports
``grammars.compile_worker``) starts without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "GrammarError": "grammars.errors",
    "UnsupportedSchemaError": "grammars.errors",
    "CompileTimeout": "grammars.errors",
    "TokenVocabulary": "grammars.vocabulary",
    "schema_to_regex": "grammars.json_schema",
    "check_schema": "grammars.json_schema",
    "json_object_regex": "grammars.json_schema",
    "JSON_OBJECT_REGEX": "grammars.json_schema",
    "UNSUPPORTED_KEYWORDS": "grammars.json_schema",
    "CompiledGrammar": "grammars.grammar",
    "GrammarCompiler": "grammars.compiler",
    "Matcher": "grammars.matcher",
    "allocate_token_bitmask": "grammars.bitmask",
    "fill_next_token_bitmasks": "grammars.bitmask",
    "apply_token_bitmask_inplace": "grammars.bitmask",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grammars' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value

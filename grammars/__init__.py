"""grammars: JSON schema -> regex -> token index -> bitmask, with a compile cache.

Names are imported lazily so that the compile worker process (which imports
``grammars.compile.compile_worker``) starts without importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "GrammarError": "grammars.errors",
    "UnsupportedSchemaError": "grammars.errors",
    "CompileTimeout": "grammars.errors",
    "TokenVocabulary": "grammars.index.vocabulary",
    "schema_to_regex": "grammars.schema.json_schema",
    "check_schema": "grammars.schema.json_schema",
    "json_object_regex": "grammars.schema.json_schema",
    "JSON_OBJECT_REGEX": "grammars.schema.json_schema",
    "UNSUPPORTED_KEYWORDS": "grammars.schema.json_schema",
    "CompiledGrammar": "grammars.match.grammar",
    "GrammarCompiler": "grammars.compile.compiler",
    "Matcher": "grammars.match.matcher",
    "allocate_token_bitmask": "grammars.masks.bitmask",
    "fill_next_token_bitmasks": "grammars.masks.bitmask",
    "apply_token_bitmask_inplace": "grammars.masks.bitmask",
    "ToolCall": "grammars.tools.tool_call",
    "ToolFormat": "grammars.tools.formats.base",
    "ToolFormatError": "grammars.tools.formats.call_regex",
    "NO_PARAMETERS_SCHEMA": "grammars.tools.formats.call_regex",
    "chosen_specs": "grammars.tools.formats.call_regex",
    "get_tool_format": "grammars.tools.formats",
    "ArgsDelta": "grammars.tools.formats",
    "CallEnd": "grammars.tools.formats",
    "CallStart": "grammars.tools.formats",
    "Content": "grammars.tools.formats",
    "ForcedText": "grammars.masks.forced_text",
    "prepare_name_stage": "grammars.tools.name_stage",
    "index_regex": "grammars.languages.python_regex",
    "choice_regex": "grammars.languages.python_regex",
    "RegexError": "grammars.languages.python_regex",
    "gbnf_regexes": "grammars.languages.gbnf",
    "NotRegularError": "grammars.languages.gbnf",
}

__all__ = sorted(_EXPORTS)


_RENAMED = {"prepare_name_stage": "prepare", "gbnf_regexes": "regexes"}  # facade name -> the module's own


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'grammars' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value

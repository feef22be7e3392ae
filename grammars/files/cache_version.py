"""The versions that key maskd's disk caches: an entry made by any other version is never read.

Each cache's version names what shapes its entries: the libraries that build them (by their
installed versions) and maskd's own code that builds them (by a digest of its source, so an edit
needs no hand-bumped number to stop old entries from being read).
"""

from __future__ import annotations

import hashlib
import os
from importlib.metadata import version

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # grammars/


def sources_digest(*names: str) -> str:
    """A digest of the named files of grammars/ (paths from there): maskd's code, versioned by its content."""
    digest = hashlib.sha256()
    for name in names:
        with open(os.path.join(_HERE, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def _libraries(*names: str) -> list[str]:
    return [f"{name}-{version(name)}" for name in names]


# A compiled unit (grammars/compile/compiler.py): the libraries grammars are built with (interegular too: a
# regex's character automaton), the unit file's format and the code that builds the index and table.
UNIT_VERSION = "/".join(["maskd-units-4", *_libraries("outlines-core", "interegular", "numpy"),
                         "src-" + sources_digest("index/_index_table.c", "index/_token_index.c", "index/_varint.h",
                                                "index/budget.py", "index/token_index.py", "index/unit_index.py",
                                                "index/plain_tokens.py", "compile/compile_worker.py",
                                                "compile/unit_file.py")])

# The JSON-value automaton's tables (grammars/json_value/json_value.py): maskd's own lexer and table builder.
JSON_VALUE_VERSION = "/".join(["maskd-json-value-1", *_libraries("numpy"),
                               "src-" + sources_digest("json_value/json_value_lexer.py",
                                                      "json_value/json_value_tables.py")])

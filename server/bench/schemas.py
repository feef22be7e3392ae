"""The schema sets the bench reads: MaskBench rows from the package sample, a file or a directory.

A row is {"subset", "id", "schema"}. The package ships a sample (data/maskbench_sample.jsonl.gz: 60
BFCL function schemas, a few Glaiveai2K, MCPspec and JME ones); ``--schemas`` names a MaskBench
`*.jsonl.gz` / `.jsonl` file or a directory of them (such as ../shared/data/maskbench beside a
checkout), the subset being the file's name.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent / "data" / "maskbench_sample.jsonl.gz"
# The full MaskBench beside a checkout (the shared data folder), for the developer scripts.
MASKBENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "maskbench"


def _read(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    subset = path.name.split(".")[0]
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{"subset": r.get("subset", subset), "id": r.get("id", f"{subset}/{i}"), "schema": r["schema"]}
            for i, r in enumerate(rows)]


def load_rows(path: str | Path | None = None) -> list[dict]:
    """The rows of ``path`` (a file or a directory of `*.jsonl[.gz]`), or of the package sample."""
    path = Path(path) if path else SAMPLE
    if path.is_dir():
        files = sorted(path.glob("*.jsonl.gz")) + sorted(path.glob("*.jsonl"))
        if not files:
            raise FileNotFoundError(f"no *.jsonl.gz or *.jsonl schema files in {path}")
        return [row for f in files for row in _read(f)]
    if not path.exists():
        raise FileNotFoundError(f"schema set {path} does not exist; give a MaskBench .jsonl.gz file or a directory")
    return _read(path)


def functions_of(schema: dict) -> dict[str, dict] | None:
    """BFCL rows are {"properties": {"<name>": <parameters>}} objects, or an anyOf of them (several
    tools); None for a schema of another shape."""
    options = schema.get("anyOf") if "anyOf" in schema else [schema]
    try:
        found = {name: params for option in options for name, params in option["properties"].items()}
    except (KeyError, TypeError, AttributeError):
        return None
    return found if found and all(isinstance(p, dict) for p in found.values()) else None


def function_rows(rows: list[dict]) -> list[dict]:
    """The BFCL rows (function-call schemas) of ``rows``; the package sample's where it has none."""
    picked = [r for r in rows if r["subset"] == "BFCL" and functions_of(r["schema"])]
    return picked or [r for r in load_rows() if r["subset"] == "BFCL"]


def per_subset(rows: list[dict], limit: int) -> list[dict]:
    """The first ``limit`` rows of each subset, subsets in their order."""
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        if seen.get(row["subset"], 0) < limit:
            seen[row["subset"]] = seen.get(row["subset"], 0) + 1
            out.append(row)
    return out

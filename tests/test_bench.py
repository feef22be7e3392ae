"""`maskd bench --suite all --quick` on a tiny schema set: every suite runs and every file it promises
exists and parses (results.json, a PNG per suite, summary.md with a table per suite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from server.bench.run import SUITES
from server.bench.schemas import load_rows

ROOT = Path(__file__).resolve().parent.parent


def test_bench_all_quick_writes_every_promised_file(tmp_path):
    rows = load_rows()  # the package sample: 3 function schemas and 1 other make the tiny set
    tiny = [r for r in rows if r["subset"] == "BFCL"][:3] + [r for r in rows if r["subset"] != "BFCL"][:1]
    schemas = tmp_path / "tiny.jsonl"
    schemas.write_text("".join(json.dumps(r) + "\n" for r in tiny))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "server.cli", "bench", "--suite", "all", "--quick", "--tiny",
                          "--schemas", str(schemas), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=3600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stderr[-4000:]

    results = json.loads((out / "results.json").read_text())
    assert list(results["suites"]) == list(SUITES)
    for name, suite in results["suites"].items():
        assert suite["status"] == "ok", (name, suite.get("error"))
        assert suite["result"]["tables"] and all(t["rows"] for t in suite["result"]["tables"]), name
        assert (out / suite["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    summary = (out / "summary.md").read_text()
    sections = summary.split("\n### ")[1:]
    assert [s.split("\n", 1)[0] for s in sections] == list(SUITES)
    for section in sections:
        assert "\n|---" in section and "![" in section, section[:200]
    for name in SUITES:  # the table on stdout too
        assert results["suites"][name]["result"]["tables"][0]["title"] in run.stdout

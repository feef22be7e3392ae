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

ROOT = Path(__file__).resolve().parents[2]


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


def test_overhead_credits_forced_tokens_to_the_step_that_made_them():
    """A step that samples a token and appends the forced text after it gains all of them at once:
    the decode rate after the first step counts only what later steps made, over their time."""
    import itertools
    from types import SimpleNamespace

    from server.bench.overhead import StepTimer

    seq = SimpleNamespace(output_ids=[])
    gains = iter([0, 1 + 4, 1, 1, 1 + 3, 1])  # a prefill chunk; first token + 4 forced; ...

    def step() -> None:
        seq.output_ids += [0] * next(gains)

    engine = SimpleNamespace(step=step, scheduler=SimpleNamespace(running=[seq], waiting=[]))
    ticks = itertools.count()  # each step starts and ends one second apart: ends at 1, 3, 5, 7, 9, 11
    timer = StepTimer(engine, clock=lambda: next(ticks))
    timer.on = True
    for _ in range(6):
        engine.step()
    assert timer.gained == [0, 5, 1, 1, 4, 1]
    assert timer.rate() == (1 + 1 + 4 + 1) / (11 - 3)  # the 4 forced with the first token are not later tokens
    timer.remove()
    assert engine.step is step


def test_decode_rate_counts_intervals_between_steps():
    from server.bench.peers import decode_rate

    assert decode_rate([10.0, 10.5, 11.0, 11.5]) == 3 / 1.5
    assert decode_rate([10.0]) != decode_rate([10.0])  # nan: one step says nothing of a rate


def test_peers_not_installed_are_skipped_not_failed(monkeypatch):
    import importlib.util

    from server.bench import peers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in peers.PEERS.values() else real(name, *a))
    assert peers.missing() == {name: "not installed" for name in peers.PEERS}
    started = peers.Peers(stack=None)  # nothing to start: no peer touches the stack
    assert started.ready == {} and started.skipped == peers.missing()

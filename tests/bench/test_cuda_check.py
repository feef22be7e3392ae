"""benchmarks/cuda_check.py, the one script a GPU runs, run here on the CPU in its tiny shape: the same
engine code and the same equivalence checks (batched == alone, prefix hit == miss, forced run == fed,
masks applied), so the script itself is proven before a GPU is ever lent. Its timings are left out
(--skip-bench): numbers come from benchmarks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKS = {"batched == alone", "prefix hit == miss", "after a forced run == fed", "masked rows stay inside",
          "masked == plain transformers over the allowed", "free row beside masked ones == alone"}


def test_the_gpu_script_passes_its_equivalence_checks_on_the_cpu(tmp_path):
    run = subprocess.run([sys.executable, "benchmarks/cuda_check.py", "--shape", "tiny", "--device", "cpu",
                          "--skip-bench", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=3600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    [written] = tmp_path.glob("cuda_check-*-tiny.json")
    result = json.loads(written.read_text())
    assert result["complete"] and result["failed"] == [] and result["device"] == "cpu"
    checks = {check["check"]: check["ok"] for check in result["equivalence"]}
    assert CHECKS <= set(checks) and all(checks.values()), checks

"""What a bench run writes: the table on stdout, results.json, one PNG per suite and summary.md."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path


def machine() -> dict:
    """The hardware and software the numbers came from."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    try:
        root = Path(__file__).resolve().parents[2]
        out["code"] = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True,
                                     text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["code"] = None
    return out


def machine_line(info: dict) -> str:
    where = f"{info['cpu']}, {info['cores']} cores"
    if info.get("gpu"):
        where = f"{info['gpu']} ({where})"
    return f"{where}; Python {info['python']}, torch {info['torch']}; code {info.get('code') or 'unknown'}"


def text_table(table: dict) -> str:
    columns, rows = table["columns"], table["rows"]
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) if rows else len(str(c)) for i, c in enumerate(columns)]
    lines = [table["title"], "  ".join(str(c).ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def markdown_table(table: dict) -> str:
    cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    lines = [f"**{table['title']}**", "", "| " + " | ".join(cell(c) for c in table["columns"]) + " |",
             "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def sizes_label(results: dict) -> str:
    return "tiny (testing)" if results.get("tiny") else "quick" if results.get("quick") else "full"


def summary_markdown(results: dict, plot_prefix: str = "") -> str:
    """The run as markdown: header, machine, then per suite its tables, ratios, notes and plot."""
    info = results["machine"]
    out = [f"Model `{results['model']}` on {results['device']}; {machine_line(info)}.",
           f"Run: `{results['command']}` ({sizes_label(results)} sizes), "
           f"{results['seconds']:.0f} s in all (model load {results.get('load_seconds', 0):.0f} s), {results['finished']}.", ""]
    for name, suite in results["suites"].items():
        out.append(f"### {name}")
        out.append("")
        if suite.get("status") != "ok":
            out += [f"Failed: `{suite.get('error', 'unknown error')}`", ""]
            continue
        out.append(f"{suite['seconds']:.0f} s.")
        out.append("")
        for table in suite["result"]["tables"]:
            out += [markdown_table(table), ""]
        ratios = suite["result"].get("ratios") or {}
        if ratios:
            out += ["Ratios: " + "; ".join(f"{k} = {v:.3g}" for k, v in ratios.items() if v is not None) + ".", ""]
        for note in suite["result"].get("notes") or []:
            out.append(f"- {note}")
        if suite["result"].get("notes"):
            out.append("")
        if suite.get("plot"):
            out += [f"![{name}]({plot_prefix}{suite['plot']})", ""]
    return "\n".join(out)


def write(results: dict, out_dir: Path) -> None:
    """results.json (per-suite plots already drawn) and summary.md into ``out_dir``."""
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out_dir / "summary.md").write_text("# maskd bench\n\n" + summary_markdown(results) + "\n")


RESULTS_HEADER = """# maskd bench results

Written by `make bench` (`maskd bench --suite all --quick` on the embedded model) and, for a GPU
section, by the same command with `--results-md` on that machine. Each section is one run on the
machine it names; every ratio in it was measured within that run, contenders interleaved. The
sizes are the --quick ones (minutes on 2 CPU cores): small samples, read them as such.
"""


def refresh_results_md(results: dict, path: Path, out_dir: Path) -> None:
    """Replaces (or appends) this device type's section of ``path``, plots linked from ``out_dir``."""
    key = results["device"].split(":")[0]
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    prefix = os.path.relpath(out_dir, path.parent).replace(os.sep, "/") + "/"
    section = (f"{start}\n## {key.upper()}: {results['model']}\n\n" + summary_markdown(results, prefix).rstrip()
               + f"\n\nRaw numbers: [{prefix}results.json]({prefix}results.json).\n{end}")
    text = path.read_text() if path.exists() else RESULTS_HEADER
    if start in text and end in text:
        text = text[:text.index(start)] + section + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)

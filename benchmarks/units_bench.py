"""What a tool list costs a request the first time, through the real server: grammar units at work.

    python benchmarks/units_bench.py [--models smollm2-135m-instruct,gemma3-270m] [--sizes 10,25,40]

For each model (`make gemma` first for gemma3-270m, the 262k vocabulary) a fresh `maskd serve` with
no grammar disk cache and default flags. For each N: N BFCL tools this server has never seen,
tool_choice "required", greedy; the whole request is timed cold (the chosen tool's unit compiles
when the model names it, the others in the engine's idle time), then, once every unit is compiled,
again with the same tools and another system message (units in memory, the prompt prefilled again).
Each N is tried on --repeats fresh tool lists (the two prompts differ, so the two outputs may too):
the median ratio counts. Target: cold <= 1.25x warm, and every call valid (jsonschema). Then one
tool of the 25 is changed: exactly one unit must be compiled (from /metrics).
json_object: the first request after startup, then a second one; its outputs must parse as objects.
Prints a table, writes benchmarks/results/units_bench.json and units_bench.png.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import time
from pathlib import Path

import httpx
import jsonschema

from live_server import live_server, metric

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grammars import GrammarError, schema_to_regex  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BFCL = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench" / "BFCL.jsonl.gz"


def bfcl_tools(seed: int) -> list[dict]:
    """Every single-function BFCL row maskd enforces, as OpenAI tools, in a shuffled order."""
    tools, names = [], set()
    for line in gzip.open(BFCL, "rt"):
        schema = json.loads(line)["schema"]
        for option in schema.get("anyOf", [schema]):
            for name, parameters in option.get("properties", {}).items():
                name = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
                try:
                    schema_to_regex(parameters)
                except GrammarError:
                    continue
                if name not in names:
                    names.add(name)
                    tools.append({"type": "function", "function": {"name": name, "parameters": parameters}})
    random.Random(seed).shuffle(tools)
    return tools


def call(url: str, model: str, tools: list[dict], system: str, max_tokens: int) -> tuple[float, dict]:
    body = {"model": model, "tools": tools, "tool_choice": "required", "parallel_tool_calls": False,
            "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Use one tool."}]}
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - started
    if reply.status_code != 200:
        return elapsed, {"error": reply.json()["error"]["message"][:200]}
    return elapsed, reply.json()


def valid(reply: dict, tools: list[dict]) -> bool:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    calls = (reply.get("choices") or [{}])[0].get("message", {}).get("tool_calls") or []
    try:
        for c in calls:
            jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
    except (ValueError, KeyError, jsonschema.ValidationError):
        return False
    return bool(calls)


def tokens(reply: dict) -> int | None:
    return (reply.get("usage") or {}).get("completion_tokens")


def called(reply: dict) -> str | None:
    calls = (reply.get("choices") or [{}])[0].get("message", {}).get("tool_calls") or []
    return calls[0]["function"]["name"] if calls else None


def misses(url: str) -> float:
    return metric(url, "maskd_grammar_compiles_total") + metric(url, 'maskd_grammar_cache_hits_total{tier="disk"}')


def json_object(url: str, model: str, ask: str) -> tuple[float, bool]:
    body = {"model": model, "temperature": 0, "max_tokens": 48, "response_format": {"type": "json_object"},
            "messages": [{"role": "user", "content": ask}]}
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - started
    if reply.status_code != 200:
        return elapsed, False
    choice = reply.json()["choices"][0]
    try:
        ok = isinstance(json.loads(choice["message"]["content"]), dict)
    except ValueError:
        ok = False
    return elapsed, ok or choice["finish_reason"] == "length"


def settled(url: str, before: float, expected: int) -> float:
    """Units missed since ``before``, once at least ``expected`` are and none came for a second."""
    started, last, seen = time.perf_counter(), time.perf_counter(), misses(url) - before
    while time.perf_counter() - started < 1800 and (seen < expected or time.perf_counter() - last < 1.0):
        time.sleep(0.1)
        now = misses(url) - before
        if now != seen:
            seen, last = now, time.perf_counter()
    return seen


def run_model(model: str, sizes: list[int], max_tokens: int, repeats: int) -> dict:
    pool = bfcl_tools(seed=len(model))
    out: dict = {"model": model, "tools": [], "json_object": {}}
    with live_server("--model", model, "--grammar-cache", "", timeout=900) as (url, _):
        first, ok1 = json_object(url, model, "Describe a cat as a JSON object.")
        second, ok2 = json_object(url, model, "Describe a dog as a JSON object.")
        out["json_object"] = {"first_s": first, "second_s": second, "valid": [ok1, ok2],
                              "automaton_load_s": metric(url, "maskd_json_automaton_load_seconds")}
        print(f"  {model} json_object: first {first:.2f} s, second {second:.2f} s", flush=True)
        start = 0
        for n in sizes:
            trials = []
            for trial in range(repeats):  # fresh tools each time; the ratio is the median of the trials
                tools, start = pool[start:start + n], start + n
                before, seconds = misses(url), metric(url, "maskd_grammar_compile_seconds_total")
                cold, reply_cold = call(url, model, tools, f"You are agent {n}-{trial}-A.", max_tokens)
                compiled = settled(url, before, n)  # tools not called compile in the engine's idle time
                spent = metric(url, "maskd_grammar_compile_seconds_total") - seconds
                warm, reply_warm = call(url, model, tools, f"You are agent {n}-{trial}-B, another one.", max_tokens)
                trials.append({"cold_s": cold, "warm_s": warm, "ratio": cold / warm, "units_compiled": compiled,
                               "tokens": [tokens(reply_cold), tokens(reply_warm)],
                               "calls": [called(reply_cold), called(reply_warm)], "compile_seconds": spent,
                               "valid": [valid(reply_cold, tools), valid(reply_warm, tools)],
                               "errors": [r.get("error") for r in (reply_cold, reply_warm) if "error" in r]})
            middle = sorted(trials, key=lambda t: t["ratio"])[len(trials) // 2]
            row = {"n": n, **middle, "valid": [all(v) for v in zip(*(t["valid"] for t in trials))],
                   "ratios": [t["ratio"] for t in trials], "trials": trials}
            if n == 25:
                changed = tools[:12] + [pool[-1]] + tools[13:]  # a tool no group uses
                before = misses(url)
                changed_s, reply = call(url, model, changed, f"You are agent {n}-C.", max_tokens)
                row.update(changed_one_compiled=settled(url, before, 1), changed_s=changed_s,
                           changed_valid=valid(reply, changed))
            out["tools"].append(row)
            print(f"  {model} N={n}: ratios {[round(r, 2) for r in row['ratios']]}, median trial: cold "
                  f"{row['cold_s']:.2f} s, warm {row['warm_s']:.2f} s, {row['units_compiled']:.0f} units compiled "
                  f"({row['compile_seconds']:.1f} s of compile), valid {row['valid']}, tokens {row['tokens']}", flush=True)
    return out


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, result in enumerate(results):
        ns = [r["n"] for r in result["tools"]]
        ax.plot(ns, [r["ratio"] for r in result["tools"]], marker="o", label=result["model"])
    ax.axhline(1.25, color="grey", linestyle="--", label="target 1.25x")
    ax.set_xlabel("tools never seen before (N)")
    ax.set_ylabel("cold request / warm-grammar request")
    ax.set_title("First request with N new tools vs the same tools cached")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m-instruct,gemma3-270m")
    parser.add_argument("--sizes", default="10,25,40")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="fresh tool lists per N (the median ratio counts)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = [run_model(model, sizes, args.max_tokens, args.repeats) for model in args.models.split(",")]
    print(f"\n{'model':24} {'N':>3} {'cold s':>8} {'warm s':>8} {'ratio':>6} {'units':>6} {'valid':>6}  (median of {args.repeats})")
    for result in results:
        for r in result["tools"]:
            print(f"{result['model']:24} {r['n']:>3} {r['cold_s']:>8.2f} {r['warm_s']:>8.2f} {r['ratio']:>6.2f} "
                  f"{r['units_compiled']:>6.0f} {str(all(r['valid'])):>6}")
        changed = next((r for r in result["tools"] if "changed_one_compiled" in r), None)
        if changed:
            print(f"{result['model']:24} one of 25 tools changed: {changed['changed_one_compiled']:.0f} unit compiled")
        j = result["json_object"]
        print(f"{result['model']:24} json_object: first {j['first_s']:.2f} s, second {j['second_s']:.2f} s, "
              f"automaton load {j['automaton_load_s'] * 1000:.0f} ms at startup, valid {j['valid']}")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "units_bench.json"
    ran = {r["model"] for r in results}
    earlier = [r for r in json.loads(path.read_text()) if r["model"] not in ran] if path.exists() else []
    results = earlier + results  # the other models' latest runs stay in the file and the plot
    path.write_text(json.dumps(results, indent=2))
    plot(results, RESULTS / "units_bench.png")
    print(f"wrote {RESULTS / 'units_bench.json'} and units_bench.png")


if __name__ == "__main__":
    main()

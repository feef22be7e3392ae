"""Suite `tools`: BFCL tool lists of 1, 10 and 50 tools through a live `maskd serve`, in each
tool_choice mode: valid calls, seconds per call, the first call of a list (grammar units compiled,
prompt prefilled) against its repeats (grammar and prefix cached).

Tools are the distinct BFCL functions of the run's schema set, in order; a list of k tools is the
first k, and the request asks for the first. Modes: "required", the named function, and "auto"
with a logit_bias favouring the tokens of the call-opening delimiter (without it a small model
rarely opens a call). Greedy for required and named; temperature 0.7 and a seed for auto. A call is
valid when the response has tool calls, each to a known tool, whose arguments parse and validate
(jsonschema); a 400 (a keyword maskd cannot enforce, a prompt past the context) is "refused".
"""

from __future__ import annotations

import json
import re
import statistics
import time

import jsonschema

from server.bench.schemas import function_rows, functions_of
from server.bench.stats import fmt

MODES = ("required", "named", "auto")


def check(calls: list[tuple[str, str]], finish: str, functions: dict[str, dict]) -> str:
    """'valid', or what was wrong. Output cut by max_tokens (budget-aware decoding now closes calls) counts apart."""
    if finish == "length":
        return "cut_by_max_tokens"
    if not calls:
        return "no_call"
    for called, arguments in calls:
        if called not in functions:
            return "unknown_tool"
        try:
            jsonschema.validate(json.loads(arguments), functions[called])
        except (ValueError, jsonschema.ValidationError):
            return "invalid_arguments"
    return "valid"


def delimiter_bias(tokenizer, tool_format: str) -> dict[str, float]:
    """logit_bias favouring the tokens of the model's call-opening delimiter (`<tool_call>`)."""
    from grammars import get_tool_format

    opening = get_tool_format(tool_format).open
    return {str(t): 30.0 for t in tokenizer.encode(opening, add_special_tokens=False)}


def tool_lists(rows: list[dict], counts) -> dict[int, dict[str, dict]]:
    """k -> the first k distinct functions of the BFCL rows (fewer where the set has fewer)."""
    functions: dict[str, dict] = {}
    for row in function_rows(rows):
        for name, params in functions_of(row["schema"]).items():
            functions.setdefault(name, params)
    names = list(functions)
    return {k: {n: functions[n] for n in names[:k]} for k in counts}


def body(model: str, functions: dict[str, dict], mode: str, max_tokens: int, bias: dict) -> dict:
    first = next(iter(functions))
    choice = {"type": "function", "function": {"name": first}} if mode == "named" else mode
    out = {"model": model, "max_tokens": max_tokens, "temperature": 0.7 if mode == "auto" else 0.0, "seed": 0,
           "messages": [{"role": "user", "content": f"Call {first} with sensible arguments."}],
           "tools": [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in functions.items()],
           "tool_choice": choice, "parallel_tool_calls": False}
    if mode == "auto":
        out["logit_bias"] = bias
    return out


def call(client, url: str, request: dict, functions: dict[str, dict]) -> dict:
    """One POST /v1/chat/completions: verdict, seconds, prompt and cached tokens. A 400 that names a
    larger minimum budget is retried with that minimum + 20, as a client would."""
    started = time.perf_counter()
    reply = client.post(f"{url}/v1/chat/completions", json=request)
    if reply.status_code == 400:
        needed = re.search(r"ask for at least (\d+)", reply.text)
        if needed:
            request = {**request, "max_tokens": int(needed.group(1)) + 20}
            reply = client.post(f"{url}/v1/chat/completions", json=request)
    seconds = time.perf_counter() - started
    if reply.status_code != 200:
        error = reply.json().get("error", {}) if reply.headers.get("content-type", "").startswith("application/json") \
            else {}
        return {"verdict": "refused", "code": error.get("code") or reply.status_code,
                "message": (error.get("message") or reply.text)[:200], "seconds": seconds}
    data = reply.json()
    choice = data["choices"][0]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []]
    usage = data.get("usage") or {}
    return {"verdict": check(calls, choice["finish_reason"], functions), "seconds": seconds,
            "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")}


def run(ctx, progress, repeats: int | None = None) -> dict:
    import httpx

    sizes = ctx.sizes
    repeats = repeats or (1 if ctx.quick or ctx.tiny else 2)
    lists = tool_lists(ctx.rows, sizes.tool_counts)
    spec = ctx.spec()
    bias = delimiter_bias(ctx.tokenizer(), spec.tool_format)
    url = ctx.server_url()
    records = []
    bar = progress("tools", len(lists) * len(MODES) * (1 + repeats))
    try:
        with httpx.Client(timeout=900) as client:
            for k, functions in lists.items():
                for mode in MODES:
                    request = body(spec.name, functions, mode, sizes.tool_tokens, bias)
                    for attempt in range(1 + repeats):
                        result = call(client, url, request, functions)
                        records.append({"tools": len(functions), "asked": k, "mode": mode, "first": attempt == 0,
                                        **result})
                        bar.update()
    finally:
        bar.close()
    table, summary = [], []
    for k, functions in lists.items():
        for mode in MODES:
            rs = [r for r in records if r["asked"] == k and r["mode"] == mode]
            # timings of served calls only: a refusal (a compile past the limit) is a verdict, not a time
            first = [r["seconds"] for r in rs if r["first"] and r["verdict"] != "refused"]
            again = [r["seconds"] for r in rs if not r["first"] and r["verdict"] != "refused"]
            verdicts: dict[str, int] = {}
            for r in rs:
                verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
            row = {"tools": len(functions), "mode": mode, "calls": len(rs), "valid": verdicts.get("valid", 0),
                   "first_s": first[0] if first else None, "cached_s": statistics.median(again) if again else None,
                   "prompt_tokens": rs[0].get("prompt_tokens"), "verdicts": verdicts}
            summary.append(row)
            table.append([str(row["tools"]), mode, f"{row['valid']}/{row['calls']}", fmt(row["first_s"], ".2f"),
                          fmt(row["cached_s"], ".2f"),
                          fmt(row["first_s"] / row["cached_s"] if row["first_s"] and row["cached_s"] else None, ".1f"),
                          fmt(row["prompt_tokens"], "d"), ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items()))])
    served = [r for r in records if r["verdict"] != "refused"]
    notes = [f"Calls valid: {sum(r['verdict'] == 'valid' for r in served)} of {len(served)} served "
             f"({len(records) - len(served)} refused)."]
    notes += [f"Refused ({r['tools']} tools, {r['mode']}): {r['code']}: {r['message']}"
              for r in records if r["verdict"] == "refused" and r["first"]][:6]
    short = [k for k, f in lists.items() if len(f) < k]
    if short:
        notes.append(f"The schema set has only {len(lists[short[0]])} distinct functions: lists asked for "
                     f"{short} tools hold that many.")
    notes.append("The first call of each (list, mode) compiles what is new and prefills the prompt; the first mode "
                 "of a list (required) also compiles the tools' argument units, the later modes reuse them.")
    return {"records": records, "summary": summary, "notes": notes, "repeats": repeats,
            "ratios": {f"first / cached seconds, {r['tools']} tools {r['mode']}": r["first_s"] / r["cached_s"]
                       for r in summary if r["first_s"] and r["cached_s"]},
            "tables": [{"title": f"Tool calls through the live server (max_tokens {sizes.tool_tokens}, "
                                 f"1 first call + {repeats} repeats per list and mode)",
                        "columns": ["tools", "tool_choice", "valid", "first call s", "cached call s", "first / cached",
                                    "prompt tokens", "verdicts"], "rows": table}]}


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    with figure(path, 2) as (ax1, ax2):
        counts = sorted({r["tools"] for r in result["summary"]})
        for mode in MODES:
            rows = [r for r in result["summary"] if r["mode"] == mode]
            xs = [r["tools"] for r in rows]
            ax1.plot(xs, [r["first_s"] or 0 for r in rows], marker="o", label=f"{mode} first")
            ax1.plot(xs, [r["cached_s"] or 0 for r in rows], marker="x", linestyle="--", label=f"{mode} cached")
            ax2.plot(xs, [100 * r["valid"] / r["calls"] for r in rows], marker="o", label=mode)
        for ax in (ax1, ax2):
            ax.set_xscale("log"), ax.set_xticks(counts, [str(c) for c in counts]), ax.set_xlabel("tools in the list")
        ax1.set_ylabel("seconds per call"), ax1.legend(fontsize=6), ax1.set_title("time per call", fontsize=9)
        ax2.set_ylabel("% valid calls"), ax2.set_ylim(0, 105), ax2.legend(fontsize=7)
        ax2.set_title("valid tool calls", fontsize=9)

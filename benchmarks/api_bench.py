"""Tool calls through the Anthropic Messages API and the OpenAI Responses API, with the official SDKs.

    python benchmarks/api_bench.py [--limit N] [--stride K] [--url URL] [--max-tokens 200] [--concurrency 2]
                                   [--minutes M]

Without --url it starts its own `maskd serve` on a free port (benchmarks/live_server.py) and stops
it at the end. Each MaskBench BFCL schema becomes its tools as tool_bench builds them (one per
function; a row whose schema is an anyOf of functions gives several) and is sent, with the prompt
"Call NAME with sensible arguments." and one call per answer (disable_parallel_tool_use /
parallel_tool_calls false), as:

- Messages (anthropic.Anthropic(base_url=..., api_key="x")): tool_choice {"type": "any"} and
  {"type": "tool", "name": <first function>}, each at temperature 0 (greedy) and at temperature
  0.7 with seed 7, each non-streamed (messages.create) and streamed (messages.stream(...) ->
  get_final_message()). maskd's MessagesRequest takes `seed` (an extension: Anthropic has none);
  this anthropic SDK's create()/stream() take no `temperature` either, so both go in extra_body.
- Responses (openai.OpenAI(...).responses.create): tool_choice "required", temperature 0.7 with
  extra_body={"seed": 7}, non-streamed and streamed (stream=True; the final response is the one
  in response.completed).

The Messages API allows tool names of [a-zA-Z0-9_-] only, and most BFCL names have dots
(`Class.method`); those are sent there with each other character replaced by `_` (the count is
printed). Responses names go as they are.

Checks per request: the answer has at least one tool_use block / function_call item, each to a
tool of the request (the named one for {"type": "tool"}), whose input (arguments, json.loads)
validates against the function's schema (jsonschema, the schema's $schema or Draft 2020-12);
stop_reason "tool_use" / status "completed". Per streamed request: the concatenated
input_json_delta pieces of each tool_use block parse (json.loads, strictly) to exactly that block's
final input; the concatenated response.function_call_arguments.delta pieces equal the .done event's
arguments and the completed response's item arguments. Per pair: the streamed answer equals the
non-streamed one (same blocks / items in order, same types, names, inputs / arguments and texts;
ids ignored). Apart from validity, answers whose raw JSON (an arguments string, the joined
input_json_delta pieces) writes one key twice in an object are counted (parsers keep one
silently), and so are calls whose top-level keys are not in the order of the schema's
properties. A budget under a schema's shortest valid call is a 400 that names the minimum; that
request is sent again once with the minimum + 20 (counted as budget_raised). Any other HTTP error
is recorded with its status and message.

The SDK calls are in api_calls.py, the checks in api_checks.py.
Each schema's records are appended to benchmarks/results/api_bench_records.jsonl as it ends. Prints
a table per API and mode, writes benchmarks/results/api_bench.json and api_bench.png.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import anthropic
import httpx
import openai

# benchmarks/ is on sys.path when run as a script
from api_calls import SEED, anthropic_name, call_messages, call_responses
from api_checks import differences, duplicate_keys, key_order, verdict
from live_server import live_server

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench" / "BFCL.jsonl.gz"
RESULTS = Path(__file__).resolve().parent / "results"
HOT = 0.7


def functions_of(schema: dict) -> dict[str, dict]:
    """As tool_bench: BFCL rows are {"<name>": <parameters>} objects, or an anyOf of them."""
    options = schema["anyOf"] if "anyOf" in schema else [schema]
    return {name: params for option in options for name, params in option["properties"].items()}


def modes() -> list[dict]:
    """The requests per schema, in order; a streamed one follows its non-streamed twin."""
    out = []
    for choice in ("any", "tool"):
        for temperature in (0.0, HOT):
            for stream in (False, True):
                out.append({"api": "messages", "choice": choice, "temperature": temperature, "stream": stream})
    for stream in (False, True):
        out.append({"api": "responses", "choice": "required", "temperature": HOT, "stream": stream})
    for mode in out:
        mode["key"] = (f"{mode['api']} {mode['choice']} t={mode['temperature']:g}"
                       + (f" seed={SEED}" if mode["temperature"] else "") + (" stream" if mode["stream"] else ""))
    return out


def code_version() -> str:
    """HEAD, and whether the server's code differs from it (others edit the tree while benchmarks run)."""
    git = ["git", "-C", str(RESULTS.parent.parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "server", "engine", "grammars"],
                           capture_output=True, text=True).stdout.split("\n")
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


def _budget_needed(message: str) -> int | None:
    found = re.search(r"ask for at least (\d+)", message or "")
    return int(found.group(1)) if found else None


def run_schema(clients, model: str, line: int, row: dict, args) -> list[dict]:
    functions = functions_of(row["schema"])
    records, answers = [], {}
    budget = args.max_tokens
    for mode in modes():
        record = {"line": line, "id": row.get("id"), "name": next(iter(functions)), "tools": len(functions),
                  "mode": mode["key"], "api": mode["api"], "stream": mode["stream"], "max_tokens": budget}
        call = call_messages if mode["api"] == "messages" else call_responses
        client = clients[mode["api"]]
        started = time.perf_counter()
        try:
            try:
                answer, stream_problems, raw = call(client, model, functions, mode, budget, args.parallel)
            except (anthropic.BadRequestError, openai.BadRequestError) as exc:
                needed = _budget_needed(str(exc))
                if needed is None:
                    raise
                budget = record["max_tokens"] = record["budget_raised_to"] = needed + 20
                started = time.perf_counter()
                answer, stream_problems, raw = call(client, model, functions, mode, budget, args.parallel)
        except (anthropic.APIStatusError, openai.APIStatusError) as exc:
            record["error"] = {"status": exc.status_code, "message": str(exc)[:500]}
        except Exception as exc:  # noqa: BLE001 - a failure is a result; the run goes on
            cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
            record["error"] = {"status": None, "message": f"{type(exc).__name__}: {exc}{cause}"[:500]}
        else:
            record["problems"] = verdict(answer, functions, mode)
            record["valid"] = not record["problems"]
            record["answer"] = answer
            record["duplicate_keys"] = [f"call {i}: {keys} in {text[:400]}" for i, text in enumerate(raw)
                                        if (keys := duplicate_keys(text))]
            record["key_order"] = key_order(answer, functions, mode["api"])
            if mode["stream"]:
                record["stream_problems"] = stream_problems
                twin = answers.get(mode["key"].removesuffix(" stream"))
                if twin is not None:
                    record["differences"] = differences(twin, answer)
                    record["equal"] = not record["differences"]
            else:
                answers[mode["key"]] = answer
        record["seconds"] = round(time.perf_counter() - started, 3)
        records.append(record)
    return records


def summarize(records: list[dict]) -> dict:
    table = {}
    for mode in modes():
        rows = [r for r in records if r["mode"] == mode["key"]]
        answered = [r for r in rows if "error" not in r]
        paired = [r for r in answered if "equal" in r]
        entry = {"requests": len(rows), "answered": len(answered), "errors": len(rows) - len(answered),
                 "valid": sum(r["valid"] for r in answered),
                 "valid_pct": 100 * sum(r["valid"] for r in answered) / len(answered) if answered else None,
                 "mean_s": statistics.fmean(r["seconds"] for r in rows) if rows else None,
                 "budget_raised": sum("budget_raised_to" in r for r in rows),
                 "duplicate_keys": sum(bool(r["duplicate_keys"]) for r in answered),
                 "key_order": sum(bool(r["key_order"]) for r in answered)}
        if mode["stream"]:
            entry.update(pairs=len(paired), equal=sum(r["equal"] for r in paired),
                         equal_pct=100 * sum(r["equal"] for r in paired) / len(paired) if paired else None,
                         deltas_ok=sum(not r["stream_problems"] for r in answered),
                         deltas_ok_pct=100 * sum(not r["stream_problems"] for r in answered) / len(answered)
                         if answered else None)
        table[mode["key"]] = entry
    return table


def report(table: dict, records: list[dict], renamed: int, schemas: int, wall: float) -> None:
    def pct(v):
        return "-" if v is None else f"{v:5.1f}%"
    print(f"\n{schemas} BFCL schemas, {len(records)} requests, {wall:.0f} s wall; tool names renamed for the "
          f"Messages API (dots -> _): {renamed}")
    print("valid = answered requests with >= 1 call, every call's input valid, the right tool and stop_reason; "
          "stream==plain = the streamed answer equals its non-streamed twin (both answered); "
          "deltas ok = the streamed pieces join to the final input/arguments")
    print("dup keys = answers whose raw JSON writes a key twice in one object (seen in arguments strings and "
          "joined input_json_delta pieces; a non-streamed Messages input is already parsed, so '-'); "
          "order = answers whose top-level keys are not in the schema's properties order")
    print(f"{'API / mode':38} {'reqs':>5} {'valid':>7} {'stream==plain':>13} {'deltas ok':>9} {'mean s':>7} "
          f"{'errors':>6} {'budget+':>7} {'dup keys':>8} {'order':>5}")
    for key, e in table.items():
        streamed = "pairs" in e
        print(f"{key:38} {e['requests']:5} {pct(e['valid_pct']):>7} {pct(e.get('equal_pct')) if streamed else '':>13} "
              f"{pct(e.get('deltas_ok_pct')) if streamed else '':>9} "
              f"{e['mean_s'] if e['mean_s'] is not None else 0:7.2f} {e['errors']:6} {e['budget_raised']:7} "
              f"{e['duplicate_keys'] if key.startswith('responses') or streamed else '-':>8} {e['key_order']:5}")
    shown = 0
    for r in records:
        for label in ("error", "problems", "stream_problems", "differences", "duplicate_keys", "key_order"):
            if r.get(label) and shown < 60:
                print(f"  line {r['line']} {r['id']} [{r['mode']}] {label}: {r[label]}")
                shown += 1
    if shown >= 60:
        print("  ... (more in the JSON)")


def plot(table: dict, records: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    keys = list(table)
    xs = range(len(keys))
    left.bar([x - 0.2 for x in xs], [table[k]["valid_pct"] or 0 for k in keys], 0.4, label="valid %")
    left.bar([x + 0.2 for x in xs], [table[k].get("equal_pct") or 0 for k in keys], 0.4,
             label="streamed == non-streamed %")
    left.set_xticks(list(xs), keys, rotation=60, ha="right", fontsize=7)
    left.set_ylim(0, 105)
    left.set_ylabel("% of answered requests")
    left.legend(loc="lower right", fontsize=8)
    left.set_title(f"BFCL tools through /v1/messages and /v1/responses ({len({r['line'] for r in records})} schemas)",
                   fontsize=9)
    for api in ("messages", "responses"):
        seconds = [r["seconds"] for r in records if r["api"] == api]
        if seconds:
            right.hist(seconds, bins=40, alpha=0.6, label=f"{api} ({len(seconds)})")
    right.set_xlabel("seconds per request")
    right.set_ylabel("requests")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=None, help="first N schemas (default: all 1,043)")
    parser.add_argument("--stride", type=int, default=1, help="take every k-th schema (a spread sample)")
    parser.add_argument("--url", default=None, help="a running maskd (default: start one on a free port)")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2, help="schemas in flight at once")
    parser.add_argument("--parallel", action="store_true", help="allow several calls per answer")
    parser.add_argument("--timeout", type=float, default=600, help="client timeout per request, s")
    parser.add_argument("--minutes", type=float, default=None,
                        help="start no schema after this many minutes (those in flight finish); report what ran")
    args = parser.parse_args()
    rows = list(enumerate(json.loads(line) for line in gzip.open(DATA, "rt")))[::args.stride][:args.limit]
    RESULTS.mkdir(exist_ok=True)
    log_path = RESULTS / "api_bench_records.jsonl"
    code = code_version()
    print(f"{len(rows)} schemas, {len(modes())} requests each, concurrency {args.concurrency}; code {code}", flush=True)
    started = time.perf_counter()
    with (nullcontext((args.url, None)) if args.url else live_server()) as (url, _):
        url = url.rstrip("/")
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        clients = {"messages": anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=args.timeout),
                   "responses": openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=args.timeout)}
        records, lock = [], threading.Lock()
        with open(log_path, "w") as log, ThreadPoolExecutor(args.concurrency) as pool:
            def one(item):
                line, row = item
                if args.minutes is not None and time.perf_counter() - started > 60 * args.minutes:
                    return
                out = run_schema(clients, model, line, row, args)
                with lock:
                    records.extend(out)
                    for r in out:
                        log.write(json.dumps(r) + "\n")
                    log.flush()
                    bad = sum(bool(r.get("error") or r.get("problems") or r.get("stream_problems")
                                   or r.get("differences") or r.get("duplicate_keys") or r.get("key_order"))
                              for r in out)
                    print(f"{len({r['line'] for r in records}):4}/{len(rows)} line {line:4} {out[0]['name'][:40]:40} "
                          f"{out[0]['tools']} tools {sum(r['seconds'] for r in out):6.1f}s "
                          f"{'ok' if not bad else f'{bad} flagged'}", flush=True)
            list(pool.map(one, rows))
    wall = time.perf_counter() - started
    records.sort(key=lambda r: (r["line"], [m["key"] for m in modes()].index(r["mode"])))
    table = summarize(records)
    lines = {r["line"] for r in records}
    ran = len(lines)
    renamed = sum(anthropic_name(n) != n for i, row in rows if i in lines for n in functions_of(row["schema"]))
    if ran < len(rows):
        print(f"\n--minutes {args.minutes:g}: {ran} of the {len(rows)} selected schemas ran")
    report(table, records, renamed, ran, wall)
    labels = ("error", "problems", "stream_problems", "differences", "duplicate_keys", "key_order")
    flagged = [{k: r.get(k) for k in ("line", "id", "name", "mode", "seconds", *labels, "answer") if r.get(k)}
               for r in records if any(r.get(label) for label in labels)]
    (RESULTS / "api_bench.json").write_text(json.dumps(
        {"selected": len(rows), "schemas": ran, "requests": len(records), "wall_s": round(wall, 1),
         "concurrency": args.concurrency, "code": code, "max_tokens": args.max_tokens, "seed": SEED,
         "renamed_for_messages": renamed, "url": args.url,
         "table": table, "flagged": flagged}, indent=2))
    plot(table, records, RESULTS / "api_bench.png")
    print(f"wrote {RESULTS / 'api_bench.json'}, {RESULTS / 'api_bench.png'}, {log_path}")


if __name__ == "__main__":
    sys.exit(main())

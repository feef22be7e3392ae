"""Load: N clients for D seconds of mixed requests against one server, with /health polled throughout.

    python benchmarks/load.py [--clients 16] [--seconds 300] [--quick] [--url http://127.0.0.1:8000 --pid PID]

Without --url it starts its own `maskd serve` on a free loopback port. Each client loops over a
random mix with short max_tokens: plain and streamed chats, BFCL tool calls with tool_choice
"required" (plain and streamed) and "auto", a json_schema structured output, and streams the client
drops after two chunks. Beside them one more client sends pathological schemas one after another
(a backtracking `pattern` as a structured output and as a tool's argument, and 12 nested oneOf
levels, 733 KB), each of which compiles until the server's grammar limit and is refused with a 400.
No request starts after D seconds; those running are waited for.

/health is polled every 100 ms from a process of its own (so that nothing in this one, such as the
clients' start, can delay a poll) and reported overall, while a pathological schema compiles and
outside; the server's RSS and that of its children (the compile workers) are read each second, and
the load average every 5 s. A request counts as complete when it got a 200 with a finish (a
streamed one: a finish_reason and [DONE]); it is refused when it got a 4xx (429 included) with an
error code; every other outcome is lost: 5xx, client timeouts, incomplete streams, stream errors,
and tool calls or outputs that do not validate (jsonschema). Prints a table and writes
benchmarks/results/load.json (load_quick.json with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import time
from collections import Counter, defaultdict
from contextlib import nullcontext
from pathlib import Path

import httpx
from jsonschema.validators import validator_for

from live_server import live_server
from server.bench.schemas import MASKBENCH, functions_of, load_rows

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
KINDS = {"chat": 3, "chat stream": 3, "tools required": 2, "tools required stream": 2, "tools auto": 2,
         "structured": 1, "dropped stream": 1}  # kind -> weight in the mix
PATTERN = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(a|b)*a(a|b){18}"}}, "required": ["s"]}
QUESTIONS = ("What is the capital of France?", "Name three prime numbers.", "Say hello in Spanish.",
             "Why is the sky blue? One sentence.", "Give me a word that rhymes with cat.")


def bfcl_tools(limit: int = 40) -> list[dict]:
    """Small BFCL tool sets (the shared MaskBench, else the package sample), as OpenAI function tools."""
    path = MASKBENCH / "BFCL.jsonl.gz"
    rows = load_rows(path) if path.exists() else [r for r in load_rows() if r["subset"] == "BFCL"]
    sets = []
    for row in rows:
        functions = functions_of(row["schema"])
        if functions and len(json.dumps(functions)) < 600:  # short argument lists fit a short budget
            sets.append([{"type": "function", "function": {"name": name, "parameters": params}}
                         for name, params in functions.items()])
    return random.Random(0).sample(sets, min(limit, len(sets)))


def body_of(kind: str, rng: random.Random, tools: list[list[dict]]) -> dict:
    messages = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 24, "temperature": rng.choice([0, 0.7]),
            "seed": rng.randrange(1000), "stream": "stream" in kind}
    if kind.startswith("tools"):
        chosen = rng.choice(tools)
        messages[0]["content"] = f"Call {chosen[0]['function']['name']} with sensible arguments."
        body.update(tools=chosen, tool_choice=kind.split()[1], max_tokens=96)
    elif kind == "structured":
        schema = rng.choice(tools)[0]["function"]["parameters"]
        body.update(max_tokens=96, response_format={"type": "json_schema", "json_schema": {
            "name": "answer", "schema": schema, "strict": True}})
    return body


def invalid(body: dict, content: str, calls: dict[int, dict], finish: str | None) -> str | None:
    """Why the output breaks the request's schema (None when valid, or cut by the budget)."""
    if finish == "length":
        return None
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in body.get("tools", [])}
    try:
        for call in calls.values():
            if call["name"] not in schemas:
                return f"unknown tool {call['name']!r}"
            schema = schemas[call["name"]]
            if not validator_for(schema)(schema).is_valid(json.loads(call["arguments"] or "{}")):
                return "tool arguments out of schema"
        if "response_format" in body:
            schema = body["response_format"]["json_schema"]["schema"]
            if not validator_for(schema)(schema).is_valid(json.loads(content)):
                return "structured output out of schema"
    except ValueError:
        return "not JSON"
    if body.get("tool_choice") == "required" and not calls:
        return "no tool call under tool_choice required"
    return None


def refusal(status: int, body: dict) -> str:
    """An error answer's outcome: status and code, and whether it was the grammar compile limit."""
    error = body.get("error", {})
    limit = " (compile limit)" if "--grammar-timeout" in str(error.get("message")) else ""
    return f"http {status} {error.get('code') or error.get('type')}{limit}"


async def one(http: httpx.AsyncClient, url: str, kind: str, body: dict) -> str:
    """Sends one request; its outcome: "ok", "dropped" or the kind of error."""
    if not body["stream"]:
        reply = await http.post(f"{url}/v1/chat/completions", json=body)
        if reply.status_code != 200:
            return refusal(reply.status_code, reply.json())
        choice = reply.json()["choices"][0]
        calls = {i: c["function"] for i, c in enumerate(choice["message"].get("tool_calls") or [])}
        why = invalid(body, choice["message"].get("content") or "", calls, choice["finish_reason"])
        return f"invalid: {why}" if why else "ok"
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            return refusal(reply.status_code, json.loads(await reply.aread()))
        content, calls, finish, done, chunks = [], {}, None, False, 0
        async for line in reply.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            chunks += 1
            if kind == "dropped stream" and chunks == 2:
                return "dropped"  # leaving the block closes the connection mid-stream
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return f"stream error {chunk['error'].get('code') or chunk['error'].get('type')}"
            for choice in chunk["choices"]:
                delta = choice.get("delta", {})
                content.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    slot = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                    slot["name"] += call.get("function", {}).get("name") or ""
                    slot["arguments"] += call.get("function", {}).get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    if not (done and finish):
        return "incomplete stream"
    why = invalid(body, "".join(content), calls, finish)
    return f"invalid: {why}" if why else "ok"


def nested_one_of(levels: int = 12) -> dict:
    """The issue's schema: oneOf nested `levels` deep, each level's branches told apart by a required
    name (provably exclusive, so compiled), the whole doubling per level (12 levels: 733 KB)."""
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"oneOf": [
            {"type": "object", "properties": {"a": schema, "b": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"c": schema}, "required": ["c"]}]}
    return schema


def pathological_bodies() -> dict[str, dict]:
    """Requests whose grammar compiles until the server's limit, by name; each should be a 400."""
    base = {"model": MODEL, "max_tokens": 40, "stream": False, "messages": [{"role": "user", "content": "JSON?"}]}
    structured = [{**base, "response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": schema, "strict": True}}} for schema in (PATTERN, nested_one_of())]
    return {"pathological pattern": structured[0], "pathological oneOf x12": structured[1],
            "pathological pattern tool": {**base, "tool_choice": "required", "tools": [
                {"type": "function", "function": {"name": "match", "parameters": PATTERN}}]}}


def poll_health(url: str, stop, conn) -> None:
    """Runs in its own process: GET /health every 100 ms until `stop` is set; sends back
    ([(monotonic start, seconds)], {error: count})."""
    samples, errors = [], Counter()
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            started = time.monotonic()
            try:
                http.get(f"{url}/health").raise_for_status()
                samples.append((started, time.monotonic() - started))
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1
            stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))
    conn.send((samples, dict(errors)))


async def load(url: str, pid: int | None, args) -> dict:
    tools = bfcl_tools()
    pathological = pathological_bodies()
    records: list[tuple[str, str, float, float]] = []  # (kind, outcome, seconds, monotonic start)
    rss: list[tuple[float, float]] = []  # (server MiB, its children's MiB)
    loadavg: list[tuple[float, ...]] = []
    # one client for all (creating 16 took 1.9 s on a busy 2-core machine, the loop blocked meanwhile)
    http = httpx.AsyncClient(timeout=args.request_timeout, limits=httpx.Limits(max_connections=args.clients + 4))
    context = multiprocessing.get_context("fork")
    stop_polling = context.Event()
    receive, send = context.Pipe(duplex=False)
    poller = context.Process(target=poll_health, args=(url, stop_polling, send), daemon=True)
    poller.start()
    started = time.monotonic()
    stop_at = started + args.seconds

    async def send_one(kind: str, body: dict) -> str:
        begun = time.monotonic()
        try:
            outcome = await one(http, url, kind, body)
        except httpx.TimeoutException:
            outcome = "client timeout"
        except httpx.HTTPError as exc:
            outcome = f"client error {type(exc).__name__}"
        records.append((kind, outcome, time.monotonic() - begun, begun))
        return outcome

    async def client(c: int) -> None:
        rng = random.Random(args.seed * 1000 + c)
        while time.monotonic() < stop_at:
            kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
            if (await send_one(kind, body_of(kind, rng, tools))).startswith("http 429"):
                await asyncio.sleep(1)  # Retry-After: 1

    async def pathological_client() -> None:
        names = list(pathological)
        for i in range(1 << 30):
            if time.monotonic() >= stop_at:
                return
            await send_one(names[i % len(names)], pathological[names[i % len(names)]])
            await asyncio.sleep(args.pathological_pause)

    async def watch() -> None:
        while True:
            if pid is not None:
                rss.append((rss_mb(pid), sum(rss_mb(child) for child in children(pid))))
            if not loadavg or time.monotonic() - loadavg[-1][0] >= 5:
                loadavg.append((time.monotonic() - started, *os.getloadavg()))
            await asyncio.sleep(1)

    watcher = asyncio.create_task(watch())
    await asyncio.gather(*(client(c) for c in range(args.clients)),
                         *([pathological_client()] if args.pathological_pause >= 0 else []))
    wall = time.monotonic() - started
    watcher.cancel()
    await http.aclose()
    stop_polling.set()
    health, health_errors = receive.recv()
    poller.join()
    return {"records": records, "health": health, "health_errors": health_errors, "rss_mb": rss,
            "loadavg": loadavg, "wall_s": wall}


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:  # it just ended
        pass
    return 0.0


def children(pid: int) -> list[int]:
    """The pids of `pid`'s child processes (the server's compile workers; a thread's children are its own)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(child) for child in task.read_text().split()]
        except OSError:  # the thread just ended
            pass
    return found


def server_metrics(url: str) -> dict[str, float]:
    """What the server holds and counted by the end: grammar units and their bytes, the prefix cache's
    bytes, compile timeouts, and outputs that failed its own validation (withheld)."""
    wanted = ("maskd_grammar_units", "maskd_grammar_memory_bytes", "maskd_prefix_cache_bytes",
              "maskd_grammar_compile_timeouts_total", "maskd_output_validation_failures_total")
    found = {"maskd_output_validation_failures_total": 0.0}  # a labelled counter shows once it counted
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in wanted:
            found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else \
        (values[0] if values else float("nan"))


def lost(outcome: str) -> bool:
    """Neither complete, nor dropped by the client, nor a clear 4xx (429 included) with an error code."""
    return outcome not in ("ok", "dropped") and not (outcome.startswith("http 4") and " None" not in outcome)


def health_row(latencies: list[float]) -> dict:
    return {"polls": len(latencies), "p50_ms": pct(latencies, 50) * 1e3, "p99_ms": pct(latencies, 99) * 1e3,
            "max_ms": max(latencies, default=float("nan")) * 1e3}


def summary(run: dict) -> dict:
    by_kind: dict[str, list] = defaultdict(list)
    for kind, outcome, seconds, _ in run["records"]:
        by_kind[kind].append((outcome, seconds))
    rows = {}
    for kind, items in sorted(by_kind.items()) + [("all", [(o, s) for _, o, s, _ in run["records"]])]:
        answered = [s for o, s in items if not lost(o)]
        rows[kind] = {"requests": len(items), "ok": sum(o == "ok" for o, _ in items),
                      "dropped": sum(o == "dropped" for o, _ in items),
                      "refused": sum(o.startswith("http 4") and not lost(o) for o, _ in items),
                      "lost": sum(lost(o) for o, _ in items),
                      "errors": dict(Counter(o for o, _ in items if o not in ("ok", "dropped"))),
                      "p50_s": pct(answered, 50), "p99_s": pct(answered, 99)}
    compiling = sorted((begun, begun + seconds) for kind, _, seconds, begun in run["records"]
                       if kind.startswith("pathological"))
    during = [lat for t, lat in run["health"] if any(a <= t <= b for a, b in compiling)]
    outside = [lat for t, lat in run["health"] if not any(a <= t <= b for a, b in compiling)]
    server = [r for r, _ in run["rss_mb"]]
    return {"kinds": rows,
            "health": {"errors": run["health_errors"], "all": health_row([lat for _, lat in run["health"]]),
                       "while_pathological_compiles": health_row(during), "otherwise": health_row(outside)},
            "rss_mb": {"server_start": server[0], "server_peak": max(server),
                       "workers_peak": max(w for _, w in run["rss_mb"]),
                       "total_peak": max(r + w for r, w in run["rss_mb"])} if server else None,
            "loadavg": {"samples": run["loadavg"], "max_1min": max(l[1] for l in run["loadavg"]),
                        "mean_1min": statistics.fmean(l[1] for l in run["loadavg"])},
            "wall_s": run["wall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--quick", action="store_true", help="30 seconds")
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--pid", type=int, default=None, help="with --url: the server's pid, for its RSS")
    parser.add_argument("--grammar-timeout", type=float, default=10.0, help="the started server's --grammar-timeout")
    parser.add_argument("--pathological-pause", type=float, default=1.0,
                        help="seconds between pathological schemas (negative: send none)")
    parser.add_argument("--request-timeout", type=float, default=300, help="client-side, per request")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.seconds = 30
    server = nullcontext((args.url, None)) if args.url else \
        live_server("--grammar-timeout", str(args.grammar_timeout))
    with server as (url, proc):
        httpx.post(f"{url}/v1/chat/completions", timeout=300, json={  # warm up before the clock starts
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        run = asyncio.run(load(url, proc.pid if proc else args.pid, args))
        alive = proc is None or proc.poll() is None
        metrics = server_metrics(url) if alive else {}
    result = {**summary(run), "server_metrics": metrics}
    print(f"\nload: {args.clients} clients + 1 sending pathological schemas, {args.seconds:g} s of new requests, "
          f"{result['wall_s']:.0f} s wall, server {'alive' if alive else 'DEAD'}")
    print(f"  {'kind':26} {'requests':>8} {'ok':>5} {'dropped':>7} {'refused':>7} {'lost':>4} {'p50 s':>6} "
          f"{'p99 s':>6}  errors")
    for kind, row in result["kinds"].items():
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(row["errors"].items())) or "-"
        print(f"  {kind:26} {row['requests']:8} {row['ok']:5} {row['dropped']:7} {row['refused']:7} {row['lost']:4} "
              f"{row['p50_s']:6.2f} {row['p99_s']:6.2f}  {errors}")
    for name, h in result["health"].items():
        if name != "errors":
            print(f"  /health {name.replace('_', ' ')}: {h['polls']} polls, p50 {h['p50_ms']:.1f} ms, "
                  f"p99 {h['p99_ms']:.1f} ms, max {h['max_ms']:.1f} ms")
    print(f"  /health errors: {result['health']['errors'] or 0}")
    if result["rss_mb"]:
        r = result["rss_mb"]
        print(f"  RSS MiB: server start {r['server_start']:.0f}, peak {r['server_peak']:.0f}; compile workers peak "
              f"{r['workers_peak']:.0f}; together peak {r['total_peak']:.0f}")
    print("  server metrics at the end: " + ", ".join(f"{k} {v:g}" for k, v in metrics.items()))
    print(f"  load average (1 min) on this machine: mean {result['loadavg']['mean_1min']:.2f}, "
          f"max {result['loadavg']['max_1min']:.2f} ({os.cpu_count()} cores)")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("load_quick.json" if args.quick else "load.json")
    out.write_text(json.dumps({"args": vars(args), "server_alive": alive, "cores": os.cpu_count(), **result,
                               "records": run["records"],  # (kind, outcome, seconds, monotonic start)
                               "health_samples": run["health"],  # (monotonic start, seconds)
                               "rss_samples_mb": run["rss_mb"]}, indent=None))  # (server, workers), 1 a second
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

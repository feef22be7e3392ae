"""Load: N clients for D seconds of mixed requests against one server, with /health polled throughout.

    python benchmarks/load.py [--clients 16] [--seconds 300] [--quick] [--url http://127.0.0.1:8000]

Without --url it starts its own `maskd serve` on a free loopback port. Each client loops over a
random mix with short max_tokens: plain and streamed chats, BFCL tool calls with tool_choice
"required" (plain and streamed) and "auto", a json_schema structured output, and streams the client
drops after two chunks. No request starts after D seconds; those running are waited for. Meanwhile
/health is polled every 100 ms (its latency is what a load balancer sees) and the server's RSS read
each second. A request counts as complete when it got a 200 with a finish (a streamed one: a
finish_reason and [DONE]); every other outcome is counted by kind: HTTP status and error code,
client timeouts, incomplete streams, and tool calls or outputs that do not validate (jsonschema).
Prints a table and writes benchmarks/results/load.json (load_quick.json with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


async def one(http: httpx.AsyncClient, url: str, kind: str, body: dict) -> str:
    """Sends one request; its outcome: "ok", "dropped" or the kind of error."""
    if not body["stream"]:
        reply = await http.post(f"{url}/v1/chat/completions", json=body)
        if reply.status_code != 200:
            error = reply.json().get("error", {})
            return f"http {reply.status_code} {error.get('code') or error.get('type')}"
        choice = reply.json()["choices"][0]
        calls = {i: c["function"] for i, c in enumerate(choice["message"].get("tool_calls") or [])}
        why = invalid(body, choice["message"].get("content") or "", calls, choice["finish_reason"])
        return f"invalid: {why}" if why else "ok"
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            error = json.loads(await reply.aread()).get("error", {})
            return f"http {reply.status_code} {error.get('code') or error.get('type')}"
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


async def load(url: str, pid: int | None, args) -> dict:
    tools = bfcl_tools()
    records: list[tuple[str, str, float]] = []  # (kind, outcome, seconds)
    health: list[float] = []
    health_errors: Counter = Counter()
    rss: list[float] = []
    stop_at = time.perf_counter() + args.seconds

    async def client(c: int) -> None:
        rng = random.Random(args.seed * 1000 + c)
        async with httpx.AsyncClient(timeout=args.request_timeout) as http:
            while time.perf_counter() < stop_at:
                kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
                started = time.perf_counter()
                try:
                    outcome = await one(http, url, kind, body_of(kind, rng, tools))
                except httpx.TimeoutException:
                    outcome = "client timeout"
                except httpx.HTTPError as exc:
                    outcome = f"client error {type(exc).__name__}"
                records.append((kind, outcome, time.perf_counter() - started))
                if outcome.startswith("http 429"):
                    await asyncio.sleep(1)  # Retry-After: 1

    async def poll_health() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                started = time.perf_counter()
                try:
                    (await http.get(f"{url}/health")).raise_for_status()
                    health.append(time.perf_counter() - started)
                except httpx.HTTPError as exc:
                    health_errors[type(exc).__name__] += 1
                await asyncio.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))

    async def watch_rss() -> None:
        while pid is not None:
            rss.append(rss_mb(pid))
            await asyncio.sleep(1)

    watchers = [asyncio.create_task(poll_health()), asyncio.create_task(watch_rss())]
    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(args.clients)))
    wall = time.perf_counter() - started
    for task in watchers:
        task.cancel()
    return {"records": records, "health_s": health, "health_errors": dict(health_errors), "rss_mb": rss,
            "wall_s": wall}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else \
        (values[0] if values else float("nan"))


def summary(run: dict) -> dict:
    by_kind: dict[str, list] = defaultdict(list)
    for kind, outcome, seconds in run["records"]:
        by_kind[kind].append((outcome, seconds))
    rows = {}
    for kind, items in sorted(by_kind.items()) + [("all", [(o, s) for _, o, s in run["records"]])]:
        served = [s for o, s in items if o in ("ok", "dropped")]
        rows[kind] = {"requests": len(items), "ok": sum(o == "ok" for o, _ in items),
                      "dropped": sum(o == "dropped" for o, _ in items),
                      "errors": dict(Counter(o for o, _ in items if o not in ("ok", "dropped"))),
                      "p50_s": pct(served, 50), "p99_s": pct(served, 99)}
    h = run["health_s"]
    return {"kinds": rows, "health": {"polls": len(h), "errors": run["health_errors"], "p50_ms": pct(h, 50) * 1e3,
                                      "p99_ms": pct(h, 99) * 1e3, "max_ms": max(h, default=float("nan")) * 1e3},
            "rss_mb": {"start": run["rss_mb"][0], "peak": max(run["rss_mb"])} if run["rss_mb"] else None,
            "wall_s": run["wall_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--quick", action="store_true", help="30 seconds")
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--request-timeout", type=float, default=300, help="client-side, per request")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.seconds = 30
    server = nullcontext((args.url, None)) if args.url else live_server()
    with server as (url, proc):
        httpx.post(f"{url}/v1/chat/completions", timeout=300, json={  # warm up before the clock starts
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        run = asyncio.run(load(url, proc.pid if proc else None, args))
        alive = proc is None or proc.poll() is None
    result = summary(run)
    print(f"\nload: {args.clients} clients, {args.seconds:g} s of new requests, {result['wall_s']:.0f} s wall, "
          f"server {'alive' if alive else 'DEAD'}")
    print(f"  {'kind':24} {'requests':>8} {'ok':>6} {'dropped':>7} {'p50 s':>7} {'p99 s':>7}  errors")
    for kind, row in result["kinds"].items():
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(row["errors"].items())) or "-"
        print(f"  {kind:24} {row['requests']:8} {row['ok']:6} {row['dropped']:7} {row['p50_s']:7.2f} "
              f"{row['p99_s']:7.2f}  {errors}")
    h = result["health"]
    print(f"  /health: {h['polls']} polls, p50 {h['p50_ms']:.1f} ms, p99 {h['p99_ms']:.1f} ms, max {h['max_ms']:.1f} ms, "
          f"errors {h['errors'] or 0}")
    if result["rss_mb"]:
        print(f"  server RSS MiB: start {result['rss_mb']['start']:.0f}, peak {result['rss_mb']['peak']:.0f}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("load_quick.json" if args.quick else "load.json")
    out.write_text(json.dumps({"args": vars(args), "server_alive": alive, **result,
                               "records": run["records"]}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

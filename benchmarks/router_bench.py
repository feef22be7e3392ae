"""Many simulated agent sessions through sglang-router in front of maskd replicas: cache_aware
routing vs round_robin, by prefix-cache hit rate and time to first token.

    python benchmarks/router_bench.py [--replicas 2] [--sessions 16] [--turns 4] [--system-tokens 1000]
    python benchmarks/router_bench.py --quick      # 8 sessions x 3 turns, for a small CPU machine

Each session is one agent: its own ~1k-token system prompt, then turns that each add a user message
and keep the assistant's answer, so every turn's prompt starts with the previous turn's. The
sessions run side by side (a turn starts when the session's previous one ends). Per policy the
replicas start afresh (empty prefix caches) and the router starts with that policy. A turn's TTFT
is the time to the first streamed chunk that carries text; its hit rate is usage's cached_tokens
over prompt_tokens. Prints a table; writes benchmarks/results/router.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import httpx

from server.bench.replicas import replicas, sglang_router

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
WORDS = ("order invoice shelf pallet crate forklift supplier customer delivery route truck driver schedule "
         "stock count audit barcode label return refund discount price quote contract warehouse aisle bin "
         "dock shipment carrier tracking weight volume priority urgent fragile cold storage inventory "
         "reorder threshold batch lot expiry quality check damage claim insurance invoice payment terms "
         "credit ledger account region branch manager clerk shift overtime safety training manual policy "
         "exception escalation ticket queue response answer summary report daily weekly monthly").split()
QUESTIONS = ["Where is my order?", "Can you check the stock of blue crates?", "Please escalate the damaged pallet.",
             "What are the payment terms?", "Summarize what we discussed.", "Thanks, anything else?"]


def system_prompt(session: int, tokens: int, salt: str) -> str:
    rng = random.Random(f"{salt}-{session}")
    words = " ".join(rng.choice(WORDS) for _ in range(int(tokens * 0.9)))
    return f"Agent {session} ({salt}). You are a logistics assistant. Rules and context: {words}. Answer briefly."


async def turn(client: httpx.AsyncClient, url: str, messages: list[dict], max_tokens: int) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, text, usage = time.perf_counter(), None, [], None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:300]!r}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
    end = time.perf_counter()
    return {"ttft": (first or end) - start, "latency": end - start, "text": "".join(text),
            "prompt_tokens": usage["prompt_tokens"], "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


async def run_sessions(url: str, sessions: int, turns: int, system_tokens: int, max_tokens: int, salt: str) -> list[dict]:
    async def session(i: int) -> list[dict]:
        messages = [{"role": "system", "content": system_prompt(i, system_tokens, salt)}]
        records = []
        for t in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            record = await turn(client, url, messages, max_tokens)
            messages.append({"role": "assistant", "content": record.pop("text")})
            records.append({"session": i, "turn": t + 1, **record})
        return records

    async with httpx.AsyncClient(timeout=1800) as client:
        return [r for rs in await asyncio.gather(*(session(i) for i in range(sessions))) for r in rs]


def replica_counts(url: str) -> dict:
    """Requests finished and prompt tokens looked up, from a replica's /metrics."""
    finished = looked_up = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line.startswith("maskd_requests_total"):
            finished += float(line.split()[-1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            looked_up = float(line.split()[-1])
    return {"requests": finished, "prompt_tokens_looked_up": looked_up}


def summarize(records: list[dict]) -> dict:
    def stats(rows: list[dict]) -> dict:
        if not rows:
            return {}
        ttfts = sorted(r["ttft"] for r in rows)
        prompt, cached = sum(r["prompt_tokens"] for r in rows), sum(r["cached_tokens"] for r in rows)
        return {"requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached,
                "hit_rate": cached / prompt if prompt else 0.0, "ttft_mean_s": statistics.fmean(ttfts),
                "ttft_p50_s": ttfts[len(ttfts) // 2], "ttft_p90_s": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.9))]}
    return {"all": stats(records), "later_turns": stats([r for r in records if r["turn"] > 1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--policies", default="cache_aware,round_robin")
    parser.add_argument("--quick", action="store_true", help="8 sessions x 3 turns")
    parser.add_argument("--serve-flags", default="", help="extra `maskd serve` flags for every replica")
    parser.add_argument("--out", type=Path, default=RESULTS / "router.json")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.turns = 8, 3
    results = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "policies": {}}
    for policy in args.policies.split(","):
        with replicas(args.replicas, *args.serve_flags.split()) as urls, sglang_router(urls, policy=policy) as router:
            started = time.perf_counter()
            records = asyncio.run(run_sessions(router, args.sessions, args.turns, args.system_tokens,
                                               args.max_tokens, salt=policy))
            wall = time.perf_counter() - started
            per_replica = [replica_counts(u) for u in urls]
        results["policies"][policy] = {"wall_s": wall, **summarize(records), "replicas": per_replica,
                                       "records": records}
        print(f"{policy}: {len(records)} turns in {wall:.1f}s", flush=True)
    print_table(results["policies"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


def print_table(policies: dict) -> None:
    head = (f"{'policy':<12} {'hit rate':>8} {'later-turn hit':>14} {'TTFT mean':>9} {'p50':>7} {'p90':>7} "
            f"{'later TTFT mean':>15} {'wall s':>7}  requests per replica")
    print(head)
    print("-" * len(head))
    for policy, r in policies.items():
        a, later = r["all"], r["later_turns"]
        split = " / ".join(f"{int(x['requests'])}" for x in r["replicas"])
        print(f"{policy:<12} {a['hit_rate']:>8.1%} {later.get('hit_rate', 0):>14.1%} {a['ttft_mean_s']:>9.2f} "
              f"{a['ttft_p50_s']:>7.2f} {a['ttft_p90_s']:>7.2f} {later.get('ttft_mean_s', 0):>15.2f} "
              f"{r['wall_s']:>7.1f}  {split}")


if __name__ == "__main__":
    main()

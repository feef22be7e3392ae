"""Soak test: many mixed requests with random client disconnects against a live server.

    python benchmarks/soak.py [--requests 1000] [--concurrency 12] [--cache-mb 16]

Workers send chat requests sharing a few system prompts (so the prefix cache fills, is shared and
evicts), with random question lengths, random max_tokens, streamed or not; about a quarter of the
streams are dropped by the client after a few chunks. A tiny --max-waiting makes some requests get
429 (counted, retried after a pause). Afterwards, with nothing running: the server is alive, /debug/integrity
(the scheduler's and the prefix cache's check_integrity() run on the engine thread) passes, the
prefix cache holds at most its budget, running = waiting = 0, and the server's RSS grew by less
than the cache budget plus --rss-slack-mb over the run. Prints a table, writes
benchmarks/results/soak.json and soak.png (RSS and prefix cache bytes over time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

import httpx

from live_server import live_server, metric

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
WORDS = ("stock order invoice shelf crate pallet forklift aisle return refund courier label barcode "
         "supplier ledger audit night shift manager customer").split()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def systems(rng: random.Random) -> list[str]:
    return [f"System {i}. You are warehouse assistant number {i}. " + " ".join(rng.choices(WORDS, k=n))
            for i, n in enumerate((30, 100, 200, 350))]


async def one(http: httpx.AsyncClient, url: str, rng: random.Random, prompts: list[str], stats: Counter) -> None:
    """One request; a 429 (queue full) is counted and retried after a short pause."""
    for _ in range(100):
        if await attempt(http, url, rng, prompts, stats) != 429:
            return
        await asyncio.sleep(rng.uniform(0.5, 1.5))  # what a polite client does after a 429
    stats["gave up after 100 x 429"] += 1


async def attempt(http: httpx.AsyncClient, url: str, rng: random.Random, prompts: list[str], stats: Counter) -> int:
    body = {"model": MODEL, "temperature": rng.choice([0, 0.8]), "max_tokens": rng.randint(1, 16),
            "messages": [{"role": "system", "content": rng.choice(prompts)},
                         {"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(1, 40)))}]}
    stream, drop_after = rng.random() < 0.6, None
    if stream and rng.random() < 0.4:
        drop_after = rng.randint(1, 4)
    try:
        if not stream:
            reply = await http.post(f"{url}/v1/chat/completions", json=body)
            stats[f"http {reply.status_code}"] += 1
            if reply.status_code == 200:
                stats["cached requests"] += reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            return reply.status_code
        async with http.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as reply:
            stats[f"http {reply.status_code}"] += 1
            chunks = 0
            async for line in reply.aiter_lines():
                chunks += line.startswith("data:")
                if drop_after is not None and chunks >= drop_after:
                    stats["client disconnects"] += 1
                    break  # leaving the block closes the connection mid-stream
            return reply.status_code
    except httpx.HTTPError as exc:
        stats[f"client error {type(exc).__name__}"] += 1
    return 0


async def soak(url: str, pid: int, args) -> tuple[Counter, list]:
    rng = random.Random(args.seed)
    prompts = systems(rng)
    stats, samples, left = Counter(), [], iter(range(args.requests))
    started = time.perf_counter()

    async def worker(w: int) -> None:
        wrng = random.Random(args.seed * 1000 + w)
        async with httpx.AsyncClient(timeout=300) as http:
            for _ in left:
                await one(http, url, wrng, prompts, stats)

    async def sampler() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                text = (await http.get(f"{url}/metrics")).text
                cache = next(float(l.split()[1]) for l in text.splitlines() if l.startswith("maskd_prefix_cache_bytes "))
                samples.append((time.perf_counter() - started, rss_mb(pid), cache / 2**20))
                await asyncio.sleep(1)

    watch = asyncio.create_task(sampler())
    await asyncio.gather(*(worker(w) for w in range(args.concurrency)))
    watch.cancel()
    return stats, samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=12)
    parser.add_argument("--cache-mb", type=float, default=16)
    parser.add_argument("--max-waiting", type=int, default=8)
    parser.add_argument("--rss-slack-mb", type=float, default=600,
                        help="RSS growth allowed beyond the cache budget: the running batch's KV, allocator slack")
    parser.add_argument("--leak-mb", type=float, default=100,
                        help="most the RSS peak of the last quarter of the run may exceed that of its first half")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with live_server("--prefix-cache-mb", str(args.cache_mb), "--max-waiting", str(args.max_waiting),
                     "--prefill-chunk", "256") as (url, proc):
        httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        rss_start = rss_mb(proc.pid)
        started = time.perf_counter()
        stats, samples = asyncio.run(soak(url, proc.pid, args))
        elapsed = time.perf_counter() - started
        for _ in range(60):  # cancelled rows leave within a step; give the engine a moment
            if metric(url, "maskd_requests_running") == 0 and metric(url, "maskd_requests_waiting") == 0:
                break
            time.sleep(0.5)
        integrity = httpx.get(f"{url}/debug/integrity", timeout=60).json()
        final = {name: metric(url, name) for name in (
            "maskd_requests_running", "maskd_requests_waiting", "maskd_prefix_cache_bytes",
            "maskd_prefix_cache_budget_bytes", "maskd_prefix_cache_tokens", "maskd_prefix_cache_hit_ratio",
            "maskd_generation_tokens_total", "maskd_forward_passes_total", "maskd_requests_rejected_total")}
        alive = proc.poll() is None
        rss_end = rss_mb(proc.pid)

    rss_peak = max([s[1] for s in samples] + [rss_end])
    half, last = samples[: len(samples) // 2] or samples, samples[3 * len(samples) // 4:] or samples
    leak = max(s[1] for s in last) - max(s[1] for s in half)
    checks = {
        "server alive": alive,
        "check_integrity": integrity.get("ok") is True,
        "nothing running or waiting": final["maskd_requests_running"] == 0 and final["maskd_requests_waiting"] == 0,
        "prefix cache within budget": final["maskd_prefix_cache_bytes"] <= final["maskd_prefix_cache_budget_bytes"],
        "RSS growth < budget + slack": rss_peak - rss_start < args.cache_mb + args.rss_slack_mb,
        "no RSS growth late in the run (leak)": leak < args.leak_mb,
        "no 5xx": not any(k.startswith("http 5") for k in stats),
    }
    print(f"\nsoak: {args.requests} requests, {args.concurrency} clients, {elapsed:.0f}s, cache budget {args.cache_mb} MiB")
    for key, value in sorted(stats.items()):
        print(f"  {key:32} {value}")
    print(f"  {'generated tokens':32} {final['maskd_generation_tokens_total']:.0f}")
    print(f"  {'prefix cache MiB (end)':32} {final['maskd_prefix_cache_bytes'] / 2**20:.1f}")
    print(f"  {'prefix cache hit ratio':32} {final['maskd_prefix_cache_hit_ratio']:.3f}")
    print(f"  {'RSS MiB start / peak / end':32} {rss_start:.0f} / {rss_peak:.0f} / {rss_end:.0f}")
    print(f"  {'RSS peak, last quarter - first half':32} {leak:+.0f} MiB")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps({
        "args": vars(args), "elapsed_s": elapsed, "stats": dict(stats), "final_metrics": final,
        "integrity": integrity, "rss_mb": {"start": rss_start, "peak": rss_peak, "end": rss_end, "late_growth": leak},
        "checks": checks, "samples": samples}, indent=2))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s[0] for s in samples], [s[1] for s in samples], label="server RSS (MiB)")
    ax.plot([s[0] for s in samples], [s[2] for s in samples], label="prefix cache (MiB)")
    ax.axhline(args.cache_mb, linestyle="--", color="gray", label="cache budget")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(f"soak: {args.requests} requests, {sum(checks.values())}/{len(checks)} checks pass")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "soak.png", dpi=100)
    print(f"wrote {RESULTS / 'soak.json'} and soak.png")
    if not all(checks.values()):
        raise SystemExit("soak checks failed")


if __name__ == "__main__":
    main()

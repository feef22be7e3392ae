"""Suite `batch`: aggregate throughput and per-request latency at concurrency 1, 2, 4, 8, 16
through the live server (continuous batching).

At concurrency c, c chat requests (different questions) are sent at once; every request is greedy
with ignore_eos, so each yields exactly the asked tokens. Verdict: tokens/s at each c against c = 1
(target at 8: >= 3x). The greedy text of a question must not depend on what it was batched with:
each level's texts are compared with the first text seen for the same question.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from server.bench.stats import fmt, pct

QUESTIONS = ["Write a haiku about autumn leaves.", "Explain what a hash table is.",
             "List five uses of copper and say why each matters.", "Describe the water cycle to a child.",
             "What is the capital of France and what is it known for?", "Give three tips for writing clean code.",
             "Tell a short story about a robot learning to paint pictures of the sea at dawn.", "Why is the sky blue?"]


async def one(client, url: str, model: str, question: str, tokens: int) -> dict:
    started = time.perf_counter()
    reply = await client.post(f"{url}/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": question}], "max_tokens": tokens,
        "temperature": 0, "ignore_eos": True})
    reply.raise_for_status()
    data = reply.json()
    return {"text": data["choices"][0]["message"]["content"], "tokens": data["usage"]["completion_tokens"],
            "latency_s": time.perf_counter() - started}


async def level(client, url: str, model: str, questions: list[str], tokens: int) -> tuple[float, list[dict]]:
    """All ``questions`` at once: wall seconds and each request's result."""
    started = time.perf_counter()
    out = await asyncio.gather(*(one(client, url, model, q, tokens) for q in questions))
    return time.perf_counter() - started, list(out)


def run(ctx, progress, rounds: int = 1) -> dict:
    import httpx

    sizes = ctx.sizes
    model = ctx.spec().name
    url = ctx.server_url()
    levels = {c: [] for c in sizes.concurrency}
    seen: dict[str, str] = {}
    unequal = []
    bar = progress("batch", rounds * len(levels))

    async def bench() -> None:
        async with httpx.AsyncClient(timeout=900) as client:
            await one(client, url, model, "warm up", 4)
            for _ in range(rounds):
                for c in levels:
                    questions = [QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})")
                                 for i in range(c)]
                    elapsed, out = await level(client, url, model, questions, sizes.batch_tokens)
                    levels[c].append({"seconds": elapsed, "tokens": sum(r["tokens"] for r in out),
                                      "latencies": [r["latency_s"] for r in out]})
                    for q, r in zip(questions, out):
                        if seen.setdefault(q, r["text"]) != r["text"]:
                            unequal.append((c, q))
                    bar.update()
    try:
        asyncio.run(bench())
    finally:
        bar.close()
    summary = []
    for c, runs in levels.items():
        rates = [r["tokens"] / r["seconds"] for r in runs]
        latencies = [x for r in runs for x in r["latencies"]]
        summary.append({"concurrency": c, "tok_s": statistics.median(rates), "latency_p50_s": pct(latencies, 0.5),
                        "latency_p90_s": pct(latencies, 0.9), "tokens_per_request": sizes.batch_tokens})
    base = summary[0]["tok_s"]
    for row in summary:
        row["speedup"] = row["tok_s"] / base
    table = [[str(r["concurrency"]), f"{r['tok_s']:.1f}", f"{r['speedup']:.2f}x", fmt(r["latency_p50_s"], ".2f"),
              fmt(r["latency_p90_s"], ".2f")] for r in summary]
    return {
        "levels": levels, "summary": summary, "outputs_equal": not unequal, "unequal": unequal,
        "ratios": {f"tokens/s at {r['concurrency']} / at {summary[0]['concurrency']}": r["speedup"]
                   for r in summary[1:]},
        "notes": [f"Greedy texts equal whatever they were batched with: {not unequal}"
                  + (f" (differ: {unequal[:4]})" if unequal else "") + ".",
                  "The server runs with its prefix cache on (as served); the questions share only the chat "
                  "template's head."],
        "tables": [{"title": f"Concurrent requests, {sizes.batch_tokens} tokens each (greedy, ignore_eos)",
                    "columns": ["concurrency", "tokens/s", "x concurrency 1", "latency p50 s", "latency p90 s"],
                    "rows": table}],
    }


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    with figure(path, 2) as (ax1, ax2):
        xs = [r["concurrency"] for r in result["summary"]]
        ax1.plot(xs, [r["tok_s"] for r in result["summary"]], marker="o")
        ax1.set_xscale("log", base=2), ax1.set_xticks(xs, [str(x) for x in xs]), ax1.set_ylim(bottom=0)
        ax1.set_xlabel("concurrent requests"), ax1.set_ylabel("aggregate tokens/s"), ax1.set_title("throughput", fontsize=9)
        ax2.plot(xs, [r["latency_p50_s"] for r in result["summary"]], marker="o", label="p50")
        ax2.plot(xs, [r["latency_p90_s"] for r in result["summary"]], marker="x", label="p90")
        ax2.set_xscale("log", base=2), ax2.set_xticks(xs, [str(x) for x in xs]), ax2.set_ylim(bottom=0)
        ax2.set_xlabel("concurrent requests"), ax2.set_ylabel("request latency (s)"), ax2.legend(fontsize=7)
        ax2.set_title("latency", fontsize=9)

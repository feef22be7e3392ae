"""Aggregate throughput of 8 concurrent chat requests against the same 8 served one at a time,
through the real server (continuous batching) and the openai SDK, with the embedded model.

    python benchmarks/batch_bench.py [--requests 8] [--tokens 64] [--rounds 2]

Rounds alternate serial and concurrent so machine noise hits both alike. Every request is greedy
with ignore_eos, so each yields exactly --tokens tokens, and the concurrent texts must equal the
serial ones. The prefix cache is off (--prefix-cache-mb 0): this measures batching alone.
Target: concurrent tokens/s >= 3x serial. Prints a table, writes benchmarks/results/batch_bench.json
and batch_bench.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from live_server import live_server, metric

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
QUESTIONS = ["Write a haiku about autumn leaves.", "Explain what a hash table is.",
             "List five uses of copper and say why each matters.", "Describe the water cycle to a child.",
             "What is the capital of France and what is it known for?", "Give three tips for writing clean code.",
             "Tell a short story about a robot learning to paint pictures of the sea at dawn.", "Why is the sky blue?"]


async def one(client, question: str, tokens: int) -> tuple[str, int]:
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=tokens, temperature=0,
        extra_body={"ignore_eos": True})
    return reply.choices[0].message.content, reply.usage.completion_tokens


async def serial(client, questions, tokens):
    started = time.perf_counter()
    out = [await one(client, q, tokens) for q in questions]
    return time.perf_counter() - started, out


async def concurrent(client, questions, tokens):
    started = time.perf_counter()
    out = await asyncio.gather(*(one(client, q, tokens) for q in questions))
    return time.perf_counter() - started, list(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.requests)]

    from openai import AsyncOpenAI
    runs = {"serial": [], "concurrent": []}
    texts = {"serial": None, "concurrent": []}
    with live_server("--prefix-cache-mb", "0", "--max-batch", str(max(8, args.requests))) as (url, _):
        async def bench():
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
            await one(client, "warm up", 4)
            for _ in range(args.rounds):
                for mode, fn in (("serial", serial), ("concurrent", concurrent)):
                    elapsed, out = await fn(client, questions, args.tokens)
                    assert all(n == args.tokens for _, n in out), [n for _, n in out]
                    runs[mode].append(args.requests * args.tokens / elapsed)
                    if mode == "serial":
                        texts["serial"] = texts["serial"] or [t for t, _ in out]
                    else:
                        texts["concurrent"].append([t for t, _ in out])
        asyncio.run(bench())
        passes = metric(url, "maskd_forward_passes_total")

    medians = {mode: statistics.median(v) for mode, v in runs.items()}
    ratio = medians["concurrent"] / medians["serial"]
    equal = all(t == texts["serial"] for t in texts["concurrent"])
    print(f"\n{MODEL}, {args.requests} requests x {args.tokens} tokens, {args.rounds} interleaved rounds")
    print(f"{'mode':12} {'median tok/s':>12} {'min':>8} {'max':>8}")
    for mode, values in runs.items():
        print(f"{mode:12} {medians[mode]:12.1f} {min(values):8.1f} {max(values):8.1f}")
    pairs = [c / s for s, c in zip(runs["serial"], runs["concurrent"])]
    print("per round (concurrent / serial of the same round): " + ", ".join(f"{x:.2f}x" for x in pairs))
    print(f"concurrent / serial = {ratio:.2f}x (target >= 3): {'MET' if ratio >= 3 else 'NOT MET'}; "
          f"greedy outputs equal to serial: {equal}; forward passes {passes:.0f}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batch_bench.json").write_text(json.dumps({
        "model": MODEL, "requests": args.requests, "tokens": args.tokens, "runs_tok_s": runs,
        "median_tok_s": medians, "ratio": ratio, "per_round_ratio": pairs, "outputs_equal": equal, "serial_texts": texts["serial"]}, indent=2))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, values in runs.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", label=mode)
    ax.set_xlabel("round")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{args.requests} x {args.tokens} tokens: concurrent = {ratio:.1f}x serial")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "batch_bench.png", dpi=100)
    print(f"wrote {RESULTS / 'batch_bench.json'} and batch_bench.png")
    if not equal:
        raise SystemExit("concurrent greedy outputs differ from serial ones")


if __name__ == "__main__":
    main()

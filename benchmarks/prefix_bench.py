"""Time to first token of 8 agents sharing a ~1,500-token system-and-tools prefix, through the
real server and the openai SDK.

    python benchmarks/prefix_bench.py [--agents 8] [--rounds 3] [--prefix-tokens 1500]

Each round uses a fresh prefix (a round number leads the system prompt, so nothing is cached
from earlier rounds). Agents ask one after another, each its own short question; agent 1 prefills
the whole prefix, agents 2..N should reuse it. Target: every TTFT of agents 2..N <= 0.25x agent 1's.
Prints a table, writes benchmarks/results/prefix_bench.json and prefix_bench.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from live_server import live_server, metric

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m-instruct"
TOOLS = [
    {"name": "search_files", "description": "Search the repository for a regular expression and return "
     "matching lines with paths and line numbers.", "parameters": {"pattern": "string", "path": "string"}},
    {"name": "read_file", "description": "Read a file, optionally a range of lines.",
     "parameters": {"path": "string", "start": "integer", "end": "integer"}},
    {"name": "run_tests", "description": "Run the test suite or one test file and report failures.",
     "parameters": {"target": "string", "timeout_s": "integer"}},
    {"name": "edit_file", "description": "Replace an exact snippet of a file with new text.",
     "parameters": {"path": "string", "old": "string", "new": "string"}},
]
QUESTIONS = ["Where is the config parsed?", "Why does the login test fail?", "List the public API.",
             "Rename the helper in cli.py.", "What does the cache evict first?", "Add a retry to fetch().",
             "Explain the build steps.", "Which files import numpy?", "Is there a memory leak?",
             "Summarize the README."]


def system_prompt(tokenizer, round_no: int, tokens: int) -> str:
    head = (f"Session {round_no}. You are a coding agent working in a large Python repository. "
            "You can call these tools; answer with a tool call or one short sentence.\n")
    body = json.dumps(TOOLS, indent=1)
    rules = ("Rule {i}: prefer reading code before editing it; keep edits minimal; run the tests after "
             "every edit and report what changed and why.\n")
    text, i = head + body + "\n", 0
    while len(tokenizer.encode(text, add_special_tokens=False)) < tokens:
        i += 1
        text += rules.format(i=i)
    return text


def ask(client, system: str, question: str, max_tokens: int) -> dict:
    started = time.perf_counter()
    first, usage, text = None, None, []
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if first is None and (choice.delta.content or choice.finish_reason):
                first = time.perf_counter() - started
            text.append(choice.delta.content or "")
    return {"ttft_s": first, "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.prompt_tokens_details.cached_tokens, "text": "".join(text)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--prefill-chunk", type=int, default=512)
    args = parser.parse_args()

    from openai import OpenAI
    from transformers import AutoTokenizer

    from engine.registry import load_registry
    where, gguf = load_registry().get(MODEL).locate()
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=gguf, local_files_only=True)
    rounds = []
    with live_server("--prefill-chunk", str(args.prefill_chunk)) as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        ask(client, "warm up", "hi", 2)
        for r in range(args.rounds):
            system = system_prompt(tokenizer, r, args.prefix_tokens)
            agents = [ask(client, system, QUESTIONS[i % len(QUESTIONS)], args.max_tokens) for i in range(args.agents)]
            rounds.append(agents)
        hit_ratio = metric(url, "maskd_prefix_cache_hit_ratio")
        integrity = __import__("httpx").get(f"{url}/debug/integrity").json()

    print(f"\n{args.agents} agents x {args.rounds} rounds, shared prefix ~{args.prefix_tokens} tokens, "
          f"prefill chunk {args.prefill_chunk}")
    print(f"{'round':>5} {'agent':>5} {'prompt':>7} {'cached':>7} {'TTFT ms':>9} {'x agent 1':>9}")
    ratios = []
    for r, agents in enumerate(rounds):
        base = agents[0]["ttft_s"]
        for i, a in enumerate(agents):
            ratio = a["ttft_s"] / base
            if i:
                ratios.append(ratio)
            print(f"{r:>5} {i + 1:>5} {a['prompt_tokens']:>7} {a['cached_tokens']:>7} {a['ttft_s'] * 1e3:>9.1f} {ratio:>9.3f}")
    worst = max(ratios)
    cached_ok = all(a["cached_tokens"] > 0 for agents in rounds for a in agents[1:])
    print(f"agents 2..{args.agents}: median {statistics.median(ratios):.3f}x, worst {worst:.3f}x of agent 1 "
          f"(target <= 0.25): {'MET' if worst <= 0.25 else 'NOT MET'}; cached_tokens reported: {cached_ok}; "
          f"server hit ratio {hit_ratio:.3f}; integrity {integrity['ok']}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "prefix_bench.json").write_text(json.dumps({
        "agents": args.agents, "rounds": rounds, "prefix_tokens": args.prefix_tokens,
        "prefill_chunk": args.prefill_chunk, "ratios": ratios, "worst_ratio": worst,
        "median_ratio": statistics.median(ratios), "hit_ratio": hit_ratio, "integrity": integrity}, indent=2))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for r, agents in enumerate(rounds):
        ax.plot(range(1, len(agents) + 1), [a["ttft_s"] * 1e3 for a in agents], marker="o", label=f"round {r}")
    ax.set_yscale("log")
    ax.set_xlabel("agent")
    ax.set_ylabel("time to first token (ms)")
    ax.set_title(f"shared {args.prefix_tokens}-token prefix: agents 2..N at {worst:.2f}x agent 1 (worst)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "prefix_bench.png", dpi=100)
    print(f"wrote {RESULTS / 'prefix_bench.json'} and prefix_bench.png")


if __name__ == "__main__":
    main()

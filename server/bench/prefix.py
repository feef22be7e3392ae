"""Suite `prefix`: time to first token of N agents sharing a long system-and-tools prefix, through
the live server.

Each round uses a fresh prefix (a round number leads the system prompt, so nothing is cached from
earlier rounds). Agents ask one after another, each its own short question: agent 1 prefills the
whole prefix (no reuse), agents 2..N should reuse it from the prefix cache. The verdict: agents
2..N's TTFT as a share of agent 1's (target <= 0.25), and the cached_tokens `usage` reports.
"""

from __future__ import annotations

import json
import statistics
import time

from server.bench.stats import fmt

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


def ask(client, url: str, model: str, system: str, question: str, max_tokens: int) -> dict:
    """One streamed chat completion: TTFT (first content or finish), prompt and cached tokens."""
    started = time.perf_counter()
    first, usage, text = None, None, []
    request = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True},
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    with client.stream("POST", f"{url}/v1/chat/completions", json=request) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                content = choice["delta"].get("content")
                if first is None and (content or choice.get("finish_reason")):
                    first = time.perf_counter() - started
                text.append(content or "")
    return {"ttft_s": first, "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            "text": "".join(text)}


def run(ctx, progress, max_tokens: int = 8) -> dict:
    import httpx

    from server.bench.live_server import metric

    sizes = ctx.sizes
    tokenizer, model = ctx.tokenizer(), ctx.spec().name
    url = ctx.server_url()
    rounds = []
    bar = progress("prefix", sizes.prefix_rounds * sizes.agents)
    try:
        with httpx.Client(timeout=900) as client:
            ask(client, url, model, "warm up", "hi", 2)
            for r in range(sizes.prefix_rounds):
                system = system_prompt(tokenizer, r + int(time.time()), sizes.prefix_tokens)  # never cached before
                agents = []
                for i in range(sizes.agents):
                    agents.append(ask(client, url, model, system, QUESTIONS[i % len(QUESTIONS)], max_tokens))
                    bar.update()
                rounds.append(agents)
            integrity = client.get(f"{url}/debug/integrity").json()
        hit_ratio = metric(url, "maskd_prefix_cache_hit_ratio")
    finally:
        bar.close()
    ratios = [a["ttft_s"] / agents[0]["ttft_s"] for agents in rounds for a in agents[1:]]
    worst = max(ratios) if ratios else None
    cached_ok = all(a["cached_tokens"] > 0 for agents in rounds for a in agents[1:])
    table = [[str(r), str(i + 1), str(a["prompt_tokens"]), str(a["cached_tokens"]), f"{a['ttft_s'] * 1e3:.1f}",
              f"{a['ttft_s'] / agents[0]['ttft_s']:.3f}"] for r, agents in enumerate(rounds) for i, a in enumerate(agents)]
    first = [agents[0]["ttft_s"] for agents in rounds]
    reused = [a["ttft_s"] for agents in rounds for a in agents[1:]]
    return {
        "agents": sizes.agents, "prefix_tokens": sizes.prefix_tokens, "rounds": rounds, "ratios": {
            "reused / cold TTFT, median": statistics.median(ratios) if ratios else None,
            "reused / cold TTFT, worst": worst},
        "ttft_cold_ms": statistics.median(first) * 1e3, "ttft_reused_ms": statistics.median(reused) * 1e3 if reused else None,
        "hit_ratio": hit_ratio, "integrity": integrity, "cached_tokens_reported": cached_ok,
        "notes": [f"Agents 2..{sizes.agents}: median {fmt(statistics.median(ratios) if ratios else None, '.3f')}x, worst "
                  f"{fmt(worst, '.3f')}x agent 1's TTFT (target <= 0.25: "
                  f"{'met' if worst is not None and worst <= 0.25 else 'not met'}); cached_tokens reported: "
                  f"{cached_ok}; server prefix-cache hit ratio {hit_ratio:.3f}; integrity {integrity.get('ok')}."],
        "tables": [{"title": f"TTFT, {sizes.agents} agents sharing a ~{sizes.prefix_tokens}-token prefix "
                             f"(agent 1 without reuse, 2..N with)",
                    "columns": ["round", "agent", "prompt tokens", "cached tokens", "TTFT ms", "x agent 1"],
                    "rows": table}],
    }


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    with figure(path) as ax:
        for r, agents in enumerate(result["rounds"]):
            ax.plot(range(1, len(agents) + 1), [a["ttft_s"] * 1e3 for a in agents], marker="o", label=f"round {r}")
        ax.set_yscale("log"), ax.set_xlabel("agent"), ax.set_ylabel("time to first token (ms)")
        worst = result["ratios"]["reused / cold TTFT, worst"]
        ax.set_title(f"~{result['prefix_tokens']}-token shared prefix: worst reuse "
                     f"{worst:.2f}x cold" if worst is not None else "shared prefix", fontsize=9)
        ax.legend(fontsize=7)

"""Suite `budget`: tight max_tokens over BFCL function schemas: the shares of valid, truncated and
invalid outputs, maskd beside the peers where installed (server/bench/peers.py).

Per schema and slack s, greedy, through maskd's chat path (the code the HTTP routes run): "tools"
(tool_choice "required", max_tokens = shortest valid call + s; also streamed at the smallest slack
and compared) and "json" (response_format json_schema of the first function's parameters,
max_tokens = shortest valid object + s). The shortest length is the prepared constraint's
min_tokens(), checked against the minimum the 400 for max_tokens=1 states. Peers run "json" on the
same prompt ids and budget: xgrammar, outlines and llguidance through transformers' generate() on
maskd's model object with their own logits processors, llama-cpp-python on the same GGUF with its
schema grammar (server/bench/peers.py says how each is set up). An output is valid (parses,
jsonschema-valid, known tool), truncated (budget ran out first), invalid (complete but wrong) or
refused (no compile); schemas maskd refuses (400) are left out for all, and counted.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jsonschema

from server import chat
from server.errors import APIError
from server.protocol import ChatCompletionRequest
from server.bench.peers import Peers
from server.bench.schemas import functions_of
from server.state import ServerState

VERDICTS = ("valid", "truncated", "invalid", "refused")


def request(state: ServerState, functions: dict, task: str, max_tokens: int | None,
            stream: bool = False) -> ChatCompletionRequest:
    name, params = next(iter(functions.items()))
    common = dict(model=state.model_name, max_tokens=max_tokens, temperature=0.0, seed=0)
    if task == "tools":
        return ChatCompletionRequest(
            **common, messages=[{"role": "user", "content": f"Call {name} with sensible arguments."}],
            tools=[{"type": "function", "function": {"name": n, "parameters": p}} for n, p in functions.items()],
            tool_choice="required", parallel_tool_calls=False, stream=stream,
            stream_options={"include_usage": True} if stream else None)
    keys = ", ".join(params.get("properties", {})) or "none"
    ask = f"Call {name} with sensible arguments: answer with a JSON object of the arguments (keys: {keys})."
    return ChatCompletionRequest(**common, messages=[{"role": "user", "content": ask}], response_format={
        "type": "json_schema", "json_schema": {"name": "arguments", "schema": params}})


async def minimum(state: ServerState, functions: dict, task: str) -> tuple[int, list[int], bool]:
    """Shortest valid output (the constraint's min_tokens()), the prompt ids, and whether the 400 for
    max_tokens=1 states that same minimum. Raises APIError where maskd refuses the schema."""
    prepared = await chat.prepare(state, request(state, functions, task, None))
    await prepared.settle()  # the tool units compiled and attached (nothing is submitted)
    least = prepared.request.constraint.min_tokens()
    try:
        await chat.complete(state, request(state, functions, task, 1))
        agrees = least <= 1
    except APIError as exc:
        found = re.search(r"is (\d+) tokens", exc.message)
        agrees = exc.code == "budget_too_small" and found is not None and int(found.group(1)) == least
    return least, prepared.request.prompt_ids, agrees


def judge_json(text: str, schema: dict, ran_out: bool) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        return "truncated" if ran_out else "invalid"
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return "invalid"
    return "valid"


def judge_calls(calls: list[tuple[str, str]], functions: dict, ran_out: bool) -> str:
    if not calls:
        return "truncated" if ran_out else "invalid"
    verdicts = [judge_json(args, functions[name], ran_out) if name in functions else "invalid"
                for name, args in calls]
    return next((v for v in verdicts if v != "valid"), "valid")


async def run_maskd(state: ServerState, functions: dict, task: str, budget: int, stream: bool) -> dict:
    body, started = request(state, functions, task, budget, stream), time.perf_counter()
    if not stream:
        reply = await chat.complete(state, body)
        choice = reply.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        text, finish, forced = choice.message.content or "", choice.finish_reason, choice.maskd_budget_forced
        tokens = reply.usage.completion_tokens
    else:
        parts, text, finish, forced, tokens = {}, "", None, None, None
        async for payload in await chat.stream(state, body):
            if payload == "[DONE]":
                break
            data = json.loads(payload)
            tokens = (data.get("usage") or {}).get("completion_tokens", tokens)
            for choice in data["choices"]:
                text += choice["delta"].get("content") or ""
                for delta in choice["delta"].get("tool_calls") or []:
                    entry = parts.setdefault(delta["index"], ["", ""])
                    entry[0] += delta["function"].get("name") or ""
                    entry[1] += delta["function"].get("arguments") or ""
                if choice.get("finish_reason"):
                    finish, forced = choice["finish_reason"], choice.get("maskd_budget_forced")
        calls = [tuple(parts[i]) for i in sorted(parts)]
    ran_out = finish == "length"
    verdict = (judge_calls(calls, functions, ran_out) if task == "tools"
               else judge_json(text, next(iter(functions.values())), ran_out))
    return {"verdict": verdict, "finish": finish, "forced": forced, "tokens": tokens, "seconds":
            time.perf_counter() - started, "output": [list(c) for c in calls] if task == "tools" else text}


def run_peer(peers, name: str, made, prompt_ids: list[int], budget: int, schema: dict, tokenizer) -> dict:
    """One peer's greedy output for ``schema`` within ``budget`` tokens, judged like maskd's."""
    if isinstance(made, str):
        return {"verdict": "refused", "finish": None, "forced": None, "tokens": None, "seconds": 0.0,
                "output": made[:300]}
    started = time.perf_counter()
    new, _ = peers.generate(name, made, prompt_ids, budget)
    stopped = bool(new) and new[-1] in peers.ready[name].eos
    text = tokenizer.decode(new[:-1] if stopped else new, skip_special_tokens=False)
    return {"verdict": judge_json(text, schema, not stopped), "finish": "stop" if stopped else "length",
            "forced": None, "tokens": len(new), "seconds": time.perf_counter() - started, "output": text}


async def bench(state: ServerState, peers, rows: list[dict], slacks: list[int],
                stream_slacks: list[int], tick=lambda: None, log=lambda line: None) -> dict:
    """Runs every row at every slack; ``tick`` after each schema, ``log`` gets a line per schema."""
    out = {"records": [], "skipped": {}, "min_400_agrees": [0, 0], "stream_equal": [0, 0], "seconds": []}
    same = ("output", "finish", "forced", "tokens")
    for i, row in enumerate(rows):
        tick()
        functions = functions_of(row["schema"])
        name, params = next(iter(functions.items()))
        started = time.perf_counter()
        try:
            least = {task: await minimum(state, functions, task) for task in ("tools", "json")}
        except APIError as exc:
            out["skipped"][exc.code or "error"] = out["skipped"].get(exc.code or "error", 0) + 1
            log(f"{i:3} {name[:40]:40} refused by maskd: {exc.message[:100]}")
            continue
        out["min_400_agrees"][0] += sum(agrees for _, _, agrees in least.values())
        out["min_400_agrees"][1] += len(least)
        made = peers.compile(params) if peers else {}
        for slack in slacks:
            for task in ("tools", "json"):
                budget = least[task][0] + slack
                base = {"schema": i, "id": row["id"], "task": task, "slack": slack, "budget": budget,
                        "minimum": least[task][0]}
                runs = {f"maskd {task}": await run_maskd(state, functions, task, budget, False)}
                if task == "tools" and slack in stream_slacks:
                    runs["maskd tools stream"] = await run_maskd(state, functions, task, budget, True)
                    whole, streamed = runs["maskd tools"], runs["maskd tools stream"]
                    out["stream_equal"][0] += [whole[k] for k in same] == [streamed[k] for k in same]
                    out["stream_equal"][1] += 1
                elif task == "json":
                    runs.update({peer: run_peer(peers, peer, m, least[task][1], budget, params, state.tokenizer)
                                 for peer, m in made.items()})
                out["records"] += [{**base, "engine": engine, **result} for engine, result in runs.items()]
        out["seconds"].append(time.perf_counter() - started)
        mine = [r for r in out["records"] if r["schema"] == i]
        log(f"{i:3} {name[:40]:40} min tools/json {least['tools'][0]}/{least['json'][0]}  "
            + " ".join(f"{r['engine'].replace('maskd ', 'm-')}@{r['slack']}={r['verdict'][0]}" for r in mine)
            + f"  {out['seconds'][-1]:.0f}s")
    return out


def summarize(records: list[dict], slacks: list[int]) -> list[dict]:
    engines = list(dict.fromkeys(r["engine"] for r in records))
    table = []
    for engine in engines:
        for slack in slacks:
            rs = [r for r in records if r["engine"] == engine and r["slack"] == slack]
            if not rs:
                continue
            ran = [r for r in rs if r["tokens"] is not None]
            forced = [r["forced"] for r in rs if r["forced"] is not None]
            table.append({"engine": engine, "slack": slack, "n": len(rs),
                          **{v: sum(r["verdict"] == v for r in rs) / len(rs) for v in VERDICTS},
                          "budget_forced": sum(forced) / len(forced) if forced else None,
                          "mean_tokens": sum(r["tokens"] for r in ran) / len(ran) if ran else None,
                          "over_budget": sum(r["tokens"] > r["budget"] for r in ran),
                          "seconds": sum(r["seconds"] for r in ran) / len(ran) if ran else 0.0})
    return table


def plot(result: dict, path: Path) -> None:
    table, slacks = result["summary"], result["slacks"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(slacks), figsize=(4 * len(slacks) + 1, 4), sharey=True, squeeze=False)
    colors = dict(zip(VERDICTS, ("tab:green", "tab:orange", "tab:red", "tab:gray")))
    for ax, slack in zip(axes[0], slacks):
        rows = [r for r in table if r["slack"] == slack]
        names = [r["engine"].replace("maskd ", "maskd\n") for r in rows]
        bottom = [0.0] * len(rows)
        for verdict in VERDICTS:
            values = [100 * r[verdict] for r in rows]
            ax.bar(names, values, bottom=bottom, color=colors[verdict], label=verdict)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_title(f"budget = shortest valid + {slack}"), ax.tick_params(axis="x", labelsize=7)
    axes[0][0].set_ylabel("% of outputs"), axes[0][-1].legend(fontsize=8)
    fig.tight_layout(), fig.savefig(path, dpi=80), plt.close(fig)


def run(ctx, progress, log=lambda line: None, no_peers: bool = False, stream_all: bool = False) -> dict:
    """The suite: the first ``budget_schemas`` function rows of the run's schema set (spread when
    there are many), each slack of the run's sizes."""
    import asyncio

    from server.bench.schemas import function_rows
    from server.bench.stats import fmt

    stack = ctx.stack()
    sizes, state = ctx.sizes, stack.state
    rows = function_rows(ctx.rows)
    rows = rows[::max(1, len(rows) // sizes.budget_schemas)][:sizes.budget_schemas]
    slacks = list(sizes.slacks)
    peers = None if no_peers else Peers(stack)
    skipped = {} if peers is None else peers.skipped
    bar = progress("budget", len(rows))
    try:
        out = asyncio.run(bench(state, peers if peers and peers.ready else None, rows, slacks,
                                slacks if stream_all else [min(slacks)], bar.update, log))
    finally:
        bar.close()
        if peers:
            peers.close()
    table = summarize(out["records"], slacks)
    pcent = lambda v: fmt(v and 100 * v, ".0f") + ("%" if v is not None else "")  # noqa: E731
    rows_out = [[r["engine"], str(r["slack"]), str(r["n"]), pcent(r["valid"]), pcent(r["truncated"]),
                 pcent(r["invalid"]), pcent(r["refused"]), pcent(r["budget_forced"]), fmt(r["mean_tokens"]),
                 f"{r['seconds']:.2f}"] for r in table]
    rows_out += [[name, "-", "-", "skipped", "-", "-", "-", "-", "-", "-"] for name in skipped]
    agrees, equal = out["min_400_agrees"], out["stream_equal"]
    valid = {f"{r['engine']} @ +{r['slack']}": r["valid"] for r in table}
    json_engines = ["maskd json", *(peers.ready if peers else ())]  # the same prompts, model and budgets
    side = [[f"+{slack}"] + [pcent(next((r["valid"] for r in table if r["engine"] == e and r["slack"] == slack), None))
                             for e in json_engines] + ["skipped"] * len(skipped) for slack in slacks]
    return {
        "schemas": len(rows), "slacks": slacks, "served": len(out["seconds"]), "summary": table, "peers_skipped": skipped,
        **out, "ratios": {f"valid share, {k}": v for k, v in valid.items()},
        "notes": [f"{len(rows)} BFCL schemas; refused by maskd: {sum(out['skipped'].values())} {out['skipped']}.",
                  f"min_tokens() equal to the 400's stated minimum: {agrees[0]}/{agrees[1]}; streamed tool calls "
                  f"equal to non-streamed: {equal[0]}/{equal[1]}."]
                 + [f"{k}: skipped ({v})." for k, v in skipped.items()]
                 + (["llama-cpp-python decodes the GGUF's quantized weights with its own kernels (the others: "
                     "maskd's model object, dequantized), so its greedy text may differ."]
                    if "llama-cpp-python" in json_engines else []),
        "tables": [{"title": "Outputs under max_tokens = shortest valid output + slack (greedy)",
                    "columns": ["engine", "slack", "n", "valid", "truncated", "invalid", "refused", "budget-closed",
                                "mean tokens", "s/run"], "rows": rows_out},
                   {"title": "Valid share of the json_schema outputs side by side (same prompt ids, model, budgets)",
                    "columns": ["slack", *json_engines, *skipped], "rows": side}],
    }

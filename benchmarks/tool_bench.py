"""Tool-call validity over MaskBench's BFCL function schemas, with the embedded model.

    python benchmarks/tool_bench.py [--stride K] [--limit N] [--max-tokens 96] [--concurrency 8] [--resume]

Each BFCL schema is {"<function name>": <parameters>}: it is sent as one tool through maskd's chat
path (the same code the HTTP routes run: prompt rendering, grammar, engine, parsing), once with
tool_choice "required" non-streamed and streamed, once with "auto" and a logit_bias favouring the
tokens of the call-opening delimiter (without it this 135M model rarely opens a call; --plain-auto
adds the unbiased run). A response counts as valid when
it has tool calls, each to a known tool, whose arguments parse and validate (jsonschema). Schemas
the server refuses (400: a keyword it cannot enforce, a compile timeout) are counted apart. Where
--max-tokens is under a schema's shortest valid call, the 400 states the minimum and that schema
is run with the minimum + 20 (counted as budget_raised).
Each schema's outcome is appended to benchmarks/results/tool_bench_records.jsonl as it ends, so a
run over all 1,043 schemas (hours on 2 CPU cores) can stop and go on with --resume. Prints a table
over the selected schemas' records, writes benchmarks/results/tool_bench.json and tool_bench.png.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import re
import time
from pathlib import Path

from engine.constraint_hook import ConstraintMasker
from engine.engine import Engine
from engine.model_loader import load_model
from engine.registry import load_registry
from grammars import GrammarCompiler, TokenVocabulary
from server import chat
from server.bench.schemas import functions_of  # noqa: F401 - naturalness_bench imports it from here
from server.bench.tools import check, delimiter_bias
from server.errors import APIError
from server.protocol import ChatCompletionRequest
from server.state import ServerState

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "maskbench" / "BFCL.jsonl.gz"
RESULTS = Path(__file__).resolve().parent / "results"


def load_state(grammar_timeout: float = 10.0) -> ServerState:
    loaded = load_model(load_registry().get(None))
    vocabulary = TokenVocabulary.from_tokenizer(loaded.tokenizer, loaded.vocab_size,
                                                extra_eos_token_ids=tuple(loaded.eos_token_ids))
    engine = Engine(loaded.model, loaded.tokenizer, loaded.device, loaded.eos_token_ids, loaded.context_length,
                    logits_hooks=[ConstraintMasker(loaded.vocab_size, 8)],
                    prefix_cache_bytes=512 << 20)  # as `maskd serve` (--prefix-cache-mb 512)
    engine.start()
    return ServerState(loaded.name, loaded.tokenizer, loaded.context_length, loaded.spec.tool_format, engine,
                       GrammarCompiler(vocabulary, timeout_s=grammar_timeout), vocabulary)


async def run_one(state: ServerState, functions: dict[str, dict], mode: str, stream: bool, max_tokens: int,
                  seed: int, bias: dict[str, float] | None = None):
    body = ChatCompletionRequest(
        model=state.model_name, max_tokens=max_tokens, temperature=0.0 if mode == "required" else 0.7, seed=seed,
        messages=[{"role": "user", "content": f"Call {next(iter(functions))} with sensible arguments."}],
        tools=[{"type": "function", "function": {"name": name, "parameters": params}}
               for name, params in functions.items()],
        tool_choice=mode, parallel_tool_calls=False, stream=stream, logit_bias=bias)
    if not stream:
        reply = await chat.complete(state, body)
        message = reply.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return calls, reply.choices[0].finish_reason, reply.choices[0].maskd_budget_forced
    calls: dict[int, list[str]] = {}
    finish = None
    async for payload in await chat.stream(state, body):
        if payload == "[DONE]":
            break
        data = json.loads(payload)
        for choice in data.get("choices", []):
            for delta in choice["delta"].get("tool_calls") or []:
                entry = calls.setdefault(delta["index"], ["", ""])
                entry[0] += delta["function"].get("name") or ""
                entry[1] += delta["function"].get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish, None


async def bench(state: ServerState, rows: list[tuple[int, dict]], max_tokens: int, concurrency: int,
                plain_auto: bool, log) -> None:
    """Runs each (BFCL line, row) and appends one JSON record per schema to ``log``."""
    bias = delimiter_bias(state.tokenizer, state.tool_format)
    gate = asyncio.Semaphore(concurrency)  # schemas in flight at once (the engine batches them)

    async def one(i: int, row: dict) -> None:
        functions = functions_of(row["schema"])
        name = next(iter(functions))
        record = {"line": i, "name": name, "tools": len(functions), "max_tokens": max_tokens,
                  "grammar_timeout": state.compiler.timeout_s}
        async with gate:
            started = time.perf_counter()
            budget = max_tokens
            try:
                try:
                    whole, finish, forced = await run_one(state, functions, "required", False, budget, i)
                except APIError as exc:
                    # As a client would: a budget under the calls' shortest valid form is a 400 that
                    # names the minimum; ask again with that much plus headroom.
                    needed = re.search(r"ask for at least (\d+)", exc.message) if exc.code == "budget_too_small" else None
                    if needed is None:
                        raise
                    budget = record["budget_raised_to"] = int(needed.group(1)) + 20
                    whole, finish, forced = await run_one(state, functions, "required", False, budget, i)
                streamed, stream_finish, _ = await run_one(state, functions, "required", True, budget, i)
                auto, auto_finish, _ = await run_one(state, functions, "auto", False, budget, i, bias)
                plain = await run_one(state, functions, "auto", False, budget, i) if plain_auto else None
            except APIError as exc:
                record["refused"] = exc.code or "error"
                record["message"] = exc.message[:300]
            except Exception as exc:  # noqa: BLE001 - a failure is a result; the run goes on
                record["failed"] = f"{type(exc).__name__}: {exc}"[:300]
            else:
                record.update(
                    required=check(whole, finish, functions), required_stream=check(streamed, stream_finish, functions),
                    auto=check(auto, auto_finish, functions), stream_equal=whole == streamed,
                    length_cut=finish == "length", budget_forced=bool(forced), auto_calls=len(auto))
                if plain is not None:
                    record["auto_plain"] = check(plain[0], plain[1], functions)
            record["seconds"] = round(time.perf_counter() - started, 2)
        log.write(json.dumps(record) + "\n")
        log.flush()
        verdicts = {k: record[k] for k in ("required", "required_stream", "auto", "auto_plain", "refused", "failed")
                    if k in record}
        print(f"{i:4} {name[:40]:40} {len(functions)} tools " + " ".join(f"{k}={v}" for k, v in verdicts.items())
              + f" {record['seconds']:.1f}s", flush=True)

    await asyncio.gather(*(one(i, row) for i, row in rows))


def tally(records: list[dict]) -> dict:
    """The counts over per-schema records (see bench)."""
    out = {"schemas": len(records), "refused": {}, "failed": [], "required": {}, "required_stream": {}, "auto": {},
           "auto_plain": {}, "stream_equal": 0, "length_cut": 0, "budget_forced": 0, "budget_raised": 0,
           "auto_calls": 0, "seconds": []}
    for r in records:
        if "refused" in r:
            out["refused"][r["refused"]] = out["refused"].get(r["refused"], 0) + 1
            continue
        if "failed" in r:
            out["failed"].append(f"{r['line']} {r['name']}: {r['failed']}")
            continue
        for key in ("required", "required_stream", "auto", "auto_plain"):
            if key in r:
                out[key][r[key]] = out[key].get(r[key], 0) + 1
        for key in ("stream_equal", "length_cut", "budget_forced", "auto_calls"):
            out[key] += int(r[key])
        out["budget_raised"] += "budget_raised_to" in r
        out["seconds"].append(r["seconds"])
    return out


def report(outcome: dict, total: int, plain_auto: bool) -> None:
    served = len(outcome["seconds"])
    print(f"\n{total} BFCL schemas selected, {outcome['schemas']} run; served {served}, refused "
          f"{sum(outcome['refused'].values())} {outcome['refused']}")
    print("share = valid / responses that ended by themselves (and, for auto, that made a call)")
    print(f"{'mode':18} {'valid':>7} {'share':>7}  outcomes")
    for key in ("required", "required_stream", "auto", "auto_plain"):
        if key == "auto_plain" and not plain_auto:
            continue
        counts = outcome[key]
        valid = counts.get("valid", 0)
        judged = served - counts.get("cut_by_max_tokens", 0) - (counts.get("no_call", 0) if "auto" in key else 0)
        share = valid / judged if judged else 0.0
        print(f"{key:18} {valid:7} {share:7.1%}  {counts}")
    print(f"streamed calls equal to non-streamed: {outcome['stream_equal']}/{served}; "
          f"cut by max_tokens: {outcome['length_cut']}; closed by the budget (maskd_budget_forced): "
          f"{outcome['budget_forced']}; max_tokens raised to the stated minimum + 20: {outcome['budget_raised']}; "
          f"calls made in auto: {outcome['auto_calls']}")
    print(f"failed (an exception, not a verdict): {len(outcome['failed'])}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=None, help="first N schemas (default: all 1,043)")
    parser.add_argument("--stride", type=int, default=1, help="take every k-th schema (a spread sample)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8, help="schemas in flight at once (batched)")
    parser.add_argument("--plain-auto", action="store_true",
                        help="also run auto without the delimiter bias (this model then rarely calls)")
    parser.add_argument("--grammar-timeout", type=float, default=10.0, help="compile time limit, s (the server's default)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the records already in the log and run only the schemas it lacks")
    parser.add_argument("--redo-refused", action="store_true",
                        help="with --resume, run again the schemas refused before (e.g. compile timeouts on a busy machine)")
    args = parser.parse_args()
    lines = list(enumerate(json.loads(line) for line in gzip.open(DATA, "rt")))
    rows = lines[::args.stride][:args.limit]
    RESULTS.mkdir(exist_ok=True)
    log_path = RESULTS / "tool_bench_records.jsonl"
    done = {}
    if args.resume and log_path.exists():
        done = {r["line"]: r for r in map(json.loads, log_path.read_text().splitlines())
                if not (args.redo_refused and "refused" in r)}
    todo = [(i, row) for i, row in rows if i not in done]
    random.Random(0).shuffle(todo)  # a run stopped early leaves a spread sample, not the first lines
    print(f"{len(rows)} schemas selected; {len(rows) - len(todo)} already in {log_path.name}; running {len(todo)}")
    if todo:
        state = load_state(args.grammar_timeout)
        with open(log_path, "a" if args.resume else "w") as log:
            asyncio.run(bench(state, todo, args.max_tokens, args.concurrency, args.plain_auto, log))
        state.engine.shutdown()
        state.compiler.close()
    selected = {i for i, _ in rows}
    latest = {r["line"]: r for r in map(json.loads, log_path.read_text().splitlines())}  # a redo replaces
    records = [r for i, r in sorted(latest.items()) if i in selected]
    outcome = tally(records)
    report(outcome, len(rows), args.plain_auto)
    (RESULTS / "tool_bench.json").write_text(json.dumps(
        {**outcome, "selected": len(rows), "complete": len(records) == len(rows)}, indent=2))
    served = len(outcome["seconds"])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = tuple(k for k in ("required", "required_stream", "auto", "auto_plain") if outcome[k])
    verdicts = sorted({v for k in keys for v in outcome[k]})
    bottom = [0] * len(keys)
    for verdict in verdicts:
        values = [outcome[k].get(verdict, 0) for k in keys]
        ax.bar(keys, values, bottom=bottom, label=verdict)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("responses")
    ax.set_title(f"BFCL tools through maskd ({served} schemas served)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "tool_bench.png", dpi=100)


if __name__ == "__main__":
    main()

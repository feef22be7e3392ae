"""Suite `speed`: the engine against llama-cpp-python on the same GGUF and cores, and the precision's
fidelity (issue 54's targets), in one run, contenders interleaved round by round.

- decode: batch-1 tok/s after the first token, 64 tokens, ignore_eos (maskd's engine as `maskd
  serve` builds it: the precision `auto` picks, the compiled step; llama.cpp's generate());
- prefill: tok/s of a 1,000-token prompt, never seen before (a new random prompt each round, so
  the prefix cache cannot hit), to the first token;
- 8 concurrent requests: aggregate decode tok/s over maskd's own batch 1;
- mask share: the ConstraintMasker's time over the step time of 8 rows under a JSON schema;
- fidelity: perplexity on server/bench/data/fidelity.txt and greedy agreement (first 16 tokens) on
  50 prompts, float32 against bfloat16 matmuls and against the precision `auto` picks
  (server/bench/fidelity.py);
- startup and memory: `maskd serve` until /health answers and its resident memory then, against
  the float32 eager engine of before (dtype float32, quantization none, --no-compile) and against a
  llama-cpp-python process holding the same model (server/bench/footprint.py).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import torch

from server.bench.context import BenchContext
from server.bench.fidelity import TEXT, fidelity
from server.bench.footprint import before_registry, llama_rss_mb, serve

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "story": {"type": "string"}},
          "required": ["name", "story"], "additionalProperties": False}


def _run(engine, requests) -> list[tuple[float, float, int]]:
    """Runs requests together; per request (first token time, last token time, completion tokens)."""
    async def one(request):
        first = last = None
        tokens = 0
        async for event in engine.generate(request):
            now = time.perf_counter()
            first = first or now
            last, tokens = now, event.completion_tokens
        return first, last, tokens

    async def all_of():
        return await asyncio.gather(*(one(r) for r in requests))
    return asyncio.run(all_of())


def _request(ids, tokens, constraint=None):
    from engine.sampling import SamplingParams
    from engine.sequence import Request

    return Request(prompt_ids=list(ids), constraint=constraint,
                   params=SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=constraint is None))


def _decode_rate(results) -> float:
    """Tokens after each request's first over the time from the earliest first token to the last."""
    start = min(r[0] for r in results)
    end = max(r[1] for r in results)
    return sum(r[2] - 1 for r in results) / (end - start)


def run(ctx: BenchContext, progress) -> dict:
    from server.bench.peers import LlamaCppPeer

    rounds = 2 if ctx.tiny else 3
    bar = progress("speed", rounds * 4 + 5)
    stack = ctx.stack()
    engine, tokenizer = stack.engine, stack.loaded.tokenizer
    try:
        llama = LlamaCppPeer(stack)
    except Exception as exc:  # noqa: BLE001 - not installed, or not a GGUF model: maskd alone
        llama, why = None, f"{type(exc).__name__}: {exc}"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Describe a city with a long history."}],
                                         add_generation_prompt=True, return_dict=True)["input_ids"]
    g = torch.Generator().manual_seed(0)
    runs: dict[str, list[float]] = {}
    new = 16 if ctx.tiny else 64
    prefill = 200 if ctx.tiny else 1000
    for r in range(rounds):
        runs.setdefault("maskd decode, batch 1", []).append(_decode_rate(_run(engine, [_request(chat, new)])))
        bar.update(1)
        if llama is not None:
            ids, times = llama.generate(None, chat, new, ignore_eos=True)
            runs.setdefault("llama-cpp-python decode, batch 1", []).append((len(ids) - 1) / (times[-1] - times[0]))
        bar.update(1)
        prompt = torch.randint(100, tokenizer.vocab_size - 100, (prefill,), generator=g).tolist()
        submitted = time.perf_counter()
        first = _run(engine, [_request(prompt, 1)])[0][0]
        runs.setdefault(f"maskd prefill, {prefill} tokens", []).append(prefill / (first - submitted))
        if llama is not None:
            prompt = torch.randint(100, tokenizer.vocab_size - 100, (prefill,), generator=g).tolist()
            runs.setdefault(f"llama-cpp-python prefill, {prefill} tokens", []).append(prefill / llama.prefill(prompt))
        bar.update(1)
        prompts = [chat[:-1] + [chat[-1]] for _ in range(8)]
        runs.setdefault("maskd decode, 8 concurrent (aggregate)", []).append(
            _decode_rate(_run(engine, [_request(p, new) for p in prompts])))
        bar.update(1)
    medians = {name: statistics.median(values) for name, values in runs.items()}

    from grammars import GrammarCompiler  # noqa: F401 - the stack's compiler

    grammar = stack.compiler.compile_json_schema(SCHEMA)
    json_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "A story as JSON."}],
                                                add_generation_prompt=True, return_dict=True)["input_ids"]
    timer, masker = _StepTimes(engine), stack.masker
    masker.calls.clear()
    masker.on = timer.on = True
    _run(engine, [_request(json_prompt, new, grammar.matcher()) for _ in range(8)])
    masker.on = timer.on = False
    timer.remove()
    mask_share = sum(t for t, _ in masker.calls) / sum(timer.seconds)
    bar.update(1)

    fid = fidelity(ctx, bar)
    where, gguf = stack.loaded.spec.locate()
    empty = {"seconds": float("nan"), "rss_mb": float("nan")}
    start_now = start_before = empty  # the test's --tiny run starts no servers
    if not ctx.tiny:
        before = before_registry(ctx)
        try:
            start_now = serve(ctx, [], ctx.models)
            bar.update(1)
            start_before = serve(ctx, ["--no-compile"], before)
            bar.update(1)
        finally:
            os.unlink(before)
    llama_rss = llama_rss_mb(f"{where}/{gguf}") if llama is not None and gguf and not ctx.tiny else None
    bar.update(1)
    bar.close()
    if llama is not None:
        llama.close()

    def ratio(a, b):
        return medians[a] / medians[b] if a in medians and b in medians else None
    ratios = {"decode batch 1: maskd / llama-cpp-python": ratio("maskd decode, batch 1", "llama-cpp-python decode, batch 1"),
              f"prefill {prefill}: maskd / llama-cpp-python": ratio(f"maskd prefill, {prefill} tokens",
                                                                  f"llama-cpp-python prefill, {prefill} tokens"),
              "8 concurrent / batch 1 (maskd)": ratio("maskd decode, 8 concurrent (aggregate)", "maskd decode, batch 1"),
              "mask share of an 8-way constrained step": mask_share,
              "startup until /health: now / float32 eager": start_now["seconds"] / start_before["seconds"],
              "resident memory: maskd / llama-cpp-python": start_now["rss_mb"] / llama_rss if llama_rss else None}
    flags = [f for f in ("avx512f", "avx512_bf16", "amx_tile", "avx512_vnni")
             if f in Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0]] if Path("/proc/cpuinfo").exists() else []
    table = {"title": f"Engine speed ({stack.loaded.name}, {stack.loaded.precision.describe()}; CPU flags: "
                      f"{', '.join(flags) or 'n/a'}; {rounds} interleaved rounds)",
             "columns": ["measure", "median", "min", "max"],
             "rows": [[name, f"{medians[name]:.1f}", f"{min(v):.1f}", f"{max(v):.1f}"] for name, v in runs.items()]}
    fid_table = {"title": f"Fidelity against float32 (perplexity over {TEXT.name}; first 16 greedy tokens on "
                          f"{fid['prompts']} chat prompts)",
                 "columns": ["precision", "perplexity", "x float32", "greedy equal"],
                 "rows": [[r["precision"], f"{r['perplexity']:.3f}", f"{r['x float32']:.4f}",
                           f"{r['greedy equal']:.0%}"] for r in fid["rows"]]}
    start_table = {"title": "`maskd serve` until /health, and resident memory after one request",
                   "columns": ["server", "seconds", "resident MB"],
                   "rows": [["maskd serve (auto precision, compiled step)", f"{start_now['seconds']:.1f}",
                             f"{start_now['rss_mb']:.0f}"],
                            ["maskd serve, float32 eager (the engine before)", f"{start_before['seconds']:.1f}",
                             f"{start_before['rss_mb']:.0f}"],
                            ["llama-cpp-python, same GGUF", "-", f"{llama_rss:.0f}" if llama_rss else "-"]]}
    notes = [] if llama is not None else [f"llama-cpp-python not measured: {why}"]
    return {"runs": runs, "medians": medians, "ratios": ratios, "fidelity": fid, "startup": [start_now, start_before],
            "llama_rss_mb": llama_rss, "tables": [targets(ratios, fid), table, fid_table, start_table], "notes": notes}


def targets(ratios: dict, fid: dict) -> dict:
    """Issue 54's targets against this run's measures."""
    keys = list(ratios)
    bf16, auto = fid["rows"][1], fid["rows"][2]
    rows = [("batch-1 decode / llama-cpp-python", ">= 1.0", ratios[keys[0]], lambda v: v >= 1.0),
            ("prefill / llama-cpp-python", ">= 1.0", ratios[keys[1]], lambda v: v >= 1.0),
            ("8 concurrent / own batch 1", ">= 4.0", ratios[keys[2]], lambda v: v >= 4.0),
            ("mask share of an 8-way step", "<= 2%", ratios[keys[3]], lambda v: v <= 0.02),
            ("perplexity, bfloat16 matmuls / float32", "<= 1.03", bf16["x float32"], lambda v: v <= 1.03),
            ("perplexity, auto / float32", "<= 1.08", auto["x float32"], lambda v: v <= 1.08),
            ("greedy 16 tokens equal, bfloat16 matmuls", ">= 80%", bf16["greedy equal"], lambda v: v >= 0.8),
            ("startup until /health / float32 eager", "<= 2.0", ratios[keys[4]], lambda v: v <= 2.0),
            ("resident memory / llama-cpp-python", "<= 1.5", ratios[keys[5]], lambda v: v <= 1.5)]
    return {"title": "Issue 54's targets in this run",
            "columns": ["target", "bound", "measured", "met"],
            "rows": [[name, bound, "-" if value is None or value != value else f"{value:.3g}",
                      "-" if value is None or value != value else ("yes" if ok(value) else "no")]
                     for name, bound, value, ok in rows]}


class _StepTimes:
    """The engine's step times while `on` (wraps the instance's step)."""

    def __init__(self, engine) -> None:
        self.engine, self.inner, self.on, self.seconds = engine, engine.step, False, []
        engine.step = self

    def __call__(self) -> None:
        started = time.perf_counter()
        self.inner()
        if self.on:
            self.seconds.append(time.perf_counter() - started)

    def remove(self) -> None:
        self.engine.step = self.inner


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    with figure(path) as ax:
        names = list(result["medians"])
        ax.barh(range(len(names)), [result["medians"][n] for n in names])
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel("tokens/s (median)")
        ax.set_title("maskd vs llama-cpp-python, same GGUF and cores", fontsize=9)

"""Suite `overhead`: what the mask costs in decoding, on the same prompt, model and run.

Rates are decode tokens/s after each run's first step (maskd: timed on the engine thread;
generate(): less a one-token generate()): the prefill (cached or not) and the output's length
(the JSON closes earlier than the free text runs) do not weigh in.

Interleaved rounds of: transformers' generate() (unconstrained, the reference), maskd unconstrained
(ignore_eos, so it writes all its tokens), maskd under a JSON schema whose string fields leave the
model room to write (mask filled and applied every step, forced text fed without sampling), and,
where SamplingParams has `forced_extend`, the constrained run again with it off. Machine noise hits
every contender alike; the verdicts are ratios of medians. Also: each masked step's mask time (the
engine's ConstraintMasker, timed in the hook), the mask's share of the constrained steps' time,
and forward passes per generated token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time

from server.bench.context import BenchContext
from server.bench.stats import pct

PROMPT = "Describe a fictional city as JSON, with a long history."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "history": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["name", "history", "population"], "additionalProperties": False}


def has_forced_extend() -> bool:
    from engine.sampling import SamplingParams

    return "forced_extend" in {f.name for f in dataclasses.fields(SamplingParams)}


def peers_note() -> str:
    """What this suite says of the constrained-decoding peers: it times transformers' generate()
    unconstrained only; the peers' constrained decoding is measured in `budget` (xgrammar, outlines)
    and their masks in `compile` (xgrammar, llguidance)."""
    import importlib.util

    installed = {name: importlib.util.find_spec(module) is not None for name, module in
                 (("xgrammar", "xgrammar"), ("outlines", "outlines"), ("llguidance", "llguidance"),
                  ("llama-cpp-python", "llama_cpp"))}
    missing = [name for name, found in installed.items() if not found]
    present = [name for name, found in installed.items() if found]
    return ("Peers: transformers' generate() (unconstrained) is timed here; xgrammar's and outlines' constrained "
            "decoding is compared in `budget`, xgrammar's and llguidance's masks in `compile`; llama-cpp-python "
            "has no runner in this bench. "
            + (f"Not installed, so skipped everywhere: {', '.join(missing)}. " if missing else "")
            + (f"Installed: {', '.join(present)}." if present else "")).rstrip()


def hf_generate(loaded, prompt_ids: list[int], tokens: int) -> tuple[float, int]:
    """Decode tokens/s of generate() after the first token (a one-token generate() times the
    prefill and first token, taken off), and the tokens made."""
    import torch

    ids = torch.tensor([prompt_ids], device=loaded.device)  # [1, P]

    def timed(n: int) -> tuple[float, int]:
        started = time.perf_counter()
        with torch.inference_mode():
            out = loaded.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                        attention_mask=torch.ones_like(ids))  # [1, P + n]
        return time.perf_counter() - started, out.shape[1] - ids.shape[1]

    first, _ = timed(1)
    elapsed, count = timed(tokens)
    return (count - 1) / max(elapsed - first, 1e-9), count


def engine_run(engine, request) -> tuple[int, int]:
    """Runs one request through the engine: its completion tokens, and how many its first event
    (its first step) reported."""
    async def run() -> tuple[int, int]:
        first, last = None, None
        async for last in engine.generate(request):
            if first is None:
                first = last.completion_tokens
        return first, last.completion_tokens
    first, count = asyncio.run(run())
    return count, first


def decode_rate(count: int, first: int, ends: list[float]) -> float:
    """Tokens/s after the first step: the tokens made after it over the time from its end to the
    last step's end (engine-thread clocks, so a late wake-up of the client counts for nothing)."""
    if len(ends) < 2 or count <= first:
        return float("nan")
    return (count - first) / (ends[-1] - ends[0])


class StepTimer:
    """Times the engine's steps while `on` (wraps the instance's step; the loop calls self.step)."""

    def __init__(self, engine) -> None:
        self.engine, self.inner, self.on, self.seconds, self.ends = engine, engine.step, False, [], []
        engine.step = self

    def __call__(self) -> None:
        started = time.perf_counter()
        self.inner()
        if self.on:
            ended = time.perf_counter()
            self.seconds.append(ended - started)
            self.ends.append(ended)

    def remove(self) -> None:
        self.engine.step = self.inner


def run(ctx: BenchContext, progress) -> dict:
    from engine.sampling import SamplingParams
    from engine.sequence import Request

    stack = ctx.stack()
    loaded, engine, masker, tok = stack.loaded, stack.engine, stack.masker, stack.loaded.tokenizer
    sizes = ctx.sizes
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
    grammar = stack.compiler.compile_json_schema(SCHEMA)
    forced_modes = [True, False] if has_forced_extend() else [None]

    def free() -> Request:
        return Request(prompt_ids=prompt, params=SamplingParams(max_tokens=sizes.tokens, temperature=0,
                                                                ignore_eos=True))

    def constrained(forced: bool | None):
        def make() -> Request:
            extra = {} if forced is None else {"forced_extend": forced}
            return Request(prompt_ids=prompt, constraint=grammar.matcher(),
                           params=SamplingParams(max_tokens=sizes.tokens, temperature=0, **extra))
        return make

    contenders = {"maskd unconstrained": free}
    for forced in forced_modes:
        name = "maskd json_schema" + ("" if forced in (None, True) else " (forced_extend off)")
        contenders[name] = constrained(forced)
    runs = {"transformers.generate": [], **{name: [] for name in contenders}}
    counts = {name: [] for name in runs}
    passes = {name: [] for name in contenders}
    hf_generate(loaded, prompt, 4)  # warm-up of every path (mask states memoised as in serving)
    for make in contenders.values():
        engine_run(engine, make())
    timer = StepTimer(engine)
    mask_us, step_s, mask_s = [], [], []
    bar = progress("overhead", sizes.rounds * len(runs))
    try:
        for _ in range(sizes.rounds):
            rate, count = hf_generate(loaded, prompt, sizes.tokens)
            runs["transformers.generate"].append(rate)
            counts["transformers.generate"].append(count)
            bar.update()
            for name, make in contenders.items():
                constrained_run = name != "maskd unconstrained"
                before = engine.runner.forward_passes
                masker.calls.clear()
                timer.seconds.clear()
                timer.ends.clear()
                masker.on, timer.on = constrained_run, True
                count, first = engine_run(engine, make())
                masker.on = timer.on = False
                runs[name].append(decode_rate(count, first, timer.ends))
                counts[name].append(count)
                passes[name].append((engine.runner.forward_passes - before) / max(count, 1))
                if constrained_run and name == "maskd json_schema":
                    mask_us += [seconds / rows * 1e6 for seconds, rows in masker.calls]
                    mask_s.append(sum(seconds for seconds, _ in masker.calls))
                    step_s += timer.seconds
                bar.update()
    finally:
        timer.remove()
        bar.close()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    ratios = {"constrained / unconstrained (maskd)": medians["maskd json_schema"] / medians["maskd unconstrained"],
              "maskd / transformers.generate (unconstrained)":
                  medians["maskd unconstrained"] / medians["transformers.generate"]}
    off = "maskd json_schema (forced_extend off)"
    if off in medians:
        ratios["forced text on / off (constrained tokens/s)"] = medians["maskd json_schema"] / medians[off]
    share = sum(mask_s) / sum(step_s) if sum(step_s) else None
    notes = [peers_note()]
    if forced_modes == [None]:
        notes.append("This maskd has no `forced_extend` switch (SamplingParams), so forced text runs only in "
                     "its built-in mode (forced tokens appended without sampling); the on/off comparison is "
                     "not measured.")
    rows = [[name, f"{medians[name]:.1f}", f"{min(values):.1f}", f"{max(values):.1f}",
             f"{statistics.median(counts[name]):.0f}",
             f"{statistics.median(passes[name]):.3f}" if name in passes else "-"]
            for name, values in runs.items()]
    mask_rows = [["per-token mask time (µs)", f"{pct(mask_us, 0.5):.1f}", f"{pct(mask_us, 0.9):.1f}",
                  f"{pct(mask_us, 0.99):.1f}", str(len(mask_us))]] if mask_us else []
    return {
        "model": loaded.name, "device": str(loaded.device), "dtype": str(loaded.dtype),
        "prompt_tokens": len(prompt), "max_tokens": sizes.tokens, "rounds": sizes.rounds,
        "forced_extend_measured": forced_modes != [None],
        "runs_tok_s": runs, "tokens": counts, "median_tok_s": medians, "forward_passes_per_token": passes,
        "mask_us": mask_us, "mask_share_of_step": share, "ratios": ratios, "notes": notes,
        "tables": [
            {"title": f"Decode speed ({loaded.name} on {loaded.device}, prompt {len(prompt)} tokens, up to "
                      f"{sizes.tokens} new tokens, {sizes.rounds} interleaved rounds)",
             "columns": ["decoding", "median decode tok/s", "min", "max", "tokens", "forward passes / token"],
             "rows": rows},
            {"title": "Mask cost in the engine (constrained runs)",
             "columns": ["measure", "p50", "p90", "p99", "n"],
             "rows": mask_rows + [["mask share of step time", f"{share:.1%}" if share is not None else "-",
                                   "", "", f"{len(step_s)} steps"]]},
        ],
    }


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    with figure(path, 2) as (ax1, ax2):
        for name, values in result["runs_tok_s"].items():
            ax1.plot(range(1, len(values) + 1), values, marker="o", label=name)
        rounds = range(1, len(next(iter(result["runs_tok_s"].values()))) + 1)
        ax1.set_xticks(list(rounds)), ax1.set_xlabel("round"), ax1.set_ylabel("decode tokens/s"), ax1.set_ylim(bottom=0)
        ax1.legend(fontsize=7)
        ratio = result["ratios"]["constrained / unconstrained (maskd)"]
        ax1.set_title(f"constrained / unconstrained = {ratio:.2f}", fontsize=9)
        if result["mask_us"]:
            import numpy as np

            low, high = max(min(result["mask_us"]), 1e-3), max(result["mask_us"])
            ax2.hist(result["mask_us"], bins=np.geomspace(low, high * 1.01, 30))
            ax2.set_xscale("log")
        ax2.set_xlabel("mask time per token (µs)"), ax2.set_ylabel("steps")
        share = result["mask_share_of_step"]
        ax2.set_title("mask share of step time: " + (f"{share:.1%}" if share is not None else "-"), fontsize=9)

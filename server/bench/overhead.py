"""Suite `overhead`: what the mask costs in decoding, on the same prompt, model and run, beside the peers.

Rates are decode tokens/s after each run's first step, counted per step: maskd's engine steps are
timed on the engine thread and each step is credited with the tokens it appended (a sampled token
and the forced text after it arrive in the same step, so forced tokens count where they were made,
never as if generated later); a peer's steps are timed when each step's logits arrive (StepClock)
or when llama.cpp yields each token. The prefill (cached or not) and the output's length (the JSON
closes earlier than the free text runs) do not weigh in.

Interleaved rounds of: transformers' generate() (unconstrained, the reference), maskd unconstrained
(ignore_eos, so it writes all its tokens), maskd under a JSON schema whose string fields leave the
model room to write (mask filled and applied every step, forced text fed without sampling), and,
where SamplingParams has `forced_extend`, the constrained run again with it off; then each
installed peer under the same schema (server/bench/peers.py): generate() with xgrammar's, outlines'
and llguidance's logits processors on maskd's model object, and llama-cpp-python on the same GGUF,
unconstrained and with its schema grammar. Machine noise hits every contender alike; the verdicts
are ratios of medians. Also: each masked step's mask time (the engine's ConstraintMasker, timed in
the hook), the mask's share of the constrained steps' time, and forward passes per generated token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time

from server.bench.context import BenchContext
from server.bench.peers import HFPeer, Peers, decode_rate
from server.bench.stats import pct

PROMPT = "Describe a fictional city as JSON, with a long history."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "history": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["name", "history", "population"], "additionalProperties": False}
REFERENCE, MASKD_FREE, MASKD = "transformers.generate", "maskd unconstrained", "maskd json_schema"
LLAMA_FREE, LLAMA = "llama-cpp-python unconstrained", "llama-cpp-python grammar"


def has_forced_extend() -> bool:
    from engine.sampling import SamplingParams

    return "forced_extend" in {f.name for f in dataclasses.fields(SamplingParams)}


def engine_run(engine, request) -> int:
    """Runs one request through the engine; its completion tokens."""
    async def run() -> int:
        last = None
        async for last in engine.generate(request):
            pass
        return last.completion_tokens
    return asyncio.run(run())


class StepTimer:
    """Times the engine's steps while `on` (wraps the instance's step; the loop calls self.step): each
    step's end and the tokens the requests in it gained in it (sampled and forced alike)."""

    def __init__(self, engine, clock=time.perf_counter) -> None:
        self.engine, self.inner, self.clock, self.on = engine, engine.step, clock, False
        self.seconds, self.ends, self.gained = [], [], []
        engine.step = self

    def clear(self) -> None:
        for kept in (self.seconds, self.ends, self.gained):
            kept.clear()

    def __call__(self) -> None:
        seqs = self.engine.scheduler.running + list(self.engine.scheduler.waiting)
        before = sum(len(seq.output_ids) for seq in seqs)
        started = self.clock()
        self.inner()
        if self.on:
            ended = self.clock()
            self.seconds.append(ended - started)
            self.ends.append(ended)
            self.gained.append(sum(len(seq.output_ids) for seq in seqs) - before)

    def rate(self) -> float:
        """Tokens/s after the first step that made a token: the tokens the later steps made over the
        time from its end to the last step's end."""
        first = next((i for i, n in enumerate(self.gained) if n), None)
        if first is None or self.ends[-1] <= self.ends[first]:
            return float("nan")
        return sum(self.gained[first + 1:]) / (self.ends[-1] - self.ends[first])

    def remove(self) -> None:
        self.engine.step = self.inner


def peer_contenders(peers: Peers, prompt: list[int], tokens: int) -> dict:
    """name -> a run returning (tokens/s, tokens): generate() unconstrained (the reference) and with
    each peer's processor; llama.cpp unconstrained and with its grammar. A peer that refuses the
    schema is left out (noted)."""
    made = peers.compile(SCHEMA)

    def runner(name, grammar, ignore_eos=False):
        def run() -> tuple[float, int]:
            ids, times = peers.generate(name, grammar, prompt, tokens, ignore_eos)
            return decode_rate(times), len(ids)
        return run

    out = {}
    for name, grammar in made.items():
        if isinstance(grammar, str):
            peers.skipped[name] = grammar
        elif name == "llama-cpp-python":
            out[LLAMA_FREE], out[LLAMA] = runner(name, None, True), runner(name, grammar)
        else:
            out[f"transformers + {name}"] = runner(name, grammar)
    return out


def ratio_rows(medians: dict) -> dict:
    """Each contender over its own unconstrained run (maskd's, generate()'s, llama.cpp's) and maskd's
    constrained run over each peer's: all medians of the same interleaved rounds."""
    out = {"constrained / unconstrained (maskd)": medians[MASKD] / medians[MASKD_FREE],
           "maskd / transformers.generate (unconstrained)": medians[MASKD_FREE] / medians[REFERENCE]}
    off = MASKD + " (forced_extend off)"
    if off in medians:
        out["constrained, forced_extend off / unconstrained (maskd)"] = medians[off] / medians[MASKD_FREE]
        out["forced text on / off (constrained tokens/s)"] = medians[MASKD] / medians[off]
    for name in [n for n in medians if n.startswith("transformers + ")]:
        out[f"{name} / transformers.generate (unconstrained)"] = medians[name] / medians[REFERENCE]
        out[f"maskd json_schema / {name}"] = medians[MASKD] / medians[name]
    if LLAMA in medians:
        out["llama-cpp-python grammar / its unconstrained"] = medians[LLAMA] / medians[LLAMA_FREE]
        out["maskd json_schema / llama-cpp-python grammar"] = medians[MASKD] / medians[LLAMA]
    return out


def own_baseline(name: str) -> str:
    return MASKD_FREE if name.startswith("maskd") else LLAMA_FREE if name.startswith("llama") else REFERENCE


def run(ctx: BenchContext, progress, no_peers: bool = False) -> dict:
    from engine.sampling import SamplingParams
    from engine.sequence import Request

    stack = ctx.stack()
    loaded, engine, masker, tok = stack.loaded, stack.engine, stack.masker, stack.loaded.tokenizer
    sizes = ctx.sizes
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
    grammar = stack.compiler.compile_json_schema(SCHEMA)
    forced_modes = [True, False] if has_forced_extend() else [None]
    mask_us, step_s, mask_s, passes = [], [], [], {}

    def maskd(name: str, constraint, **params):
        def go() -> tuple[float, int]:
            request = Request(prompt_ids=prompt, constraint=constraint() if constraint else None,
                              params=SamplingParams(max_tokens=sizes.tokens, temperature=0, **params))
            before = engine.runner.forward_passes
            masker.calls.clear()
            timer.clear()
            masker.on, timer.on = constraint is not None, True
            try:
                count = engine_run(engine, request)
            finally:
                masker.on = timer.on = False
            passes.setdefault(name, []).append((engine.runner.forward_passes - before) / max(count, 1))
            if name == MASKD:
                mask_us.extend(seconds / rows * 1e6 for seconds, rows in masker.calls)
                mask_s.append(sum(seconds for seconds, _ in masker.calls))
                step_s.extend(timer.seconds)
            return timer.rate(), count
        return go

    transformers = HFPeer(stack)

    def reference() -> tuple[float, int]:
        ids, times = transformers.generate(None, prompt, sizes.tokens, ignore_eos=True)
        return decode_rate(times), len(ids)

    contenders = {REFERENCE: reference, MASKD_FREE: maskd(MASKD_FREE, None, ignore_eos=True)}
    for forced in forced_modes:
        name = MASKD + ("" if forced in (None, True) else " (forced_extend off)")
        contenders[name] = maskd(name, grammar.matcher, **({} if forced is None else {"forced_extend": forced}))
    peers = None if no_peers else Peers(stack)
    timer = StepTimer(engine)
    contenders.update(peer_contenders(peers, prompt, sizes.tokens) if peers else {})
    runs, counts = {name: [] for name in contenders}, {name: [] for name in contenders}
    bar = progress("overhead", (sizes.rounds + 1) * len(contenders))
    try:
        for round_ in range(sizes.rounds + 1):  # round 0 warms every path up (maskd's mask states memoised)
            for name, go in contenders.items():
                rate, count = go()
                if round_:
                    runs[name].append(rate)
                    counts[name].append(count)
                bar.update()
            if not round_:
                for kept in (mask_us, mask_s, step_s, *passes.values()):
                    kept.clear()
    finally:
        timer.remove()
        bar.close()
        if peers:
            peers.close()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    share = sum(mask_s) / sum(step_s) if sum(step_s) else None
    skipped = peers.skipped if peers else {}
    notes = [f"{name}: skipped ({why})." for name, why in skipped.items()]
    notes.append("Constrained runs stop where the JSON closes, unconstrained ones write all their tokens. A mask "
                 "that costs little beside a forward pass (the compile suite's per-token table) leaves a ratio "
                 "near 1, and one within the rounds' min-max spread is noise, not a gain.")
    if LLAMA in medians:
        notes.append("llama-cpp-python runs the GGUF's quantized weights with its own kernels (maskd and "
                     "generate() run them dequantized in torch): its grammar / unconstrained ratio is the like-"
                     "for-like one.")
    if forced_modes == [None]:
        notes.append("This maskd has no `forced_extend` switch (SamplingParams), so forced text runs only in "
                     "its built-in mode (forced tokens appended without sampling); the on/off comparison is "
                     "not measured.")
    rows = [[name, f"{medians[name]:.1f}", f"{min(values):.1f}", f"{max(values):.1f}",
             f"{statistics.median(counts[name]):.0f}",
             f"{statistics.median(passes[name]):.3f}" if name in passes else "-",
             f"{medians[name] / medians[own_baseline(name)]:.2f}"]
            for name, values in runs.items()]
    rows += [[name, "skipped", "-", "-", "-", "-", "-"] for name in skipped]
    mask_rows = [["per-token mask time (µs)", f"{pct(mask_us, 0.5):.1f}", f"{pct(mask_us, 0.9):.1f}",
                  f"{pct(mask_us, 0.99):.1f}", str(len(mask_us))]] if mask_us else []
    return {
        "model": loaded.name, "device": str(loaded.device), "dtype": str(loaded.dtype),
        "prompt_tokens": len(prompt), "max_tokens": sizes.tokens, "rounds": sizes.rounds,
        "forced_extend_measured": forced_modes != [None], "peers_skipped": skipped,
        "runs_tok_s": runs, "tokens": counts, "median_tok_s": medians, "forward_passes_per_token": passes,
        "mask_us": mask_us, "mask_share_of_step": share, "ratios": ratio_rows(medians), "notes": notes,
        "tables": [
            {"title": f"Decode speed ({loaded.name} on {loaded.device}, prompt {len(prompt)} tokens, up to "
                      f"{sizes.tokens} new tokens, {sizes.rounds} interleaved rounds)",
             "columns": ["decoding", "median decode tok/s", "min", "max", "tokens", "forward passes / token",
                         "x own unconstrained"],
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

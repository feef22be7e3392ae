"""Per-token mask time over real generations: in the engine, and replayed as a GPU host would see it.

    python benchmarks/mask_bench.py [--stride 34] [--limit N] [--model NAME] [--cold-passes 3]
                                    [--out benchmarks/results/mask_bench.json]

The requests are naturalness_bench's (every --stride-th BFCL schema as tools with tool_choice
"required", 15 json_object and 15 free-form json_schema requests), through maskd's chat path as
`maskd serve` runs them (greedy, max_tokens 96, forced runs on), one at a time. A step's mask time
is what the engine spends on the mask of its one constrained row: the ConstraintMasker call (the
state's sparse id list or packed-bitmask fill and apply, the budget check included) and the
mask's part of the pick (engine/sampling.py settle()); the row's own argmax is the unconstrained
pick and is not counted. Five measures over the same steps:

  engine       timed in the engine's step, on the CPU right after the model's forward pass (whose
               weights have just streamed through every cache: a CPU server's figure), plus the
               masker's lookup of that step's mask ahead, after the previous step's tokens were
               appended (ConstraintMasker.ahead). Its three parts are shown apart: engine_ahead (the
               lookup ahead), engine_call (the masker's call after the pass) and engine_pick (the
               pick under the mask, engine/sampling.py settle()).
  host, cold   each request's generation replayed on a grammar compiled afresh and a JSON-value
               automaton made afresh (every state's first visit included), step by step with the
               engine's budgets, the masker and pick as in the engine, on random logits that favour
               the token the engine appended there, with no forward pass between (the host side of a
               GPU server, where the pass runs on the device). Each replayed pick must equal the
               engine's token (counted). The automaton's warm-up runs first, as `maskd serve` runs
               it before it listens; then the compiler sees the engine busy throughout, as it is
               while decoding: background warm-ups of masks wait (they neither take the GIL from the
               timed steps nor make their masks).
               Run --cold-passes times (3), each on a compiler and automaton made afresh, and
               pooled: one pass's p99 is its ninth-worst step or so, and this machine's speed swings.
  host, warm   the same replay again: the second request, whose states are memoised (budget-
               narrowed masks are made into id lists on their second ask, so here:
               grammars/masks/second_ask.py).
  host, later  the replay a third time: what every later request costs.
  host, ready  as host, cold (--cold-passes fresh compilers, pooled), but each request's grammars have
               had the engine idle before it decodes: the background has made their narrowed id
               lists ahead (grammars/match/narrowed_ahead.py), as for an agent's next turn, whose tools
               were compiled on an earlier turn and made ready between turns.

As in the engine's step, no garbage collection runs inside a timed step (engine/collector.py: one
that falls due there runs right after it), and before the replays the process's objects are frozen
as `maskd serve` freezes them before it listens; the collections of each pass are reported apart.

Prints a table, writes the JSON and a PNG of the distributions beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from naturalness_bench import generate, load_state, requests
from tool_bench import RESULTS

import engine.sampling as sampling
from engine.collector import freeze_startup, no_collection
from engine.sampling import SamplingParams
from grammars import GrammarCompiler
from grammars.json_value.json_value_cache import forget
from server import chat
from server.state import ServerState


class StepClock:
    """Wraps the engine's ConstraintMasker and settle(): per request, each masked step's (output
    position, token budget, µs of masker + pick, and of its parts: spent ahead, in the masker's call,
    in the pick). The masker's lookup ahead (ConstraintMasker.ahead, after the previous step's tokens
    were appended) counts in the step it was for."""

    def __init__(self, masker) -> None:
        self.masker, self.steps, self.seqs, self._last, self._ahead = masker, {}, {}, None, {}
        self._settle = sampling.settle
        sampling.settle = self.settle

    def ahead(self, seq) -> None:
        started = time.perf_counter()
        self.masker.ahead(seq)
        self._ahead[seq.request.request_id] = (time.perf_counter() - started) * 1e6

    def __call__(self, logits, seqs):
        started = time.perf_counter()
        narrowed = self.masker(logits, seqs)
        spent = (time.perf_counter() - started) * 1e6
        self._last = None
        for seq in seqs:
            if seq.constraint is not None:
                key = seq.request.request_id
                self.seqs[key] = seq
                ahead = self._ahead.pop(key, 0.0)
                self._last = [len(seq.output_ids), seq.tokens_left, spent + ahead, ahead, spent, 0.0]
                self.steps.setdefault(key, []).append(self._last)
        return narrowed

    def settle(self, logits, tokens, narrowed):
        started = time.perf_counter()
        out = self._settle(logits, tokens, narrowed)
        if self._last is not None:
            picked = (time.perf_counter() - started) * 1e6
            self._last[2] += picked
            self._last[5] += picked
        return out

    def remove(self) -> None:
        sampling.settle = self._settle


async def replay(constraint, steps: list, output: list[int], masker, vocab_size: int, seed: int) -> tuple[list, int]:
    """µs of masker + pick at each recorded step of one generation, and how many picks differ
    from the engine's token. Waits (untimed) where a unit is still compiling, as the engine does."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.empty(1, vocab_size)  # [1, V]
    seq = SimpleNamespace(constraint=constraint, tokens_left=None, params=SamplingParams(temperature=0.0))
    times, differ, at = [], 0, 0
    for position, budget, *_ in steps:
        for token in output[at:position]:
            await ready(constraint)
            constraint.advance(token)
        at = position
        await ready(constraint)
        logits.normal_(generator=gen)
        logits[0, output[position]] += 50.0
        seq.tokens_left = budget
        with no_collection():  # as in the engine's step: a collection due here runs after it (counted apart)
            started = time.perf_counter()
            narrowed = masker(logits, [seq])
            spent = time.perf_counter() - started
            plain = [0] if narrowed and narrowed[0].allowed else [int(logits.numpy()[0].argmax())]  # not timed
            started = time.perf_counter()
            token = sampling.settle(logits, plain, narrowed)[0]
            times.append((spent + time.perf_counter() - started) * 1e6)
        differ += token != output[position]
    return times, differ


async def ready(constraint) -> None:
    while hasattr(constraint, "ready") and not constraint.ready():
        await asyncio.sleep(0.002)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run(state: ServerState, todo, clock: StepClock) -> list[dict]:
    records = []
    for task, key, body in todo:
        before = set(clock.steps)
        await generate(state, body)
        new = [k for k in clock.steps if k not in before]
        records += [{"task": task, "key": key, "body": body, "steps": clock.steps[k],
                     "output": list(clock.seqs[k].output_ids)} for k in new]
        print(f"{task:12} {key[:28]:28} {sum(len(clock.steps[k]) for k in new):4} masked steps", flush=True)
    return records


class Collections:
    """The garbage collector's pauses during each replay pass (gc.callbacks): they run outside the
    timed masks and picks, as in the engine (engine/collector.py), and are reported apart."""

    def __init__(self) -> None:
        self.label, self.pauses, self._started = None, {}, 0.0
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict) -> None:
        if self.label is None:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.setdefault(self.label, []).append((info["generation"], (time.perf_counter() - self._started) * 1e6))

    def close(self) -> None:
        gc.callbacks.remove(self._seen)

    def summary(self) -> dict:
        return {label: {"collections": len(p), "by_generation": [sum(g == k for g, _ in p) for k in range(3)],
                        "total_us": sum(t for _, t in p), "max_us": max((t for _, t in p), default=0.0)}
                for label, p in self.pauses.items()}


def fresh_host(state: ServerState, cache_dir: str) -> tuple[GrammarCompiler, ServerState]:
    """A new compiler (empty caches) and a new JSON-value automaton, warmed and frozen as `maskd serve`
    warms and freezes them before it listens; then busy, as while the engine decodes."""
    forget(state.vocabulary)  # the generations (or the last cold pass) filled the shared automaton's memos
    fresh = GrammarCompiler(state.vocabulary, cache_dir=cache_dir, timeout_s=60.0, workers=1)
    fresh.json_automaton()
    fresh.drain()
    freeze_startup()
    fresh.set_engine_idle(lambda: False)  # warm-ups wait, as in `maskd serve` while it decodes
    return fresh, ServerState(state.model_name, state.tokenizer, state.context_length, state.tool_format,
                              state.engine, fresh, state.vocabulary)


LABELS = ("engine", "host_cold", "host_warm", "host_later", "host_ready")


async def replays(state: ServerState, records: list[dict], masker, label: str) -> None:
    for i, record in enumerate(records):
        prepared = await chat.prepare(state, record["body"])
        await prepared.settle()  # every tool unit compiled and attached (untimed)
        if label == "host_ready":  # the engine idles a while: the background's warm-ups run, then it decodes
            state.compiler.set_engine_idle(lambda: True)
            state.compiler.drain()
            state.compiler.set_engine_idle(lambda: False)
        times, differ = await replay(prepared.request.constraint, record["steps"], record["output"], masker,
                               state.vocabulary.size, i)
        record[label] = record.get(label, []) + times  # the cold passes pool
        record[f"{label}_differ"] = record.get(f"{label}_differ", 0) + differ


ENGINE_PARTS = {"engine": 2, "engine_ahead": 3, "engine_call": 4, "engine_pick": 5}  # a step's fields


def measured(record: dict, label: str) -> list[float]:
    """µs per masked step of one generation under a measure; "engine_ahead", "engine_call" and
    "engine_pick": the engine's parts (the lookup ahead, the masker's call, the pick; "engine" is
    their sum)."""
    if label in ENGINE_PARTS:
        return [step[ENGINE_PARTS[label]] for step in record["steps"]]
    return record[label]


def summarize(records: list[dict]) -> list[dict]:
    table = []
    for label in tuple(ENGINE_PARTS) + LABELS[1:]:
        for task in ("all", "tools", "json_object", "free_form"):
            rs = [r for r in records if task in ("all", r["task"])]
            values = [t for r in rs for t in measured(r, label)]
            table.append({"measure": label, "task": task, "n": len(values), "p50": pct(values, 0.5),
                          "p90": pct(values, 0.9), "p99": pct(values, 0.99), "max": max(values, default=float("nan")),
                          "picks_differ": sum(r.get(f"{label}_differ", 0) for r in rs)})
    return table


def plot(records: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label in LABELS:
        values = sorted(t for r in records for t in measured(r, label))
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
    ax.set_xscale("log"), ax.set_xlabel("µs per masked step (masker + pick)"), ax.set_ylabel("share of steps")
    for x in (25, 100):
        ax.axvline(x, color="grey", lw=0.8, ls="--")
    ax.set_title(title), ax.legend(), fig.tight_layout(), fig.savefig(path, dpi=100), plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stride", type=int, default=34, help="every k-th BFCL schema (default 34: 31 schemas)")
    parser.add_argument("--limit", type=int, default=None, help="at most N requests per task")
    parser.add_argument("--model", default=None, help="a models.yaml name (default: the embedded model)")
    parser.add_argument("--cold-passes", type=int, default=3,
                        help="cold replays, each on a compiler and automaton made afresh; pooled (default 3)")
    parser.add_argument("--out", type=Path, default=RESULTS / "mask_bench.json")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        state = load_state(first, 60.0, model=args.model)
        masker = state.engine.logits_hooks[0]
        clock = StepClock(masker)
        state.engine.logits_hooks[0] = clock
        try:
            records = asyncio.run(run(state, requests(state, args.stride, args.limit), clock))
        finally:
            clock.remove()
            state.engine.shutdown()
        state.compiler.drain()  # its warm-ups (the engine is idle now) end before the timed replays
        collections, fresh = Collections(), None
        try:
            fresh_passes = ["host_cold"] * args.cold_passes, ["host_ready"] * args.cold_passes
            for label in fresh_passes[0] + ["host_warm", "host_later"] + fresh_passes[1]:
                if label in ("host_cold", "host_ready"):  # a server started afresh: every grammar and the automaton new
                    collections.label = None  # its start-up is not a replay
                    if fresh is not None:
                        fresh.close()
                    fresh, host = fresh_host(state, tempfile.mkdtemp(dir=second))
                collections.label = label
                collections.pauses.setdefault(label, [])
                asyncio.run(replays(host, records, masker, label))
        finally:
            collections.close()
            if fresh is not None:
                fresh.close()
            state.compiler.close()
    table = summarize(records)
    print(f"\n{state.model_name}: µs per masked step (masker + pick), {len(records)} generations")
    print(f"{'measure':12} {'task':12} {'n':>6} {'p50':>7} {'p90':>7} {'p99':>8} {'max':>8} {'picks differ':>13}")
    for r in table:
        print(f"{r['measure']:12} {r['task']:12} {r['n']:6} {r['p50']:7.1f} {r['p90']:7.1f} {r['p99']:8.1f}"
              f" {r['max']:8.1f} {r['picks_differ']:13}")
    paused = collections.summary()
    for label, c in paused.items():
        print(f"garbage collections during {label} (outside the timed steps): {c['collections']} "
              f"(by generation {c['by_generation']}), {c['total_us'] / 1000:.1f} ms in all, longest {c['max_us']:.0f} µs")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for record in records:
        record["body"] = record["body"].model_dump(exclude_none=True, by_alias=True)
    args.out.write_text(__import__("json").dumps({"model": state.model_name, "stride": args.stride,
                                                  "summary": table, "collections": paused,
                                                  "records": records}, indent=1))
    plot(records, args.out.with_suffix(".png"), f"mask time per step, {state.model_name}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png').name}")


if __name__ == "__main__":
    main()

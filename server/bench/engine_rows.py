"""The engine stepped by hand for the `engine` suite (server/bench/engine_step.py): a Stepper that
times each step of an engine that is never started, and the two measures of rows coming and
going: a long prompt arriving while 7 rows decode (prefill interference) and the soak under a KV
budget below the prompts' sum."""

from __future__ import annotations

import random
import statistics
import time

from server.bench.stats import pct


def bench_engine(loaded, **kwargs):
    from engine.constraint_hook import ConstraintMasker
    from engine.engine import Engine

    kwargs.setdefault("max_batch", 8)
    return Engine(loaded.model, loaded.tokenizer, loaded.device, loaded.eos_token_ids, loaded.context_length,
                  logits_hooks=[ConstraintMasker(loaded.vocab_size, kwargs["max_batch"])], **kwargs)


class Stepper:
    """An engine stepped from this thread (never started): each step timed, its events collected."""

    def __init__(self, engine) -> None:
        self.engine, self.events, self.finished = engine, {}, {}

    def submit(self, prompt: list[int], max_tokens: int):
        from engine.sampling import SamplingParams
        from engine.sequence import Request

        request = Request(prompt_ids=prompt, params=SamplingParams(max_tokens=max_tokens, temperature=0,
                                                                   ignore_eos=True))
        times = self.events[request.request_id] = []

        def emit(event) -> None:
            times.append(time.perf_counter())
            if event.finish_reason is not None:
                self.finished[request.request_id] = event.finish_reason
        request.emit = emit
        request.submitted_at = time.perf_counter()
        self.engine.submit(request)
        return request

    def step(self) -> float:
        started = time.perf_counter()
        self.engine._drain_inbox()
        self.engine.step()
        if self.engine.runner.device.type == "cuda":  # a prefill-only step has no host sync of its own
            import torch
            torch.cuda.synchronize(self.engine.runner.device)
        return time.perf_counter() - started

    def busy(self) -> bool:
        self.engine._drain_inbox()
        return bool(self.engine._running or self.engine._waiting)

    def decoding(self, rows: int) -> bool:
        s = self.engine.scheduler
        return len(s.rows) == rows and not s.prefilling and not s.waiting

    def until_decoding(self, rows: int, most_steps: int = 10_000) -> None:
        """Steps until `rows` rows decode together; raises if they never do (e.g. a KV budget that
        cannot hold them all), rather than looping forever."""
        for _ in range(most_steps):
            if self.decoding(rows):
                return
            self.step()
            if not self.busy():
                break
        raise RuntimeError(f"{rows} rows never decoded together (KV budget: "
                           f"{self.engine.scheduler.slots.budget_bytes >> 20} MiB)")


def random_prompts(vocab: int, lengths, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(n)] for n in lengths]


def prefill_interference(loaded, short: int, long: int, chunk: int, rounds: int) -> dict:
    """The long prompt alone (an engine with nothing else) and beside 7 decoding rows (another
    engine over the same model), stepped in lockstep: each chunk alone, then the same chunk in the
    rows' step, so that the machine's drift hits both alike. Each round first times the rows' steps
    without it. Times to first token are the sums of each engine's own steps."""
    prompts = random_prompts(loaded.vocab_size, [short] * 7 + [long], seed=7)
    alone = Stepper(bench_engine(loaded, prefix_cache_bytes=0, prefill_chunk=chunk))
    mixed = Stepper(bench_engine(loaded, prefix_cache_bytes=0, prefill_chunk=chunk))
    rows = [mixed.submit(p, max_tokens=96 * rounds) for p in prompts[:7]]  # enough to outlast the prefills
    mixed.until_decoding(7)
    before, chunk_times, during, ttft, ttft_alone, shares = [], [], [], [], [], []
    for _ in range(rounds):
        base = [mixed.step() for _ in range(8)]  # the rows' steps just before the prompt arrives
        before += base
        first, second = alone.submit(prompts[7], max_tokens=1), mixed.submit(prompts[7], max_tokens=1)
        chunks, steps = [], []
        while alone.busy() or not mixed.events[second.request_id]:
            if alone.busy():
                chunks.append(alone.step())
            if not mixed.events[second.request_id]:
                steps.append(mixed.step())
        assert alone.events[first.request_id], "the prompt alone gave no token"
        ttft_alone.append(sum(chunks))
        ttft.append(sum(steps))
        # the rows' extra wait in each step, over the time the same chunk took alone just before it
        # (later chunks attend over more of the prompt, so each is compared with its own)
        shares += [(step - statistics.median(base)) / chunk for step, chunk in zip(steps, chunks)]
        chunk_times += chunks
        during += steps
    for request in rows:
        mixed.engine.cancel(request.request_id)
    while mixed.busy():
        mixed.step()
    alone.engine.shutdown()
    mixed.engine.shutdown()
    return {"short": short, "long": long, "chunk": chunk, "rounds": rounds,
            "tbt_before_p50_ms": 1000 * pct(before, 0.5),
            "tbt_during_p50_ms": 1000 * pct(during, 0.5), "tbt_during_p99_ms": 1000 * pct(during, 0.99),
            "chunk_ms": 1000 * statistics.median(chunk_times), "ttft_s": statistics.median(ttft),
            "ttft_alone_s": statistics.median(ttft_alone), "ttft_ratio": statistics.median(ttft) / statistics.median(ttft_alone),
            "tbt_bound_ms": 1000 * (max(chunk_times) + pct(before, 0.99)),
            "delay_over_chunk_p50": pct(shares, 0.5), "delay_over_chunk_max": max(shares)}


def soak(loaded, lengths: list[int], budget_tokens: int, new_tokens: int) -> dict:
    from engine.engine import PromptTooLong
    from engine.slot_cache import KVShape

    shape = KVShape.probe(loaded.model, loaded.device)
    budget = budget_tokens * shape.bytes_per_token
    engine = bench_engine(loaded, prefix_cache_bytes=0, kv_cache_bytes=budget, prefill_chunk=512)
    stepper = Stepper(engine)
    refused, requests = [], []
    for prompt in random_prompts(loaded.vocab_size, lengths, seed=11):
        try:
            requests.append(stepper.submit(prompt, max_tokens=new_tokens))
        except PromptTooLong as exc:
            refused.append((len(prompt), str(exc)))
    peak, steps, most_rows = 0, 0, 0
    while stepper.busy():
        stepper.step()
        engine.check_integrity()  # slots, lengths, prefix locks; and the KV tensors within the budget
        peak = max(peak, engine.scheduler.slots.nbytes())
        most_rows = max(most_rows, engine.scheduler.num_running)
        steps += 1
    reasons = [stepper.finished.get(r.request_id) for r in requests]
    finished = sum(reason in ("stop", "length") for reason in reasons)  # errors and unfinished do not count
    engine.shutdown()
    return {"prompts": len(lengths), "prompt_tokens": sum(lengths), "budget_tokens": budget_tokens,
            "budget_bytes": budget, "peak_bytes": peak, "finished": finished, "submitted": len(requests),
            "refused": [n for n, _ in refused], "refusal": refused[0][1] if refused else None,
            "most_running": most_rows, "steps": steps}

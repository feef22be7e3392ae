"""The engine: a thread that admits requests, steps the running batch and reports each token."""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, AsyncIterator, Callable

import torch

from engine.collector import no_collection
from engine.kv_budget import PromptTooLong, default_kv_budget
from engine.logprobs import TokenLogprob, forced_logprob, step_logprobs
from engine.metrics import EngineMetrics
from engine.model_runner import ModelRunner
from engine.omp_team import engine_threads
from engine.penalties import apply_penalties
from engine.radix_cache import RadixCache
from engine.sampling import apply_logit_bias, sample
from engine.scheduler import QueueFull, Scheduler
from engine.sequence import Event, Request, Sequence
from engine.slot_cache import KVShape, MaskLayout, SlotCache
from engine.step_compiler import StepCompiler
from grammars.masks.sparse_mask import SparseMask

if TYPE_CHECKING:
    from grammars.masks.forced_text import ForcedText

log = logging.getLogger("maskd.engine")

# A logits hook sees the step's logits [B, V] and its rows, and edits the logits in place; it may
# return a new {row: SparseMask} for greedy rows whose mask it left unwritten (ConstraintMasker on
# CPU, as an engine/sampling.py Narrowed): sample() picks their tokens under those masks. A hook may
# also have ``ahead(seq)``, called once a constrained row's tokens of a step are appended and it goes
# on (ConstraintMasker: its next mask looked up then, not after the next forward pass).
LogitsHook = Callable[[torch.Tensor, list[Sequence]], "dict[int, SparseMask] | None"]


class Engine:
    def __init__(self, model, tokenizer, device: torch.device, eos_token_ids: frozenset[int],
                 context_length: int, max_batch: int = 8, logits_hooks: list[LogitsHook] | None = None,
                 prefill_chunk: int = 512, max_waiting: int = 64, prefix_cache_bytes: int = 0,
                 kv_cache_bytes: int | None = None, forced_extend: bool = True, leader=None,
                 decode_step: bool = True, compile_step: bool = False, compile_cache: str | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch ({max_batch}) must be >= 1")
        self.tokenizer = tokenizer
        # leader: rank 0 of a tensor-parallel model (engine/tensor_parallel.py), whose runner and
        # slot cache tell the other ranks what to repeat
        self.leader = leader
        # decode_step: passes of one token per row go through engine/decode_step.py; compile_step:
        # compiled here, before the engine serves (engine/step_compiler.py)
        self.runner = ModelRunner(model, device, decode=decode_step) if leader is None else leader.runner(model, device)
        shape = KVShape.probe(model, device)
        self.step_compiler = None
        if compile_step and getattr(self.runner, "decode", None) is not None:
            self.step_compiler = StepCompiler(self.runner.decode, shape.heads, shape.head_dims, shape.dtype, device,
                                              compile_cache)
            self.runner.compiler = self.step_compiler
            self.step_compiler.run()
        if kv_cache_bytes is None:
            kv_cache_bytes = default_kv_budget(device, shape, max_batch, context_length)
        args = (shape, MaskLayout.of(model.config), device, max_batch, context_length, kv_cache_bytes)
        slots = SlotCache(*args) if leader is None else leader.slot_cache(*args)
        self.eos_token_ids = eos_token_ids
        self.context_length = context_length
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self.logits_hooks = list(logits_hooks or [])
        # the text a constraint allows alone, in the tokenizer's split; set by whoever knows the
        # grammar vocabulary; used where forced runs are fed in one pass
        self.forced_text: ForcedText | None = None
        self.metrics = EngineMetrics()
        prefix_cache = RadixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.scheduler = Scheduler(self.runner, slots, prefill_chunk, prefix_cache, self.metrics, extend=forced_extend)
        self.metrics.watch(self.scheduler)
        self._inbox: queue.SimpleQueue[Request | int | Callable] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        self._by_id: dict[int, Sequence] = {}
        self._wake = threading.Event()
        self._stopping = False
        self.idle = True  # nothing to compute (read by the grammar compiler: background compiles run then)
        self._thread: threading.Thread | None = None

    # ---- called from any thread -------------------------------------------------------------
    def start(self) -> None:
        # Every torch op releases and retakes the GIL; while the event loop runs Python (requests,
        # chunks), each retake can wait a whole switch interval (5 ms by default), which turned a
        # 0.1 s decode step into seconds under load. A short interval bounds that wait.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self._thread = threading.Thread(target=self._loop, name="maskd-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)

    @property
    def _running(self) -> list[Sequence]:
        return self.scheduler.running

    @property
    def _waiting(self):
        return self.scheduler.waiting

    def check_room(self) -> None:
        """Raises QueueFull when max_waiting requests already wait for admission: the server calls it
        before rendering a prompt, so that turning a request away costs next to nothing."""
        if self._inbox.qsize() + len(self.scheduler.waiting) >= self.max_waiting:
            self.metrics.rejected.inc()
            raise QueueFull(f"{self.max_waiting} requests are already waiting; retry later or raise --max-waiting")

    def check_fits(self, prompt_tokens: int) -> None:
        """Raises PromptTooLong when a prompt of this many tokens can never run here (the server
        answers 400): its KV alone exceeds the KV budget or the context."""
        why = self.scheduler.never_fits(prompt_tokens)
        if why is not None:
            raise PromptTooLong(why)

    def submit(self, request: Request) -> None:
        """Queues request; raises QueueFull when max_waiting requests already wait for admission,
        PromptTooLong when it can never run."""
        self.check_fits(len(request.prompt_ids))
        with self._submit_lock:
            self.check_room()
            request.submitted_at = time.perf_counter()
            self._inbox.put(request)
        self._wake.set()

    def wake(self) -> None:
        """Something changed outside the engine (a request's grammar units are ready): look again."""
        self._wake.set()

    def cancel(self, request_id: int) -> None:
        self._inbox.put(request_id)
        self._wake.set()

    def check_integrity(self) -> None:
        """Asserts the scheduler's and prefix cache's invariants, on the engine thread if it runs."""
        if self._thread is not None and self._thread.is_alive():
            self.call(self.scheduler.check_integrity).result(timeout=60)
        else:
            self.scheduler.check_integrity()

    def call(self, fn: Callable[[], object]) -> Future:
        """Runs fn on the engine thread between steps (engine state is not thread-safe)."""
        future: Future = Future()
        self._inbox.put((fn, future))
        self._wake.set()
        return future

    def generate(self, request: Request) -> AsyncIterator[Event]:
        """Submits request now (QueueFull is raised here) and returns its events; closing the
        iterator early cancels the request."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        request.emit = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)
        self.submit(request)
        return self._events(request, events)

    async def _events(self, request: Request, events: asyncio.Queue) -> AsyncIterator[Event]:
        done = False
        try:
            while not done:
                event = await events.get()
                done = event.finish_reason is not None
                yield event
        finally:
            if not done:
                self.cancel(request.request_id)

    # ---- engine thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        engine_threads()
        while not self._stopping:
            self._drain_inbox()
            cancelled = any(s.cancelled for s in self._running + list(self._waiting))
            if self.leader is not None:
                self.leader.tick()  # the other ranks wait for rank 0's next word, within a timeout
            if not cancelled and not self.scheduler.has_work():  # idle, or only requests awaiting grammars
                self.idle = True  # background grammar compiles may take the cores now
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            self.idle = False
            try:
                self.step()
            except Exception as exc:  # a broken step fails its running requests, never the server
                log.exception("engine step failed")
                for seq in self._running:
                    self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")
        self.idle = True  # stopped: nothing to compute (a shutdown right after a step found it False)
        if self.leader is not None:
            self.leader.stop()

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Request):
                seq = Sequence(item, self.tokenizer, self.eos_token_ids, self.runner.device)
                self._by_id[item.request_id] = seq
                self.scheduler.add(seq)
            elif isinstance(item, tuple):  # (fn, future) from call()
                fn, future = item
                try:
                    future.set_result(fn())
                except Exception as exc:
                    future.set_exception(exc)
            elif item in self._by_id:
                self._by_id[item].cancelled = True

    @torch.inference_mode()
    def step(self) -> None:
        """One step: at most one chunk of newcomers' prompts, then a pass over every running row;
        each row fed all its pending tokens gets one sampled token. See engine/scheduler.py."""
        for seq in [s for s in self._running + list(self._waiting) if s.cancelled]:
            self._finish(seq, "cancelled")
        seqs, logits = self.scheduler.forward()
        while self.scheduler.failed:
            seq, why = self.scheduler.failed.pop()
            self._finish(seq, "error", error=why)
        if seqs:
            before = [len(seq.output_ids) for seq in seqs]
            self._advance(seqs, logits)
            gained = [len(seq.output_ids) - n for seq, n in zip(seqs, before)]
            # one token per row sampled; every other appended token was forced text
            self.metrics.stepped(seqs, time.perf_counter(), sum(gained), sum(max(g - 1, 0) for g in gained))

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """logits: [B, V], one row per seq. Samples, then appends each row's token."""
        for seq in seqs:
            seq.tokens_left = _tokens_left(seq)
        with no_collection():  # a collection due here runs after the pick (engine/collector.py)
            apply_logit_bias(logits, seqs)
            apply_penalties(logits, seqs)  # before the hooks: a masked token stays masked
            narrowed: dict[int, SparseMask] = {}
            for hook in self.logits_hooks:
                found = hook(logits, seqs)
                if isinstance(found, dict) and found:
                    if narrowed:
                        narrowed.update(found)  # the first hook's Narrowed.picker holds: these are its logits
                    else:
                        narrowed = found
            tokens = sample(logits, [s.params for s in seqs], [s.generator for s in seqs], narrowed)
            logprobs = step_logprobs(logits, seqs, tokens) or [None] * len(seqs)  # of the masked logits
        for seq, token, logprob in zip(seqs, tokens, logprobs):
            try:
                self._append(seq, token, logprob)
            except Exception as exc:  # e.g. a constraint that refuses its token: that request alone fails
                log.exception("request %s failed", seq.request.request_id)
                self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")
        self._ahead([seq for seq in seqs if seq.finish_reason is None and seq.constraint is not None])

    def _ahead(self, seqs: list[Sequence]) -> None:
        """The hooks' optional ``ahead(seq)``, for rows that go on: their next masks, while the
        constraints they read are still in the caches (ConstraintMasker.ahead)."""
        aheads = [hook.ahead for hook in self.logits_hooks if getattr(hook, "ahead", None) is not None]
        if not aheads:
            return
        with no_collection():
            for seq in seqs:
                seq.tokens_left = _tokens_left(seq)
                try:
                    for ahead in aheads:
                        ahead(seq)
                except Exception as exc:  # as a refused token: that request alone fails
                    log.exception("request %s failed", seq.request.request_id)
                    self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")

    def _append(self, seq: Sequence, token: int, logprob: TokenLogprob | None = None) -> None:
        """Appends the sampled token, then any tokens the constraint forces (jump-forward). Where a
        forced run follows, the sampled token and the run are split as the tokenizer splits them
        together (the token is replaced when the tokenizer merges it with the run; not with logprobs,
        which report the sampled token)."""
        k = seq.params.logprobs
        extend = self.scheduler.extend and seq.params.forced_extend and self.forced_text is not None
        run, walked = [token], False
        if extend and seq.constraint is not None and k is None and token not in seq.stop_token_ids:
            run = self.forced_text.joined(seq.constraint, token, _tokens_left(seq))
            walked = run == [token]  # nothing forced after the sampled token: no need to walk again
        for appended in run:
            if not self._append_one(seq, appended, logprob):
                return
        while seq.constraint is not None:
            forced = seq.constraint.forced()
            if not forced and extend and not walked:
                forced = self.forced_text(seq.constraint, _tokens_left(seq))  # text allowed alone, the tokenizer's split
            walked = False
            if not forced:
                return
            for forced_token in forced:
                certain = forced_logprob(forced_token, k) if k is not None else None
                if not self._append_one(seq, forced_token, certain):
                    return

    def _append_one(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> bool:
        """Appends one token and reports it; False once the request has finished."""
        seq.output_ids.append(token)
        seq.next_input.append(token)
        if seq.penalties is not None:
            seq.penalties.add(token)
        if seq.constraint is not None:
            seq.constraint.advance(token)
        text, reason = "", None
        free = seq.constraint is None or seq.constraint.free_text()  # stops never cut a constrained span
        if token in seq.stop_token_ids and (free or seq.constraint.is_terminated()):
            reason = "stop"
        elif free:
            text, stopped = seq.stops.feed(seq.detokenizer.add(token))
            if stopped:
                reason, seq.stop_string = "stop", seq.stops.matched
        else:
            text = seq.stops.flush() + seq.detokenizer.add(token)  # held text began no stop after all
        if reason is None:
            if seq.constraint is not None and seq.constraint.is_terminated():
                reason = "stop"
            elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= seq.capacity:
                closed = seq.constraint is not None and seq.constraint.closed()
                reason = "stop" if closed else "length"  # a structure closed by the budget is not cut
        logprobs = [logprob] if logprob is not None else None
        if reason is None:
            seq.request.emit(seq.event([token], text, logprobs=logprobs))
            return True
        text += seq.stops.flush()  # held text that turned out to start no stop string
        self._finish(seq, reason, token_ids=[token], text=text, logprobs=logprobs)
        return False

    def _finish(self, seq: Sequence, reason: str, token_ids: list[int] | None = None,
                text: str = "", error: str | None = None, logprobs: list[TokenLogprob] | None = None) -> None:
        seq.finish_reason = reason
        self._by_id.pop(seq.request.request_id, None)
        self.scheduler.release(seq, keep_kv=reason != "error")
        self.metrics.finished(seq, reason)
        seq.request.emit(seq.event(token_ids or [], text, error=error, logprobs=logprobs))


def _tokens_left(seq: Sequence) -> int:
    """Tokens the request may still generate: the smaller of max_tokens and the context left."""
    return min(seq.params.max_tokens - len(seq.output_ids), seq.capacity - seq.num_tokens)

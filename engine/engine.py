"""The engine: a thread that admits requests, steps the running batch and reports each token."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from typing import AsyncIterator, Callable

import torch

from engine.model_runner import ModelRunner
from engine.sampling import sample
from engine.sequence import Event, Request, Sequence

log = logging.getLogger("maskd.engine")

# A logits hook sees the step's logits [B, V] and its rows, and edits the logits in place.
LogitsHook = Callable[[torch.Tensor, list[Sequence]], None]


class Engine:
    def __init__(self, model, tokenizer, device: torch.device, eos_token_ids: frozenset[int],
                 context_length: int, max_batch: int = 8, logits_hooks: list[LogitsHook] | None = None):
        self.tokenizer = tokenizer
        self.runner = ModelRunner(model, device)
        self.eos_token_ids = eos_token_ids
        self.context_length = context_length
        self.max_batch = max_batch
        self.logits_hooks = list(logits_hooks or [])
        self._inbox: queue.SimpleQueue[Request | int] = queue.SimpleQueue()
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._by_id: dict[int, Sequence] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- called from any thread -------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="maskd-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=10)

    def submit(self, request: Request) -> None:
        self._inbox.put(request)
        self._wake.set()

    def cancel(self, request_id: int) -> None:
        self._inbox.put(request_id)
        self._wake.set()

    async def generate(self, request: Request) -> AsyncIterator[Event]:
        """Submits request and yields its events; leaving early cancels it."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        request.emit = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)
        self.submit(request)
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
        while not self._stopping:
            self._drain_inbox()
            if not self._running and not self._waiting:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                self.step()
            except Exception as exc:  # a broken step fails its requests, never the server
                log.exception("engine step failed")
                for seq in self._running + list(self._waiting):
                    self._finish(seq, "error", error=f"{type(exc).__name__}: {exc}")

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Request):
                seq = Sequence(item, self.tokenizer, self.eos_token_ids)
                self._by_id[item.request_id] = seq
                self._waiting.append(seq)
            elif item in self._by_id:
                self._by_id[item].cancelled = True

    @torch.inference_mode()
    def step(self) -> None:
        """Prefill one newcomer if there is room, else decode one token for every running row."""
        for seq in [s for s in self._running + list(self._waiting) if s.cancelled]:
            self._finish(seq, "cancelled")
        if self._waiting and len(self._running) < self.max_batch:
            seq = self._waiting.popleft()
            self._running.append(seq)
            self._advance([seq], self.runner.prefill(seq))
        elif self._running:
            self._advance(list(self._running), self.runner.decode(self._running))

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """logits: [B, V], one row per seq. Samples, then appends each row's token."""
        for hook in self.logits_hooks:
            hook(logits, seqs)
        tokens = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        for seq, token in zip(seqs, tokens):
            self._append(seq, token)

    def _append(self, seq: Sequence, token: int) -> None:
        """Appends the sampled token, then any tokens the constraint forces (jump-forward)."""
        if not self._append_one(seq, token):
            return
        while seq.constraint is not None:
            forced = seq.constraint.forced()
            if not forced:
                return
            for forced_token in forced:
                if not self._append_one(seq, forced_token):
                    return

    def _append_one(self, seq: Sequence, token: int) -> bool:
        """Appends one token and reports it; False once the request has finished."""
        seq.output_ids.append(token)
        seq.next_input.append(token)
        if seq.constraint is not None:
            seq.constraint.advance(token)
        text, reason = "", None
        if token in seq.stop_token_ids:
            reason = "stop"
        else:
            text, stopped = seq.stops.feed(seq.detokenizer.add(token))
            reason = "stop" if stopped else None
        if reason is None:
            if seq.constraint is not None and seq.constraint.is_terminated():
                reason = "stop"
            elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.context_length:
                reason = "length"
        if reason is None:
            seq.request.emit(seq.event([token], text))
            return True
        text += seq.stops.flush()  # held text that turned out to start no stop string
        self._finish(seq, reason, token_ids=[token], text=text)
        return False

    def _finish(self, seq: Sequence, reason: str, token_ids: list[int] | None = None,
                text: str = "", error: str | None = None) -> None:
        seq.finish_reason = reason
        if seq in self._running:
            self._running.remove(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        self._by_id.pop(seq.request.request_id, None)
        self.runner.release(seq)
        seq.request.emit(seq.event(token_ids or [], text, error=error))

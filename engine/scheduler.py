"""Scheduler: continuous batching with chunked prefill over a radix prefix cache.

Where a request is, from submission to its end:

    waiting --admit--> prefilling --last chunk--> joining --settle--> rows (the running batch)
                           |    ^
               not ready   v    | ready
                          parked

- admit: the prefix cache gives the longest cached prefix of the prompt (all but its last token,
  so at least one token is prefilled and yields logits); the request locks that path and starts
  from a copy of its KV. At most one request prefills at a time.
- forward: one step is at most `prefill_chunk` prompt tokens of the prefilling request, then one
  token for every row of the running batch in a single forward pass. A newcomer therefore stalls
  the running rows for one chunk per step, never for its whole prompt.
- when a prompt is done its KV is inserted into the prefix cache at once (other agents sharing
  the prefix hit it while this one decodes), and its first token is sampled in the same step as
  the rows' tokens: the step's logits are [rows..., newcomer] in that order.
- settle: after sampling, the newcomer joins the batch; rows released during the step leave it.
- parked: a request whose constraint is not ready (its grammar units still compile) is prefilled up
  to its last chunk and set aside with its KV; once ready it takes the prefill slot again, before
  any newcomer. Its first token thus waits for its grammar, and no one else does.
- release (finish, cancel, error): the row's prompt + output KV enters the prefix cache, its lock
  is dropped, its batch row is freed before the next forward pass.
"""

from __future__ import annotations

import logging
from collections import deque

import torch
from transformers import DynamicCache

from engine.batch_cache import BatchCache
from engine.kv_segment import KVSegment
from engine.model_runner import ModelRunner
from engine.radix_cache import RadixCache
from engine.sequence import Sequence

log = logging.getLogger("maskd.scheduler")


class QueueFull(RuntimeError):
    """The waiting queue holds max_waiting requests; the server answers 429."""


class Scheduler:
    def __init__(self, runner: ModelRunner, max_batch: int, prefill_chunk: int,
                 prefix_cache: RadixCache | None, metrics=None):
        if max_batch < 1 or prefill_chunk < 1:
            raise ValueError(f"max_batch ({max_batch}) and prefill_chunk ({prefill_chunk}) must be >= 1")
        self.runner = runner
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = prefix_cache
        self.metrics = metrics
        self.waiting: deque[Sequence] = deque()
        self.prefilling: Sequence | None = None
        self.joining: Sequence | None = None
        self.parked: list[Sequence] = []  # prefilled but for the last chunk; constraint not ready
        self.rows: list[Sequence] = []  # row i of self.batch
        self.batch = BatchCache(runner.device)
        self._leaving: set[int] = set()  # rows released during this step, dropped by _drop_left()

    @property
    def running(self) -> list[Sequence]:
        """Admitted and not finished: the batch rows, then the newcomer (if any)."""
        out = [s for i, s in enumerate(self.rows) if i not in self._leaving]
        return out + [s for s in (self.joining, self.prefilling) if s is not None] + self.parked

    @property
    def num_running(self) -> int:
        return (len(self.rows) - len(self._leaving) + (self.joining is not None) + (self.prefilling is not None)
                + len(self.parked))

    def has_work(self) -> bool:
        """Whether a forward pass would do something (parked requests alone wait for their grammar)."""
        room = len(self.rows) + len(self.parked) < self.max_batch
        return bool(self.rows or self.prefilling or self.joining or (self.waiting and room)
                    or any(_ready(s) for s in self.parked))

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    # ---- one step ---------------------------------------------------------------------------

    def forward(self) -> tuple[list[Sequence], torch.Tensor | None]:
        """Runs this step's forward passes; returns the rows that get a token and their logits [B, V]."""
        self._drop_left()
        if self.prefilling is None and len(self.rows) < self.max_batch:
            resumed = next((s for s in self.parked if _ready(s)), None)
            if resumed is not None:
                self.parked.remove(resumed)
                self.prefilling = resumed
            elif self.waiting and len(self.rows) + len(self.parked) < self.max_batch:
                self._admit(self.waiting.popleft())
        if self.prefilling is not None and len(self.prefilling.next_input) <= self.prefill_chunk \
                and not _ready(self.prefilling):
            self.parked.append(self.prefilling)  # its first token needs its grammar
            self.prefilling = None
        newcomer_logits = None
        if self.prefilling is not None:
            seq = self.prefilling
            chunk = seq.next_input[: self.prefill_chunk]
            logits = self.runner.prefill(seq.cache, chunk)  # [1, V]
            del seq.next_input[: len(chunk)]
            self._count_pass()
            if not seq.next_input:
                self.prefilling, self.joining, newcomer_logits = None, seq, logits
                self._cache_prompt(seq)
        seqs, parts = [], []
        if self.rows:
            # One token per row per pass. A row whose constraint forced several tokens (jump-forward)
            # feeds them one step at a time and is sampled again only after the last of them.
            ids, sampled = [], []
            for row, seq in enumerate(self.rows):
                ids.append(seq.next_input.pop(0))
                if not seq.next_input:
                    sampled.append(row)
            logits = self.runner.decode(self.batch, ids)  # [B, V]
            if len(sampled) < len(self.rows):
                logits = logits[sampled]  # [B', V]
            if sampled:
                parts.append(logits)
                seqs.extend(self.rows[row] for row in sampled)
            self._count_pass(len(self.rows))
        if newcomer_logits is not None:
            parts.append(newcomer_logits)
            seqs.append(self.joining)
        if not parts:
            return [], None
        return seqs, parts[0] if len(parts) == 1 else torch.cat(parts)  # [B(+1), V]

    def settle(self) -> None:
        """After the step's tokens were appended: the newcomer joins, released rows leave."""
        if self.joining is not None:
            seq, self.joining = self.joining, None
            self.rows.append(seq)
            self.batch.join(seq.cache)
            seq.cache = None  # its KV now lives in the batch
        self._drop_left()

    def _count_pass(self, batch_size: int = 0) -> None:
        if self.metrics is not None:
            self.metrics.forward_passes.inc()
            if batch_size:
                self.metrics.batch_size.observe(batch_size)

    # ---- admission and release --------------------------------------------------------------

    def _admit(self, seq: Sequence) -> None:
        prompt = seq.request.prompt_ids
        seq.cache = DynamicCache()
        if self.prefix_cache is not None:
            match = self.prefix_cache.match(prompt[:-1])
            self.prefix_cache.lock(match.node)
            seq.prefix_node = match.node
            if match.length:
                seq.cache = match.kv().to_cache()
                seq.cached_tokens = match.length
                del seq.next_input[: match.length]
        self.prefilling = seq
        if self.metrics is not None:
            self.metrics.admitted(seq)

    def _cache_prompt(self, seq: Sequence) -> None:
        """Insert the just-prefilled prompt and move the request's lock down to its end."""
        prompt = seq.request.prompt_ids
        self._insert(prompt, lambda start, end: KVSegment.from_cache(seq.cache, 0, start, end))
        if self.prefix_cache is not None:
            node = self.prefix_cache.find(prompt).node
            self.prefix_cache.lock(node)
            self.prefix_cache.unlock(seq.prefix_node)
            seq.prefix_node = node

    def _insert(self, tokens: list[int], kv) -> None:
        if self.prefix_cache is None:
            return
        try:
            self.prefix_cache.insert(tokens, kv)
        except (TypeError, ValueError) as exc:  # a cache layout the prefix cache cannot cut
            log.warning("prefix cache disabled: %s", exc)
            self._disable_prefix_cache()

    def _disable_prefix_cache(self) -> None:
        for seq in self.running:
            seq.prefix_node = None
        self.prefix_cache = None

    def release(self, seq: Sequence, keep_kv: bool = True) -> None:
        """Take seq out wherever it is; with keep_kv, its computed KV enters the prefix cache."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.parked:
            self.parked.remove(seq)
            seq.cache = None
        elif seq is self.prefilling or seq is self.joining:
            self.prefilling = None if seq is self.prefilling else self.prefilling
            self.joining = None if seq is self.joining else self.joining
            seq.cache = None
        elif seq in self.rows:
            row = self.rows.index(seq)
            if keep_kv and row not in self._leaving:
                tokens = (list(seq.request.prompt_ids) + seq.output_ids)[: self.batch.row_length(row)]
                self._insert(tokens, lambda start, end: self.batch.segment(row, start, end))
            self._leaving.add(row)
        if self.prefix_cache is not None and seq.prefix_node is not None:
            self.prefix_cache.unlock(seq.prefix_node)
        seq.prefix_node = None

    def _drop_left(self) -> None:
        if not self._leaving:
            return
        keep = [i for i in range(len(self.rows)) if i not in self._leaving]
        self.batch.keep(keep)
        self.rows = [self.rows[i] for i in keep]
        self._leaving.clear()

    def reset_batch(self) -> None:
        """After a failed step: the batch KV may be half-updated, so drop it (rows were released)."""
        self._drop_left()
        if not self.rows:
            self.batch = BatchCache(self.runner.device)

    # ---- checks -----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        self.batch.check_integrity()
        assert self.batch.batch_size == len(self.rows), f"{len(self.rows)} rows, batch KV of {self.batch.batch_size}"
        assert self.num_running <= self.max_batch, f"{self.num_running} running > max_batch {self.max_batch}"
        for row, seq in enumerate(self.rows):
            if row in self._leaving:
                continue
            assert seq.finish_reason is None, f"finished request {seq.request.request_id} still holds row {row}"
            pending = len(seq.next_input)
            assert self.batch.row_length(row) + pending == seq.num_tokens, (
                f"row {row}: {self.batch.row_length(row)} cached + {pending} pending != {seq.num_tokens} tokens")
        if self.prefix_cache is None:
            return
        self.prefix_cache.check_integrity()
        held = [s.prefix_node for s in self.running if s.prefix_node is not None and s.prefix_node.parent]
        locks = sum(c.lock_ref for c in self.prefix_cache.root.children.values())
        assert locks == len(held), f"prefix cache holds {locks} locks, running requests hold {len(held)}"


def _ready(seq: Sequence) -> bool:
    """Whether the request's constraint can mask its next token (optional `ready()`: units compiled)."""
    ready = getattr(seq.constraint, "ready", None)
    return ready is None or ready()

"""Scheduler: continuous batching with chunked prefill over a radix prefix cache and in-place KV.

Where a request is, from submission to its end:

    waiting --admit--> prefilling --all but its prompt's last token--> rows (the running batch)

- admit: the request reserves prompt + max_tokens tokens of KV (capped by the context, and by what
  the KV budget holds for one row alone) and takes a slot of the SlotCache; while the open rows'
  reservations leave no room for it within the budget it waits at the head of the queue. The prefix
  cache gives the longest cached prefix of the prompt but its last token, copied once into the
  slot; the request locks that path.
- a step is two passes. First a packed pass (engine/slot_attention.py) of at most `prefill_chunk`
  prompt tokens, shared in arrival order by the prefilling requests (a burst of short prompts
  prefills together), which only writes their KV; a newcomer thus adds one chunk's work to the
  running rows' step, never its whole prompt. Then the rows' pass (the DecodeStep where the model
  has one, engine/model_runner.py): each row feeds every token it has pending, its sampled token
  and the run the grammar forced after it (jump-forward), so a forced run costs one pass, not one
  per token. With forced extension off (server flag or request field) a row feeds one token per
  pass and is sampled again only after the last of its run.
- a prompt's last token is fed by the rows' pass, like every token whose logits are read: its
  arithmetic is the same whether the prompt before it was prefilled now or read from the prefix
  cache, so a greedy request gives the same tokens cold and warm. Once all but that token is in
  the slot, the request joins the rows and that prefix enters the prefix cache (other agents
  sharing it hit it while this one decodes).
- held: a row whose constraint is not ready (its grammar units still compile, or a name stage
  wrote its tool's literal and that unit still compiles, grammars/tools/name_stage.py) keeps its
  slot and its pending tokens, and is left out of the passes until it is ready; the others go on.
  A newcomer's first token thus waits for its grammar, and no one else does.
- release (finish, cancel, error): the row's prompt + output KV enters the prefix cache, its lock
  is dropped and its slot is free for the next admission; no other row moves.
"""

from __future__ import annotations

import logging
from collections import deque

import torch

from engine.model_runner import ModelRunner
from engine.radix_cache import RadixCache, common_prefix_len
from engine.sequence import Sequence
from engine.slot_cache import SlotCache

log = logging.getLogger("maskd.scheduler")

SHARED_PREFIX_WAIT = 32  # prompt tokens shared with one being prefilled that make a newcomer wait for its KV


class QueueFull(RuntimeError):
    """The waiting queue holds max_waiting requests; the server answers 429."""


class Scheduler:
    def __init__(self, runner: ModelRunner, slots: SlotCache, prefill_chunk: int,
                 prefix_cache: RadixCache | None, metrics=None, extend: bool = True):
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk ({prefill_chunk}) must be >= 1")
        self.runner = runner
        self.slots = slots
        self.max_batch = slots.num_slots
        self.prefill_chunk = prefill_chunk
        self.prefix_cache = prefix_cache
        self.metrics = metrics
        self.extend = extend  # feed a forced run in one pass (requests may still opt out)
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []  # admitted, prompts not done, in arrival order
        self.rows: list[Sequence] = []  # the running batch, in the order they joined
        self.failed: list[tuple[Sequence, str]] = []  # not admitted after all, and why: the engine ends them

    @property
    def running(self) -> list[Sequence]:
        """Admitted and not finished: the rows, then those prefilling."""
        return self.rows + self.prefilling

    @property
    def num_running(self) -> int:
        return len(self.rows) + len(self.prefilling)

    def has_work(self) -> bool:
        """Whether a forward pass would do something (held rows alone wait for their grammar)."""
        room = self.waiting and self.slots.admissible(self._reservation(self.waiting[0]))
        return bool(self.prefilling or room or any(_ready(s) for s in self.rows))

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def never_fits(self, prompt_tokens: int) -> str | None:
        """Why a prompt of this many tokens can never run (None if it can): its KV, plus one token,
        must fit the KV budget alone and the context."""
        most = self.slots.most_tokens_alone()
        if prompt_tokens + 1 <= most:
            return None
        mb = self.slots.budget_bytes / (1 << 20)
        return (f"the prompt has {prompt_tokens} tokens; the KV cache budget ({mb:.0f} MiB, --kv-cache-mb) "
                f"and the context ({self.slots.context_length}) leave room for {most - 1} prompt tokens at most")

    def _reservation(self, seq: Sequence) -> int:
        want = len(seq.request.prompt_ids) + seq.params.max_tokens
        return min(want, self.slots.most_tokens_alone())

    # ---- one step ---------------------------------------------------------------------------

    def forward(self) -> tuple[list[Sequence], torch.Tensor | None]:
        """Runs this step: a packed pass of at most prefill_chunk prompt tokens (their KV only), then
        one pass of the rows' tokens; returns the rows that get a token and their logits [B, V].
        Every token whose logits are read (a prompt's last, sampled and forced ones) goes through
        the rows' pass, so its arithmetic is the same whether the prompt before it was prefilled
        now or read from the prefix cache, and whoever else shares the step."""
        self._take_new()
        fed = self._prompt_chunks()
        if fed:
            self.runner.forward(self.slots, [seq.slot for seq, _ in fed], [chunk for _, chunk in fed], decode=False)
            self._count_pass()
            for seq, chunk in fed:
                del seq.next_input[: len(chunk)]
            self._join_prefilled()
        lo, run = self._decode_feeds()
        if not any(run):
            return [], None
        slots = list(range(lo, lo + len(run)))
        logits = self.runner.forward(self.slots, slots, run)  # [len(slots), V]
        self._count_pass(len(self.rows))
        seqs = [seq for seq in self.rows if not seq.next_input]  # sampled now (others feed more first)
        picks = [seq.slot - lo for seq in seqs]
        if not seqs:
            return [], None
        if picks != list(range(len(slots))):
            index = torch.tensor(picks, dtype=torch.long).to(logits.device, non_blocking=True)  # no wait for the device
            logits = logits.index_select(0, index)
        return seqs, logits  # [B', V]

    def _take_new(self) -> None:
        """Waiting requests start prefilling while the step's prefill budget and the KV budget have room."""
        planned = sum(len(s.next_input) - 1 for s in self.prefilling)
        while self.waiting and planned < self.prefill_chunk and not self._shares_pending_prefix(self.waiting[0]) \
                and self.slots.admissible(self._reservation(self.waiting[0])):
            seq = self.waiting.popleft()
            try:
                self._admit(seq)
            except torch.OutOfMemoryError as exc:  # growing the KV failed: this request alone fails
                self.failed.append((seq, f"out of memory growing the KV cache for it ({exc}); lower "
                                         "--kv-cache-mb or --max-batch"))
                continue
            planned += len(seq.next_input) - 1
        self._join_prefilled()

    def _join_prefilled(self) -> None:
        """Requests whose prompt is in their slot but for its last token join the rows, which feed
        it; the prompt before it enters the prefix cache at once (other agents sharing the prefix
        hit it while this one decodes)."""
        for seq in [s for s in self.prefilling if len(s.next_input) == 1]:
            self.prefilling.remove(seq)
            self.rows.append(seq)
            self._cache_prompt(seq)

    def _shares_pending_prefix(self, seq: Sequence) -> bool:
        """Whether a request now prefilling will put more of seq's prompt in the prefix cache than it
        holds today (agents sending the same system prompt at once): then seq waits for that and
        hits it, rather than computing the same KV beside it."""
        if self.prefix_cache is None or not self.prefilling:
            return False
        prompt = seq.request.prompt_ids
        shared = max(common_prefix_len(other.request.prompt_ids, prompt, 0) for other in self.prefilling)
        return shared >= min(SHARED_PREFIX_WAIT, len(prompt) - 1) and \
            shared > self.prefix_cache.find(prompt[:-1]).length  # find: not counted as a lookup

    def _prompt_chunks(self) -> list[tuple[Sequence, list[int]]]:
        """At most prefill_chunk prompt tokens of the prefilling requests, in order; never a
        prompt's last token (the rows' pass feeds it)."""
        budget, fed = self.prefill_chunk, []
        for seq in self.prefilling:
            if budget == 0:
                break
            fed.append((seq, seq.next_input[: min(budget, len(seq.next_input) - 1)]))
            budget -= len(fed[-1][1])
        return fed

    def _decode_feeds(self) -> tuple[int, list[list[int]]]:
        """The ready rows' feeds over the run of their slots [lo, hi): each row's pending tokens (all
        of them when it extends, else one); [] for slots in the run that are not fed (held rows keep
        their pending tokens, so they are not sampled either)."""
        rows = [seq for seq in self.rows if _ready(seq)]
        if not rows:
            return 0, []
        lo = min(seq.slot for seq in rows)
        hi = max(seq.slot for seq in rows) + 1
        feeds: list[list[int]] = [[] for _ in range(hi - lo)]
        for seq in rows:
            n = len(seq.next_input) if self.extend and seq.params.forced_extend else 1
            feeds[seq.slot - lo] = seq.next_input[:n]
            del seq.next_input[:n]
        return lo, feeds

    def _count_pass(self, batch_size: int = 0) -> None:
        if self.metrics is not None:
            self.metrics.forward_passes.inc()
            if batch_size:
                self.metrics.batch_size.observe(batch_size)

    # ---- admission and release --------------------------------------------------------------

    def _admit(self, seq: Sequence) -> None:
        prompt = seq.request.prompt_ids
        seq.capacity = self._reservation(seq)
        seq.slot = self.slots.open(seq.capacity)
        if self.prefix_cache is not None:
            match = self.prefix_cache.match(prompt[:-1])
            self.prefix_cache.lock(match.node)
            seq.prefix_node = match.node
            if match.length:
                self.slots.write(seq.slot, match.kv())
                seq.cached_tokens = match.length
                del seq.next_input[: match.length]
        self.prefilling.append(seq)
        if self.metrics is not None:
            self.metrics.admitted(seq)

    def _cache_prompt(self, seq: Sequence) -> None:
        """Insert the prefilled prompt (all but its last token) and move the request's lock down to its end."""
        prompt = seq.request.prompt_ids[:-1]
        if not prompt:
            return
        self._insert(prompt, lambda start, end: self.slots.segment(seq.slot, start, end))
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
        """Take seq out wherever it is; with keep_kv, a row's computed KV enters the prefix cache."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.prefilling:
            self.prefilling.remove(seq)
        elif seq in self.rows:
            self.rows.remove(seq)
            if keep_kv:
                tokens = (list(seq.request.prompt_ids) + seq.output_ids)[: self.slots.lengths[seq.slot]]
                self._insert(tokens, lambda start, end: self.slots.segment(seq.slot, start, end))
        if seq.slot is not None:
            self.slots.close(seq.slot)
            seq.slot = None
        if self.prefix_cache is not None and seq.prefix_node is not None:
            self.prefix_cache.unlock(seq.prefix_node)
        seq.prefix_node = None

    # ---- checks -----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        self.slots.check_integrity()
        running = self.running
        assert self.num_running <= self.max_batch, f"{self.num_running} running > max_batch {self.max_batch}"
        held = sorted(s.slot for s in running)
        assert held == sorted(self.slots.reserved), f"running requests hold slots {held}, open: {sorted(self.slots.reserved)}"
        for seq in running:
            assert seq.finish_reason is None, f"finished request {seq.request.request_id} still holds slot {seq.slot}"
            pending = len(seq.next_input)
            assert self.slots.lengths[seq.slot] + pending == seq.num_tokens, (
                f"slot {seq.slot}: {self.slots.lengths[seq.slot]} cached + {pending} pending != {seq.num_tokens} tokens")
        if self.prefix_cache is None:
            return
        self.prefix_cache.check_integrity()
        locks = [s.prefix_node for s in running if s.prefix_node is not None and s.prefix_node.parent]
        total = sum(c.lock_ref for c in self.prefix_cache.root.children.values())
        assert total == len(locks), f"prefix cache holds {total} locks, running requests hold {len(locks)}"


def _ready(seq: Sequence) -> bool:
    """Whether the request's constraint can mask its next token (its units compiled)."""
    return seq.constraint is None or seq.constraint.ready()

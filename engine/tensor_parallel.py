"""Tensor parallelism: one model sharded over N ranks by transformers, driven by rank 0.

transformers shards the weights (`DistributedConfig(tp_size=N)`): each rank holds a slice of
every layer's heads and columns, and the layers all-reduce inside the forward pass, so every
rank must run the same forward passes on the same inputs, each over its own shard of the KV.

Rank 0 owns everything else: HTTP, the scheduler, the prefix cache's tree, grammar masks and
sampling. What the other ranks must repeat is only what touches their KV or their model:

    ("open", reservation, slot)         SlotCache.open (slots are taken deterministically)
    ("close", slot)                     SlotCache.close
    ("segment", slot, start, end, id)   a prefix segment copied out of a slot
    ("slice", id, start, end, new_id)   the prefix cache splitting a segment
    ("concat", [ids], new_id)           a prefix hit joining segments
    ("write", slot, id)                 a prefix hit copied into a slot
    ("free", id)                        rank 0 dropped that segment
    ("forward", rows, tokens)           one pass (prompt chunks, sampled and forced tokens)
    ("stop",)

Rank 0 records these as they happen and broadcasts the list before each forward pass (and every
TICK_S while idle, so that the others' wait never reaches the timeout); the others apply them in
order. Every collective is bounded by the process group's timeout, and any failure on rank 0
(a rank gone, a forward that raised) ends the server with a message, never a hang: the ranks'
KV would no longer agree, so no later answer could be trusted.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from engine import kv_segment
from engine.kv_segment import KVSegment
from engine.model_runner import ModelRunner
from engine.slot_cache import KVShape, MaskLayout, SlotCache

log = logging.getLogger("maskd.tp")

TICK_S = 1.0  # longest quiet time between broadcasts while rank 0 idles


def rank_env() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) when this process is one of several ranks, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    return int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"])), world


def init(device_type: str, timeout_s: float):
    """Joins the ranks (torch.distributed's env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE) and returns the CPU group that carries rank 0's operations."""
    rank, local_rank, world = rank_env()
    timeout = timedelta(seconds=timeout_s)
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=timeout)
    return dist.new_group(backend="gloo", timeout=timeout)


def fatal(why: str) -> None:
    """Ends this rank at once: the launcher (or torchrun) then ends the others."""
    print(f"maskd: tensor parallelism failed on rank {dist.get_rank()}: {why}; stopping the server",
          file=sys.stderr, flush=True)
    os._exit(1)


class Leader:
    """Rank 0's side: records the operations the other ranks must repeat and broadcasts them."""

    def __init__(self, group):
        self.group = group
        self._ops: list[tuple] = []
        self._lock = threading.RLock()  # a segment's finalizer may record while a flush holds it
        self._ids = itertools.count()
        self._last_flush = time.monotonic()
        kv_segment.on_derived = self.track  # the prefix cache's slices and joins, recorded

    def record(self, *op) -> None:
        with self._lock:
            self._ops.append(op)

    def track(self, segment: KVSegment, *how) -> None:
        """Names a new segment (how it was made is recorded with its id) and records its end."""
        segment_id = next(self._ids)
        object.__setattr__(segment, "tp_id", segment_id)
        self.record(*how, segment_id)
        weakref.finalize(segment, self.record, "free", segment_id)

    def flush(self) -> None:
        with self._lock:
            ops, self._ops = self._ops, []
        try:
            dist.broadcast_object_list([ops], src=0, group=self.group)
        except Exception as exc:  # a rank gone, or the timeout
            fatal(f"broadcast to the other ranks failed ({type(exc).__name__}: {exc})")
        self._last_flush = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() - self._last_flush >= TICK_S:
            self.flush()

    def stop(self) -> None:
        self.record("stop")
        self.flush()

    def runner(self, model: torch.nn.Module, device: torch.device) -> ModelRunner:
        return LeaderRunner(model, device, self)

    def slot_cache(self, shape: KVShape, layout: MaskLayout, device: torch.device, num_slots: int,
                   context_length: int, budget_bytes: int) -> SlotCache:
        self.record("config", num_slots, context_length, budget_bytes, shape.bytes_per_token)
        self.flush()
        return LeaderSlotCache(self, shape, layout, device, num_slots, context_length, budget_bytes)


class LeaderRunner(ModelRunner):
    def __init__(self, model, device, leader: Leader):
        super().__init__(model, device, decode=False)  # every pass packed: the shards' layers all-reduce there
        self.leader = leader

    def forward(self, slots: SlotCache, rows: list[int], tokens: list[list[int]], decode: bool = True) -> torch.Tensor:
        self.leader.record("forward", rows, tokens)
        self.leader.flush()
        try:
            return super().forward(slots, rows, tokens, decode)
        except Exception as exc:  # the other ranks' KV now differs from ours, or they are gone
            fatal(f"a forward pass failed ({type(exc).__name__}: {exc})")


class LeaderSlotCache(SlotCache):
    def __init__(self, leader: Leader, *args):
        super().__init__(*args)
        self.leader = leader

    def open(self, reservation: int) -> int:
        slot = super().open(reservation)
        self.leader.record("open", reservation, slot)
        return slot

    def close(self, slot: int) -> None:
        super().close(slot)
        self.leader.record("close", slot)

    def write(self, slot: int, segment: KVSegment) -> None:
        super().write(slot, segment)
        self.leader.record("write", slot, segment.tp_id)

    def segment(self, slot: int, start: int, end: int) -> KVSegment:
        segment = super().segment(slot, start, end)
        self.leader.track(segment, "segment", slot, start, end)
        return segment


def follow(model: torch.nn.Module, device: torch.device, group) -> None:
    """A rank > 0: repeats rank 0's operations on its own shard until told to stop."""
    shape = KVShape.probe(model, device)  # a forward pass: rank 0's Engine probes at the same point
    runner = ModelRunner(model, device, decode=False)
    slots: SlotCache | None = None
    segments: dict[int, KVSegment] = {}
    while True:
        box = [None]
        try:
            dist.broadcast_object_list(box, src=0, group=group)
        except Exception as exc:
            fatal(f"rank 0 is gone or silent ({type(exc).__name__}: {exc})")
        try:
            for op in box[0]:
                if op[0] == "stop":
                    return
                slots = _apply(op, model, device, shape, runner, slots, segments)
        except Exception as exc:  # out of memory, say: this rank's KV would no longer match rank 0's
            fatal(f"repeating rank 0's {op[0]!r} failed ({type(exc).__name__}: {exc})")


def _apply(op: tuple, model, device, shape: KVShape, runner: ModelRunner, slots: SlotCache | None,
           segments: dict[int, KVSegment]) -> SlotCache | None:
    """One of rank 0's operations on this rank's shard; returns the slot cache (made by "config")."""
    kind = op[0]
    if kind == "config":
        _, num_slots, context_length, budget_bytes, leader_bytes_per_token = op
        budget = budget_bytes * shape.bytes_per_token // leader_bytes_per_token
        return SlotCache(shape, MaskLayout.of(model.config), device, num_slots, context_length, budget)
    if kind == "forward":
        runner.forward(slots, op[1], op[2])
    elif kind == "open":
        slot = slots.open(op[1])
        assert slot == op[2], f"rank 0 opened slot {op[2]}, this rank {slot}"
    elif kind == "close":
        slots.close(op[1])
    elif kind == "segment":
        segments[op[4]] = slots.segment(op[1], op[2], op[3])
    elif kind == "slice":
        segments[op[4]] = segments[op[1]].slice(op[2], op[3])
    elif kind == "concat":
        segments[op[2]] = KVSegment.concat([segments[i] for i in op[1]])
    elif kind == "write":
        slots.write(op[1], segments[op[2]])
    elif kind == "free":
        del segments[op[1]]
    else:
        raise ValueError(f"unknown tensor-parallel operation {kind!r}")
    return slots

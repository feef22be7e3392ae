"""The logits hook that applies each constrained row's token mask (the engine side of the constraint interface)."""

from __future__ import annotations

import torch

from engine.host_logits import ATTRIBUTE as HOST_ROWS
from engine.sampling import Narrowed
from engine.sequence import Sequence
from grammars.masks.bitmask import (allocate_token_bitmask, apply_token_bitmask_cpu, apply_token_bitmask_inplace,
                                    fill_next_token_bitmasks)
from grammars.masks.sparse_mask import SparseMask, apply_sparse_mask_inplace, pick_routine, rows_routine, take_routine


class ConstraintMasker:
    """Masks the logits of every constrained row: from a short id list on CPU where the constraint
    has one, else from a packed bitmask row filled for it.

    On CPU a row whose constraint offers ``sparse_mask(budget)`` (optional; Matcher and
    ToolCallConstraint have one: the tokens ``fill(row, budget)`` would allow, or None) is masked
    from that short id list (8-17 us on a 49k vocabulary) and never filled; the other constrained
    rows (a budget narrows their mask and that narrowed mask is asked for the first time:
    grammars/masks/second_ask.py; or both its sides are long) are filled, and each float32 row
    is masked by a C loop over its clear bits (grammars/index/_mask_row.c; torch's packed apply took
    100-400 us there in real generations).  A greedy row without logprobs is
    not written at all: the call returns {row: its SparseMask} and sample() picks the argmax under
    it (engine/sampling.py settle()): over the allowed ids alone, or the row's own argmax unless it
    is banned. Writing the mask cost more than the rest of it: -inf over a row of 49k floats 11 us
    (39 us over 262k), ~700 banned ids of a string state 11-30 us.  On CUDA every constrained row
    is filled and the packed bitmask is copied to the device and applied there.

    ``ahead(seq)``, which the engine calls once a row's tokens of a step are appended, looks the
    row's next SparseMask up then, and the call after the next forward pass takes it from there. On
    CPU that pass streams the weights through every cache, and the lookup's Python path (the
    constraint, its matcher, the state's memo) ran there with cold caches: 13 us at p50 and 136 us
    at p99 over mask_bench's generations (SmolLM2), of 39 and 166-185 us for the step's whole mask.

    The engine's own logits rows (engine/host_logits.py) carry their address, stride and shape: the
    call reads them there, not from torch (five attribute reads, 17 of the call's 22 us at p50).
    Where every constrained row's mask was looked up ahead and may be picked as it is, one C call
    (grammars/index/_fast_calls.c take_ahead) checks the rows and makes the Narrowed, with the picker kept
    from the last step: the call took 12.7 and 11.9 us at p50 in Python over mask_bench's generations
    (two runs), 10.6 and 10.9 with the check in C (SmolLM2).
    """

    def __init__(self, vocab_size: int, max_batch: int):
        self.vocab_size = vocab_size
        self.bitmask = allocate_token_bitmask(max_batch, vocab_size)  # int32 [max_batch, W], CPU
        self._on_device: dict[torch.device, torch.Tensor] = {}
        self._host = False  # whether the logits were on the CPU (the id lists are only used there)
        self._rows = rows_routine()  # the C picks (compiled on first use, ~1 s) load with the engine, not at its first step
        self._rows or pick_routine()
        self._take = take_routine()  # the call's loop in C where every row was looked up ahead
        self._picker: tuple = (None, None)  # (HostRows, the Narrowed.picker over them): the last C call's

    def _device_mask(self, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":
            return self.bitmask
        mask = self._on_device.get(device)
        if mask is None or mask.shape != self.bitmask.shape:
            mask = self._on_device[device] = torch.empty_like(self.bitmask, device=device)
        return mask.copy_(self.bitmask, non_blocking=True)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> Narrowed:
        """logits: [B, V] (V = vocab_size), row i belongs to seqs[i]; edited in place. Returns the
        rows left unwritten, with their masks (see the class), and the pick's call over these logits
        (Narrowed.picker) where the extension is built."""
        host = getattr(logits, HOST_ROWS, None)  # the engine's own rows (engine/host_logits.py): read without torch
        if host is not None and self._take is not None:  # self._host is True already where a row has an ahead
            picker = self._picker
            if picker[0] is not host:  # a batch size keeps its rows from step to step
                picker = self._picker = (host, (self._rows, host.address, host.stride, host.shape))
            narrowed = self._take(seqs, Narrowed, picker[1])
            if narrowed is not None:
                return narrowed
        narrowed = Narrowed()
        if host is None:
            cpu = self._host = logits.is_cpu  # torch's attribute reads cost 2-5 µs each here: each asked once
            pickable = cpu and logits.dtype == torch.float32
        else:
            cpu = pickable = self._host = True
        rows = []
        for row, seq in enumerate(seqs):
            if seq.constraint is None:
                continue
            ahead = getattr(seq, "mask_ahead", None)  # looked up since the constraint last moved: the same answer
            if cpu and ahead is not None and ahead[0] is seq.constraint and ahead[1] == len(seq.output_ids) \
                    and ahead[2] == seq.tokens_left:
                seq.mask_ahead = None
                sparse, pick = ahead[3], ahead[4]
            else:
                sparse, pick = self._lookup(seq) if cpu else (None, False)
            if sparse is None:
                rows.append(row)
            elif pick and pickable:
                narrowed[row] = sparse
            else:
                apply_sparse_mask_inplace(logits[row], sparse)
        picker = None
        if narrowed and self._rows is not None:  # float32 on the CPU: checked above
            if host is not None:
                picker = (self._rows, host.address, host.stride, host.shape)
            else:
                step, unit = logits.stride()
                if unit == 1:
                    picker = (self._rows, logits.data_ptr(), step, logits.shape)
        narrowed.picker = picker  # one store a step: the slot is always set
        if not rows:
            return narrowed
        if len(seqs) > self.bitmask.shape[0]:
            self.bitmask = allocate_token_bitmask(len(seqs), self.vocab_size)
        fill_next_token_bitmasks([(row, seqs[row].constraint) for row in rows], self.bitmask,
                                 budgets=[seqs[row].tokens_left for row in rows])
        if not (cpu and apply_token_bitmask_cpu(logits, self.bitmask, rows)):
            apply_token_bitmask_inplace(logits, self._device_mask(logits.device), rows=rows)
        return narrowed

    def ahead(self, seq: Sequence) -> None:
        """Looks up the SparseMask of seq's next token (its constraint as it stands now, its
        tokens_left as the next step will set it) for the next call; where the logits are on the CPU
        and the constraint can answer now (``ready()``), else the call asks then."""
        seq.mask_ahead = None
        if self._host and seq.constraint.ready():
            seq.mask_ahead = (seq.constraint, len(seq.output_ids), seq.tokens_left) + self._lookup(seq)

    def _lookup(self, seq: Sequence) -> tuple[SparseMask | None, bool]:
        """seq's constraint's SparseMask for its next token where it has one that fits (no fill then),
        or None; and whether the pick may take it as it is (greedy, no logprobs: the row unwritten,
        sample() picks under it) rather than the row being masked."""
        sparse = seq.constraint.sparse_mask(seq.tokens_left)
        if sparse is None or sparse.vocab_size != self.vocab_size:
            return None, False
        return sparse, seq.params.logprobs is None and seq.params.greedy and (not sparse.allowed or sparse.size > 0)

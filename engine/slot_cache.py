"""SlotCache: the KV of every running row, written in place.

Each layer keeps its keys and values in one preallocated tensor of each kind:

    keys[l], values[l]: [slots, kv_heads, capacity, head_dim]

A row owns one slot from admission to release, and token i of the row lives in column i of its
slot. A forward pass writes each new token's KV where it belongs (index_put_), so no row is moved,
re-padded or copied when another joins or leaves, and a prefix-cache hit is one copy into the slot.

A pass feeds a list of slots; slot b feeds n_b >= 0 new tokens. The pass is packed: the model
sees every row's new tokens side by side in one sequence (no padding), its linear layers run once
over them, and engine/slot_attention.py splits the attention by row. The leading run of
consecutive slots [lo, hi) (the running rows, with holes for slots that do not feed one token
now) attends in one batched call over the view keys[l][lo:hi, :, :W]; every other row (a prompt
chunk, a forced run) attends alone over its own slot's view. So prompt chunks, forced runs and
decode tokens share one forward pass, and no KV is copied to attend. Masks are built from each
row's real length: the token at position p sees columns <= p, and on a sliding-window layer only
those > p - window. Sliding layers therefore keep every token and the mask holds the window,
which keeps a row's distances exact and lets the prefix cache cut segments out of every layer.

Memory: the tensors grow (by reallocation, the only time rows are copied) when an admitted row's
reservation needs more slots or columns, never beyond `budget_bytes`, the slots and the columns
each at least doubling; `admissible()` tells the scheduler whether one more row fits beside the
others. They are kept when the last row leaves: an agent's turns come one at a time, and freeing
them made every turn allocate and zero them again (all `max_batch` slots at twice the prompt's
length: 0.06-0.5 s for a 1,000-token prompt on SmolLM2, page faults included). A slot's columns
hold finite values from then on (zeros, or an earlier row's KV), which is all a masked column must
hold (a NaN there would poison the batched attention's sum).

Only the engine thread touches a SlotCache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_segment import KVSegment
from engine.slot_attention import Plan, Run, active

GRAIN = 256  # capacity grows in multiples of this many tokens


@dataclass(frozen=True)
class KVShape:
    """A model's per-layer KV geometry, read from one probe forward pass (see `probe`)."""

    heads: tuple[int, ...]  # KV heads of each layer
    head_dims: tuple[int, ...]
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        size = torch.empty(0, dtype=self.dtype).element_size()
        return sum(2 * h * d * size for h, d in zip(self.heads, self.head_dims))

    @staticmethod
    def probe(model: torch.nn.Module, device: torch.device) -> KVShape:
        """Runs one token through the model and reads the shapes of the KV it caches."""
        with torch.inference_mode():
            out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        keys = [layer.keys for layer in cache.layers]  # [1, H, 1, D] each
        return KVShape(tuple(k.shape[1] for k in keys), tuple(k.shape[3] for k in keys), keys[0].dtype)


@dataclass(frozen=True)
class MaskLayout:
    """Each layer's sliding window, and whether the model takes its masks as a dict by layer type."""

    windows: tuple[int | None, ...]  # per layer; None: full attention
    by_type: tuple[str, ...]  # the layer types of a model with several (Gemma 3), else ()

    @staticmethod
    def of(config) -> MaskLayout:
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None)
        if types is None:  # Llama, Mistral: every layer alike, sliding when a window is set
            return MaskLayout((window,) * config.num_hidden_layers, ())
        windows = tuple(window if kind == "sliding_attention" else None for kind in types)
        return MaskLayout(windows, tuple(sorted(set(types))) if len(set(types)) > 1 else ())


class SlotCache:
    """A transformers-compatible cache (the `update` the attention layers call) over row slots."""

    def __init__(self, shape: KVShape, layout: MaskLayout, device: torch.device, num_slots: int,
                 context_length: int, budget_bytes: int):
        self.shape = shape
        self.layout = layout
        self.device = device
        self.num_slots = num_slots
        self.context_length = context_length
        self.budget_bytes = budget_bytes
        self.keys: list[torch.Tensor] = []  # per layer [S, H, C, D]; empty while no row is open
        self.values: list[torch.Tensor] = []
        self.lengths = [0] * num_slots  # tokens held by each slot
        self.reserved: dict[int, int] = {}  # open slot -> tokens it may hold
        self._pass: tuple | None = None  # slots, counts; [N] each new token's slot and position
        # the attention mask the model is handed (slot attention makes its own): made once, not per pass
        self._placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)

    # ---- sizes and admission ----------------------------------------------------------------

    @property
    def allocated(self) -> tuple[int, int]:
        """(slots, capacity) of the tensors. /metrics reads it from another thread while the engine
        may grow them, one layer at a time (the first growth starts from a list of None)."""
        keys = self.keys
        first = keys[0] if keys else None
        return (first.shape[0], first.shape[2]) if first is not None else (0, 0)

    def nbytes(self) -> int:
        slots, capacity = self.allocated
        return slots * capacity * self.shape.bytes_per_token

    def _bytes(self, slots: int, capacity: int) -> int:
        return slots * capacity * self.shape.bytes_per_token

    def _round(self, tokens: int) -> int:
        """Capacity for rows of up to `tokens` tokens: a multiple of GRAIN, but never more than one
        row may hold alone (tokens never exceeds that: reservations are capped by it)."""
        return min(self.most_tokens_alone(), -(-tokens // GRAIN) * GRAIN)

    def most_tokens_alone(self) -> int:
        """The longest reservation one row can have with the cache to itself."""
        return min(self.context_length, self.budget_bytes // self.shape.bytes_per_token)

    def admissible(self, reservation: int) -> bool:
        """Whether a row reserving `reservation` tokens fits beside the open rows within the budget."""
        if len(self.reserved) >= self.num_slots:
            return False
        slot = self._free_slot()
        slots = max(slot + 1, max(self.reserved, default=-1) + 1)
        capacity = self._round(max([reservation, *self.reserved.values()]))
        return self._bytes(slots, capacity) <= self.budget_bytes

    def _free_slot(self) -> int:
        return next(s for s in range(self.num_slots) if s not in self.reserved)

    def open(self, reservation: int) -> int:
        """Takes the lowest free slot for a row of at most `reservation` tokens (check admissible()
        first); grows the tensors if they are too small. Returns the slot."""
        slot = self._free_slot()
        self.reserved[slot] = reservation
        self.lengths[slot] = 0
        try:
            self._grow(max(self.reserved) + 1, self._round(max(self.reserved.values())))
        except BaseException:  # out of memory: the row is not admitted, the others keep their KV
            del self.reserved[slot]
            raise
        return slot

    def close(self, slot: int) -> None:
        del self.reserved[slot]
        self.lengths[slot] = 0

    def _grow(self, slots: int, capacity: int) -> None:
        """Make the tensors at least [slots, *, capacity, *], generously where the budget allows (at
        least twice the slots and the columns asked), so that growing (which copies the open rows'
        KV) stays rare."""
        have_slots, have_capacity = self.allocated
        if slots <= have_slots and capacity <= have_capacity:
            return
        doubled = have_slots if slots <= have_slots else min(self.num_slots, max(slots, 2 * have_slots))
        for roomier in (doubled, slots):  # only more columns asked: the slots there are kept
            if self._bytes(roomier, max(capacity, have_capacity)) <= self.budget_bytes:
                slots = roomier
                break
        for roomier in (self._round(2 * capacity), capacity):  # both within the budget for one slot
            if self._bytes(slots, roomier) <= self.budget_bytes:
                capacity = roomier
                break
        if capacity < have_capacity and self._bytes(slots, have_capacity) <= self.budget_bytes:
            capacity = have_capacity  # more slots, the columns kept
        keep_slots, keep_capacity = min(slots, have_slots), min(capacity, have_capacity)
        if not any(self.lengths[s] for s in self.reserved):
            keep_slots = 0  # no open row holds KV: nothing to copy (the rest is an earlier row's)
        if not self.keys:
            self.keys, self.values = [None] * len(self.shape.heads), [None] * len(self.shape.heads)
        for layer, (h, d) in enumerate(zip(self.shape.heads, self.shape.head_dims)):
            for tensors in (self.keys, self.values):  # one layer at a time: the peak is the new tensors + one old
                grown = torch.zeros(slots, h, capacity, d, dtype=self.shape.dtype, device=self.device)
                if tensors[layer] is not None and keep_slots:
                    grown[:keep_slots, :, :keep_capacity] = tensors[layer][:keep_slots, :, :keep_capacity]
                tensors[layer] = grown

    # ---- prefix segments --------------------------------------------------------------------

    def write(self, slot: int, segment: KVSegment) -> None:
        """Puts a cached prefix at the start of an empty slot (one copy)."""
        n = len(segment)
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            k[slot, :, :n] = segment.data[layer, 0]  # [H, n, D]
            v[slot, :, :n] = segment.data[layer, 1]
        self.lengths[slot] = n

    def segment(self, slot: int, start: int, end: int) -> KVSegment:
        """A copy of the KV of tokens [start, end) of a slot."""
        data = torch.stack([torch.stack([k[slot, :, start:end], v[slot, :, start:end]])
                            for k, v in zip(self.keys, self.values)])  # [L, 2, H, n, D]
        return KVSegment(data)

    # ---- one forward pass -------------------------------------------------------------------

    def begin(self, slots: list[int], tokens: list[list[int]]) -> dict:
        """Inputs of a packed pass feeding tokens[b] (possibly none) to slots[b]: input_ids and
        position_ids [1, N] of every row's new tokens side by side, logits_to_keep [B] (each row's
        last new token; 0 for a row that feeds none) and a placeholder attention mask (the masks are
        engine/slot_attention.py's). The leading run of consecutive slots is the decode group: its
        rows feeding one token attend in one batched call over a view of their slots."""
        counts = [len(t) for t in tokens]
        for slot, c in zip(slots, counts):
            if self.lengths[slot] + c > self.allocated[1]:
                raise RuntimeError(f"slot {slot} needs {self.lengths[slot] + c} KV columns; slots hold "
                                   f"{self.allocated[1]}")
        M = 1
        while M < len(slots) and slots[M] == slots[0] + M:
            M += 1
        plan = Plan(self.layout.windows, self.device, lo=slots[0], M=M)
        # Everything a pass needs from the host is built here and crosses in one copy; nothing waits
        # for the device (no nonzero() or .item() on device tensors).
        ids, positions, at, last, dec_tokens, dec_rows, dec_pos = [], [], [], [], [], [], [-1] * M
        for b, (slot, row) in enumerate(zip(slots, tokens)):
            n, start = len(ids), self.lengths[slot]
            ids += row
            positions += range(start, start + len(row))
            at += [slot] * len(row)
            last.append(max(len(ids) - 1, 0))
            if b < M and len(row) == 1:
                dec_tokens.append(n)
                dec_rows.append(b)
                dec_pos[b] = start
            elif row:
                plan.runs.append(Run(n, len(ids), slot, start))
        N, B, r = len(ids), len(slots), len(dec_tokens)
        host = torch.tensor(ids + positions + at + last + dec_tokens + dec_rows + dec_pos, dtype=torch.long)
        packed = host.to(self.device, non_blocking=True)  # from pageable memory: staged, no wait
        ids, positions, at, last = packed[:N], packed[N:2 * N], packed[2 * N:3 * N], packed[3 * N:3 * N + B]
        if r:
            rest = packed[3 * N + B:]
            plan.dec_tokens, plan.dec_rows, plan.dec_pos = rest[:r], rest[r:2 * r], rest[2 * r:]
            plan.width = max(self.lengths[slot] + c for slot, c in zip(slots[:M], counts[:M]))
        self._pass = (slots, counts, at, positions)
        active(plan)
        placeholder = self._placeholder
        mask = {kind: placeholder for kind in self.layout.by_type} if self.layout.by_type else placeholder
        return {"input_ids": ids.unsqueeze(0), "position_ids": positions.unsqueeze(0), "attention_mask": mask,
                "logits_to_keep": last}

    def begin_decode(self, slots: list[int], rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """A decode pass (engine/decode_step.py) feeding one token to each of `slots`, padded to
        `rows` by repeating the last slot (a padding row writes what that row writes): its
        (slots [rows], positions [rows]) on the device, and the columns it attends over (the
        longest row's, rounded up to GRAIN within the capacity, so the width changes rarely).
        The ids are the caller's. end() counts one token per slot."""
        for slot in slots:
            if self.lengths[slot] + 1 > self.allocated[1]:
                raise RuntimeError(f"slot {slot} needs {self.lengths[slot] + 1} KV columns; slots hold "
                                   f"{self.allocated[1]}")
        padded = slots + [slots[-1]] * (rows - len(slots))
        host = torch.tensor(padded + [self.lengths[s] for s in padded], dtype=torch.long)
        packed = host.to(self.device, non_blocking=True)
        width = min(self._round(max(self.lengths[s] for s in slots) + 1), self.allocated[1])
        self._pass = (slots, [1] * len(slots), None, None)
        return packed[:rows], packed[rows:], width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key_states, value_states: [1, H, N, D] of this pass's tokens. Writes each token's KV into
        its slot and returns the layer's whole tensors, which slot attention reads by view."""
        _, _, at, positions = self._pass
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[at, :, positions] = key_states[0].transpose(0, 1)  # [N, H, D]
        v[at, :, positions] = value_states[0].transpose(0, 1)
        return k, v

    def end(self, completed: bool = True) -> None:
        """After the pass: each slot holds its new tokens. A pass that failed (completed=False) adds
        none: what it wrote lies beyond the rows' lengths and is overwritten later."""
        slots, counts = self._pass[:2]
        if completed:
            for slot, c in zip(slots, counts):
                self.lengths[slot] += c
        self._pass = None
        active(None)

    # transformers asks a cache for these in places; the masks and positions we pass make them moot.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths)

    @property
    def is_compileable(self) -> bool:
        return False

    # ---- checks -----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        slots, capacity = self.allocated
        assert self.nbytes() <= self.budget_bytes, f"KV tensors hold {self.nbytes()} B > budget {self.budget_bytes}"
        for slot in range(self.num_slots):
            if slot not in self.reserved:
                assert self.lengths[slot] == 0, f"free slot {slot} holds {self.lengths[slot]} tokens"
                continue
            assert slot < slots, f"open slot {slot} is beyond the {slots} allocated"
            assert self.lengths[slot] <= min(capacity, self.reserved[slot]), (
                f"slot {slot} holds {self.lengths[slot]} tokens; capacity {capacity}, reserved {self.reserved[slot]}")
        assert self._pass is None, "a pass was begun and never ended"

"""Forward passes over a list of row slots, each slot feeding its own number of new tokens."""

from __future__ import annotations

import inspect

import torch

from engine.decode_step import DecodeStep
from engine.host_logits import HostLogits
from engine.slot_attention import use_slot_attention
from engine.slot_cache import SlotCache
from engine.step_compiler import StepCompiler


def cache_kwarg(model: torch.nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x; use whichever the model takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class ModelRunner:
    """Rows feeding one token go through the lean DecodeStep (the StepCompiler's compiled step
    where the engine has one, eager otherwise); prompt chunks and forced runs are packed through the
    model's own forward (engine/slot_attention.py). `decode=False` sends every pass packed."""

    def __init__(self, model: torch.nn.Module, device: torch.device, decode: bool = True,
                 compiler: StepCompiler | None = None):
        self.model = model
        self.device = device
        self.forward_passes = 0
        self.decode_passes = 0
        self._cache_kwarg = cache_kwarg(model)
        use_slot_attention(model)
        self.host = HostLogits.install(model) if device.type == "cpu" else None  # logits the step reads without torch
        self.head = model.get_output_embeddings()
        self.decode = DecodeStep.of(model, _windows(model)) if decode else None
        self.compiler = compiler

    @torch.inference_mode()
    def forward(self, slots: SlotCache, rows: list[int], tokens: list[list[int]], decode: bool = True) -> torch.Tensor:
        """Feeds tokens[b] to slot rows[b] (prompt chunks, one sampled token, or a sampled token and
        the run the grammar forced after it; [] for a slot that does not step). Returns float32
        logits [B, V] of each slot's last new token (rows that fed nothing get meaningless logits).
        With a DecodeStep, rows feeding one token go through it and rows feeding several through a
        packed pass of their own, so a row's arithmetic never depends on who shares its step;
        decode=False sends every row packed, in one pass. On CPU the logits may be the engine's own
        rows (engine/host_logits.py), which the next pass overwrites: read within the step."""
        single = [b for b, t in enumerate(tokens) if len(t) == 1]
        if not decode or self.decode is None or not single:
            return self._pass(self._packed, slots, rows, tokens)
        several = [b for b, t in enumerate(tokens) if len(t) > 1]
        if not several:
            return self._pass(self._decode, slots, rows, tokens)
        runs = self._pass(self._packed, slots, [rows[b] for b in several], [tokens[b] for b in several])
        logits = runs.new_empty(len(rows), runs.shape[1])
        logits[several] = runs  # a copy: the next pass may overwrite the host rows
        logits[single] = self._pass(self._decode, slots, [rows[b] for b in single], [tokens[b] for b in single])
        return logits

    def _pass(self, run, slots: SlotCache, rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        host = self.host
        if host is not None:
            host.arm(True)
        try:
            logits = run(slots, rows, tokens)
        finally:
            if host is not None:
                host.arm(False)
        self.forward_passes += 1
        return logits

    def _packed(self, slots: SlotCache, rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        inputs = slots.begin(rows, tokens)
        try:
            out = self.model(**inputs, use_cache=True, **{self._cache_kwarg: slots})
        except BaseException:
            slots.end(completed=False)
            raise
        slots.end()
        return self._float(out.logits, out.logits[0])  # [B, V]

    def _decode(self, slots: SlotCache, rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        fed = [b for b, t in enumerate(tokens) if t]
        n = len(fed)
        bucket = _bucket(n)
        ids = [tokens[b][0] for b in fed]
        slot_ids, positions, width = slots.begin_decode([rows[b] for b in fed], bucket)
        ids = torch.tensor(ids + [ids[-1]] * (bucket - n), dtype=torch.long).to(self.device, non_blocking=True)
        step = self.compiler.compiled if self.compiler is not None else None
        args = (ids, positions, slot_ids, slots.keys, slots.values, width)
        try:
            try:
                hidden = (self.decode if step is None else step)(*args)  # [bucket, H]
            except Exception as exc:
                if step is None:
                    raise
                self.compiler.refused(exc)  # a shape the compiled step was not made for: this pass eager
                hidden = self.decode(*args)
        except BaseException:
            slots.end(completed=False)
            raise
        slots.end()
        self.decode_passes += 1
        hidden = hidden[:n]
        if n < len(rows):  # slots of the decode group that feed nothing: zero rows, meaningless logits
            full = hidden.new_zeros(len(rows), hidden.shape[1])
            full[fed] = hidden
            hidden = full
        out = self.head(hidden[None])  # [1, B, V]
        return self._float(out, out[0])

    def _float(self, out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The [B, V] float32 logits of a pass: the host rows where the head wrote them."""
        if self.host is not None:
            return self.host.rows(out)
        return rows if rows.dtype == torch.float32 else rows.float()


def _bucket(n: int) -> int:
    """Rows of a decode pass, padded to a power of two (the compiled step's shapes)."""
    return 1 << (n - 1).bit_length()


def _windows(model: torch.nn.Module) -> tuple[int | None, ...]:
    from engine.slot_cache import MaskLayout

    return MaskLayout.of(model.config).windows

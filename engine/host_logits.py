"""HostLogits: on CPU, the model's output head writes each pass's logits into rows the engine
allocated, which carry their address, row stride, shape and a numpy view (``HostRows``), read once
when the rows were made.

After a forward pass on CPU has streamed the weights through every cache, each of torch's attribute
reads on the fresh logits costs 2-5 µs (is_cpu, dtype, stride(), data_ptr(), shape: 17 µs of the
masker's 22 µs at p50 over mask_bench's generations, SmolLM2) and logits.numpy() 31 µs. The step
after the pass (the masker's call, the pick, the unconstrained argmax) reads ``host_rows`` instead:
one attribute lookup, no torch call.

Only for passes of ModelRunner.forward (``arm``), whose logits live for one step: a caller of the
model outside them gets a new tensor as before. Where the model changes the head's output after it
(Gemma 2's final soft cap), its logits are a new tensor and the step reads them as before.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
import torch

from engine.quantized_linear import DenseLinear, Int4Linear, Int4PairLinear, Int8Linear

QUANTIZED = (Int8Linear, Int4Linear, Int4PairLinear, DenseLinear)

ATTRIBUTE = "host_rows"
MOST_ROWS = 256  # rows of one pass (the batch, not the prompt tokens); a larger pass is not buffered


class HostRows(NamedTuple):
    address: int  # of row 0
    stride: int  # in float32 elements between rows
    shape: tuple[int, int]  # (rows, vocab)
    array: np.ndarray  # [rows, vocab] float32, a view of the same memory


def host_rows(logits: torch.Tensor) -> HostRows | None:
    """The HostRows a pass of an armed head left on ``logits``, or None for any other tensor."""
    return getattr(logits, ATTRIBUTE, None)


class HostLogits:
    """Wraps a CPU output head, an ``nn.Linear`` or one of engine/quantized_linear.py's (``install``,
    once per head), whose logits are float32 rows: while a thread
    has it ``armed``, a pass of one sequence of n <= MOST_ROWS positions ([1, n, H] hidden states,
    as the engine's packed passes keep one per row) writes its logits [1, n, V] into that thread's
    buffer with one matmul, and ``rows(logits)`` gives the [n, V] view that carries ``host_rows``;
    every other call runs the head as it was. Per thread: two engines on one model, each stepping
    on its own thread, never write each other's rows."""

    def __init__(self, head: torch.nn.Linear):
        self.head, self._local = head, threading.local()
        head.forward = self.forward

    def __getstate__(self) -> dict:  # a copied or pickled model's head gets a wrapper of its own, unarmed
        return {"head": self.head}

    def __setstate__(self, state: dict) -> None:
        self.head, self._local = state["head"], threading.local()

    @classmethod
    def install(cls, model: torch.nn.Module) -> HostLogits | None:
        """The HostLogits on the model's output head where it is a plain CPU Linear or a quantized
        one (engine/quantized_linear.py) (the one installed already, if any), else None."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if type(head) is torch.nn.Linear:
            if type(head.weight.data) is not torch.Tensor or head.weight.device.type != "cpu":
                return None  # a sharded weight (engine/tensor_parallel.py)
        elif type(head) not in QUANTIZED:
            return None
        installed = getattr(head.forward, "__self__", None)
        return installed if isinstance(installed, HostLogits) else cls(head)

    def arm(self, armed: bool) -> None:
        """Whether this thread's next passes write into its buffer (ModelRunner.forward's passes)."""
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _Rows()
        state.armed = armed
        if armed:
            state.last = None  # set by this pass, if it writes the buffer

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        state = getattr(self._local, "state", None)
        plain = type(self.head).forward  # the head's own forward (Linear's, or a quantized layer's)
        if state is None or not state.armed or hidden.dim() != 3 or hidden.shape[0] != 1:
            return plain(self.head, hidden)
        views = state.views.get(hidden.shape[1]) or state.make(hidden.shape[1], self.head.out_features)
        if views is None:
            return plain(self.head, hidden)
        out, rows = views
        if type(self.head) is torch.nn.Linear and self.head.weight.dtype == hidden.dtype == torch.float32:
            weight, bias = self.head.weight, self.head.bias
            if bias is None:
                torch.mm(hidden[0], weight.t(), out=rows)
            else:
                torch.addmm(bias, hidden[0], weight.t(), out=rows)
        else:  # bfloat16 or quantized: the head's own kernel, then float32 into the rows
            rows.copy_(plain(self.head, hidden[0]))
        state.last = views
        return out

    def rows(self, logits: torch.Tensor) -> torch.Tensor:
        """The [n, V] logits of a model output's [1, n, V] ``logits``: this thread's last pass's
        rows, which carry host_rows, where ``logits`` is the head's buffer as written; else logits[0]."""
        state = self._local.state
        last, state.last = state.last, None
        if last is not None and logits is last[0]:
            return last[1]
        return logits[0] if logits.dtype == torch.float32 else logits[0].float()


class _Rows:
    """One thread's buffer [rows, V] float32 and its views by pass size."""

    def __init__(self) -> None:
        self.armed, self.last = False, None
        self.buffer: torch.Tensor | None = None
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # n -> ([1, n, V], [n, V])

    def make(self, n: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if n > MOST_ROWS:
            return None
        with torch.inference_mode(False):  # plain tensors: the engine writes them in place in any mode
            if self.buffer is None or self.buffer.shape[0] < n:
                grown = 8 if self.buffer is None else 2 * self.buffer.shape[0]
                self.buffer = torch.empty(max(n, min(grown, MOST_ROWS)), vocab)
                self.views = {}  # views of the old buffer stay valid for whoever holds them
            rows = self.buffer[:n]
            out = rows.view(1, n, vocab)
        setattr(rows, ATTRIBUTE, HostRows(rows.data_ptr(), rows.stride(0), (n, vocab), rows.numpy()))
        self.views[n] = (out, rows)
        return out, rows

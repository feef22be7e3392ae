"""HostLogits (engine/host_logits.py): the engine's passes write their logits into rows it allocated,
which carry their address, stride, shape and a numpy view; the logits are those of the plain head;
the model called outside the engine's passes, on another thread, or over more rows than a pass
buffers, gets a tensor of its own as before."""

import copy
import threading

import numpy as np
import torch

from engine.engine import Engine
from engine.host_logits import MOST_ROWS, HostLogits, host_rows
from engine.sampling import SamplingParams
from engine.sequence import Request
from engine_fixtures import prompt, tiny_model  # noqa: F401 (a fixture)


def step_logits(model, tokenizer, ids, n=3):
    """Each step's logits [V] as the engine's hook saw them (copied), and their host_rows."""
    seen = []

    def hook(logits, seqs):
        seen.append((logits[0].clone(), host_rows(logits), logits))

    engine = Engine(model, tokenizer, torch.device("cpu"), frozenset({2}), context_length=64, logits_hooks=[hook])
    request = Request(prompt_ids=ids, params=SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    tokens = []
    request.emit = lambda event: tokens.extend(event.token_ids)
    engine.submit(request)
    engine._drain_inbox()
    while engine._running or engine._waiting:
        engine.step()
    return seen, tokens


def test_the_engine_reads_its_rows_and_they_hold_the_plain_heads_logits(tiny_model, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)
    seen, tokens = step_logits(tiny_model, smollm_tokenizer, ids)
    assert len(seen) == 3
    for at, (copied, rows, logits) in enumerate(seen):
        assert rows is not None
        assert (rows.address, rows.stride, rows.shape) == (logits.data_ptr(), logits.stride(0), tuple(logits.shape))
        assert np.shares_memory(rows.array, logits.numpy()) and rows.array.shape == rows.shape
        with torch.no_grad():
            plain = tiny_model(torch.tensor([ids + tokens[:at]]), use_cache=False).logits[0, -1]
        torch.testing.assert_close(copied, plain, rtol=1e-4, atol=1e-4)
        assert tokens[at] == int(plain.argmax())
    assert seen[1][2] is seen[2][2]  # one pass size, one view: made once


def test_the_model_outside_the_engines_passes_gets_its_own_logits(tiny_model, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)
    seen, _ = step_logits(tiny_model, smollm_tokenizer, ids)
    rows = seen[-1][1]
    before = rows.array.copy()
    with torch.no_grad():
        out = tiny_model(torch.tensor([ids]), use_cache=False).logits
    assert host_rows(out[0]) is None and not np.shares_memory(out.numpy(), rows.array)
    assert np.array_equal(rows.array, before)  # the engine's rows untouched


def test_arming_holds_for_its_own_thread_and_for_passes_it_buffers(tiny_model):
    host = HostLogits.install(tiny_model)
    assert host is not None and HostLogits.install(tiny_model) is host  # one per head
    ids = torch.tensor([[5, 6, 7]])
    got = {}

    def other():
        with torch.no_grad():
            got["logits"] = tiny_model(ids, use_cache=False).logits

    host.arm(True)
    try:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        with torch.no_grad():
            mine = tiny_model(ids, use_cache=False).logits  # [1, 3, V]: three rows buffered
            large = tiny_model(torch.arange(MOST_ROWS + 1)[None] % 100 + 3, use_cache=False).logits
    finally:
        host.arm(False)
    assert host_rows(host.rows(mine)) is not None
    assert host_rows(got["logits"][0]) is None and host_rows(large[0]) is None
    torch.testing.assert_close(got["logits"], mine)  # same numbers, own memory
    assert not np.shares_memory(got["logits"].numpy(), mine.numpy())


def test_a_bfloat16_or_quantized_head_writes_float32_rows_and_another_head_none(tiny_model):
    """A head in bfloat16, or quantized (engine/quantized_linear.py), writes float32 rows too: the
    masker and the pick read float32 (a bfloat16 head was left unbuffered before, and its logits
    reached them in bfloat16)."""
    from engine.quantized_linear import quantize_model

    ids = torch.tensor([[5, 6, 7]])
    for model in (copy.deepcopy(tiny_model).to(torch.bfloat16), copy.deepcopy(tiny_model)):
        if model.dtype == torch.float32:
            quantize_model(model, "int8", torch.float32)
        with torch.no_grad():
            plain = model(ids, use_cache=False).logits[0]
        host = HostLogits.install(model)
        host.arm(True)
        try:
            with torch.no_grad():
                rows = host.rows(model(ids, use_cache=False).logits)
        finally:
            host.arm(False)
        assert host_rows(rows) is not None and rows.dtype == torch.float32
        torch.testing.assert_close(rows, plain.float())
    other = copy.deepcopy(tiny_model)
    other.lm_head = torch.nn.Sequential(other.lm_head)
    assert HostLogits.install(other) is None


def test_a_copied_model_gets_a_wrapper_of_its_own(tiny_model):
    host = HostLogits.install(tiny_model)
    twin = copy.deepcopy(tiny_model)
    copied = HostLogits.install(twin)
    assert copied is not host and copied.head is twin.lm_head
    ids = torch.tensor([[5, 6, 7]])
    copied.arm(True)
    try:
        with torch.no_grad():
            out = twin(ids, use_cache=False).logits
            plain = tiny_model(ids, use_cache=False).logits  # the original head is not armed
    finally:
        copied.arm(False)
    assert host_rows(copied.rows(out)) is not None and host_rows(plain[0]) is None
    torch.testing.assert_close(out, plain)

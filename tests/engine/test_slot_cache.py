"""The SlotCache (engine/slot_cache.py) and the KV budget: rows keep their KV in place while others
join and leave, the budget holds at every step, admission waits when it is full, a prompt that can
never fit is refused, and a forced run enters the KV in one pass with the tokens of feeding it one
at a time. An engine stepped from the test thread on a tiny random-weight Llama."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.engine import PromptTooLong
from engine.kv_segment import KVSegment
from engine.slot_cache import GRAIN, KVShape, MaskLayout, SlotCache
from engine_fixtures import Driver as EngineDriver
from engine_fixtures import ForcesRun

VOCAB = 1536
CONTEXT = 1024


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         initializer_range=0.2)  # peaked attention: a wrong position or mask changes tokens
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def shape(tiny_model):
    return KVShape.probe(tiny_model, torch.device("cpu"))


def Driver(model, tokenizer, **kwargs) -> EngineDriver:
    return EngineDriver(model, tokenizer, context_length=CONTEXT, **kwargs)


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def test_the_probe_reads_the_models_kv_geometry(shape):
    assert shape.heads == (2, 2) and shape.head_dims == (16, 16) and shape.dtype == torch.float32
    assert shape.bytes_per_token == 2 * 2 * 2 * 16 * 4  # layers * (k, v) * heads * head_dim * fp32


def test_slots_keep_their_kv_while_others_join_and_leave(shape):
    cache = SlotCache(shape, MaskLayout((None, None), ()), torch.device("cpu"), num_slots=4,
                      context_length=CONTEXT, budget_bytes=1 << 30)
    a, b = cache.open(100), cache.open(300)
    assert (a, b) == (0, 1) and cache.allocated[1] >= 300
    kv_a = KVSegment(torch.randn(2, 2, 2, 40, 16))
    cache.write(a, kv_a)
    cache.write(b, KVSegment(torch.randn(2, 2, 2, 70, 16)))
    c = cache.open(50)
    storage = cache.keys[0].data_ptr()
    cache.close(b)  # a row in the middle leaves: nothing moves
    assert c == 2 and cache.keys[0].data_ptr() == storage
    assert torch.equal(cache.segment(a, 0, 40).data, kv_a.data)
    assert cache.open(20) == 1, "the lowest free slot is reused"
    cache.check_integrity()


def test_slots_grow_by_doubling_and_the_tensors_stay_for_the_next_turn(shape):
    """One row takes one slot, not all eight; more rows double them. When the last row leaves the
    tensors stay, and the next turn, no longer than they hold, runs in them as they are."""
    cache = SlotCache(shape, MaskLayout((None, None), ()), torch.device("cpu"), num_slots=8,
                      context_length=CONTEXT, budget_bytes=1 << 30)
    a = cache.open(100)
    assert cache.allocated == (1, 2 * GRAIN)  # the columns doubled and rounded
    cache.write(a, KVSegment(torch.randn(2, 2, 2, 60, 16)))
    b = cache.open(40)
    assert cache.allocated[0] == 2 and b == 1
    c = cache.open(40)
    assert cache.allocated[0] == 4 and (a, b, c) == (0, 1, 2)
    cache.open(3 * GRAIN)  # only more columns (doubled, capped by the context): the four slots stay four
    assert cache.allocated == (4, CONTEXT)
    for slot in (a, b, c, 3):
        cache.close(slot)
    storage, allocated = cache.keys[0].data_ptr(), cache.allocated
    assert cache.open(300) == 0 and cache.keys[0].data_ptr() == storage and cache.allocated == allocated
    cache.check_integrity()


def test_a_turn_after_the_engine_idled_gives_its_own_tokens_in_the_kept_tensors(tiny_model, smollm_tokenizer):
    """A long request, the engine idle, then a shorter one: the second runs in the first's tensors
    (no new allocation), over columns the first wrote, and gives the tokens it gives alone."""
    long_prompt, short_prompt = prompts((300, 120), seed=3)
    alone = Driver(tiny_model, smollm_tokenizer)
    expected = alone.submit(short_prompt, max_tokens=16)
    alone.run()
    driver = Driver(tiny_model, smollm_tokenizer)
    driver.submit(long_prompt, max_tokens=16)
    driver.run()
    slots = driver.engine.scheduler.slots
    storage = slots.keys[0].data_ptr()
    second = driver.submit(short_prompt, max_tokens=16)
    driver.run()
    assert slots.keys[0].data_ptr() == storage
    assert driver.tokens(second) == alone.tokens(expected) and len(alone.tokens(expected)) == 16


def test_growth_keeps_the_rows_and_never_passes_the_budget(shape):
    budget = 3 * 2 * GRAIN * shape.bytes_per_token  # three slots of 512 tokens, or one of 1024 and change
    cache = SlotCache(shape, MaskLayout((None, None), ()), torch.device("cpu"), num_slots=8,
                      context_length=CONTEXT, budget_bytes=budget)
    a = cache.open(GRAIN)
    kv_a = KVSegment(torch.randn(2, 2, 2, 30, 16))
    cache.write(a, kv_a)
    assert cache.admissible(2 * GRAIN) and not cache.admissible(4 * GRAIN)
    cache.open(2 * GRAIN)  # grows the capacity: a's KV is copied along
    assert torch.equal(cache.segment(a, 0, 30).data, kv_a.data)
    assert cache.nbytes() <= budget
    assert cache.admissible(2 * GRAIN) and not cache.admissible(3 * GRAIN)
    cache.check_integrity()


def test_its_size_reads_while_the_tensors_grow(shape, monkeypatch):
    """/metrics reads nbytes() on the server's thread while the engine thread may grow the tensors,
    one layer at a time: the first growth starts from a list of None, whose shape it read (a 500)."""
    cache = SlotCache(shape, MaskLayout((None, None), ()), torch.device("cpu"), num_slots=4,
                      context_length=CONTEXT, budget_bytes=1 << 30)
    zeros, seen = torch.zeros, []

    def zeros_read_meanwhile(*args, **kwargs):
        seen.append(cache.nbytes())  # as a scrape between two layers' allocations would
        return zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros_read_meanwhile)
    cache.open(GRAIN)
    monkeypatch.undo()
    assert len(seen) == 2 * len(shape.heads) and seen[0] == 0 and cache.nbytes() > 0


def test_the_budget_holds_and_queued_rows_run_when_room_frees(tiny_model, smollm_tokenizer):
    """Five requests whose reservations need twice the budget: at most two run at once, all finish
    with the tokens each gives alone, and the KV tensors never exceed the budget."""
    shape = KVShape.probe(tiny_model, torch.device("cpu"))
    budget = 2 * GRAIN * shape.bytes_per_token  # two rows of up to 256 tokens
    ps = prompts((30, 90, 150, 12, 200))
    alone = []
    for p in ps:
        d = Driver(tiny_model, smollm_tokenizer)
        r = d.submit(p, max_tokens=40)
        d.run()
        alone.append(d.tokens(r))
    driver = Driver(tiny_model, smollm_tokenizer, kv_cache_bytes=budget)
    requests = [driver.submit(p, max_tokens=40) for p in ps]
    driver.run()
    assert [driver.tokens(r) for r in requests] == alone
    assert driver.most_rows == 2, "two rows fit the budget beside each other, a third never does"


def test_a_prompt_that_can_never_fit_is_refused_and_one_that_fits_alone_is_capped(tiny_model, smollm_tokenizer):
    shape = KVShape.probe(tiny_model, torch.device("cpu"))
    driver = Driver(tiny_model, smollm_tokenizer, kv_cache_bytes=100 * shape.bytes_per_token)
    with pytest.raises(PromptTooLong, match="--kv-cache-mb"):
        driver.submit(prompts((100,))[0])
    request = driver.submit(prompts((90,))[0], max_tokens=50)  # 90 + 50 > 100: runs until the KV is full
    driver.run()
    assert len(driver.tokens(request)) == 10 and driver.events[request.request_id][-1].finish_reason == "length"


@pytest.mark.parametrize("extend", [True, False])
def test_a_forced_run_costs_one_pass_when_extended(tiny_model, smollm_tokenizer, extend):
    """The same forced run and the same tokens either way, beside another row; extended, the run
    enters the KV in one pass."""
    run = prompts((12,), seed=3)[0]
    prompt, beside = prompts((20, 33), seed=4)
    fed = Driver(tiny_model, smollm_tokenizer)
    plain, o = fed.submit(prompt, max_tokens=8), fed.submit(beside)
    fed.run()
    driver = Driver(tiny_model, smollm_tokenizer, forced_extend=extend)
    forced, other = driver.submit(prompt, constraint=ForcesRun(run), max_tokens=8 + len(run)), driver.submit(beside)
    driver.run()
    tokens = driver.tokens(forced)
    assert tokens[0] == fed.tokens(plain)[0] and tokens[1:1 + len(run)] == run
    assert driver.tokens(other) == fed.tokens(o)
    after = Driver(tiny_model, smollm_tokenizer)
    cont = after.submit(prompt + tokens[:1 + len(run)], max_tokens=7)
    after.run()
    assert tokens[1 + len(run):] == after.tokens(cont)

    alone = Driver(tiny_model, smollm_tokenizer, forced_extend=extend)
    alone.submit(prompt, constraint=ForcesRun(run), max_tokens=8 + len(run))
    alone.run()
    # a prefill of all but the prompt's last token, the pass of that token, then a pass per fed
    # token: the first sampled one with the run after it (one pass extended, 1 + 12 otherwise),
    # then 6 of the 7 sampled after the run (the last is never fed)
    fed_passes = (1 if extend else 1 + len(run)) + 6
    assert alone.engine.runner.forward_passes == 2 + fed_passes


def test_a_request_may_turn_extension_off(tiny_model, smollm_tokenizer):
    run = prompts((6,), seed=5)[0]
    driver = Driver(tiny_model, smollm_tokenizer)
    driver.submit(prompts((10,), seed=6)[0], constraint=ForcesRun(run), max_tokens=3 + len(run), forced_extend=False)
    driver.run()
    assert driver.engine.runner.forward_passes == 2 + 2 + len(run)  # prefill, the prompt's last token, a pass per token


def test_out_of_memory_growing_the_kv_fails_that_request_alone(tiny_model, smollm_tokenizer, monkeypatch):
    """The allocator refusing the bigger tensors a newcomer needs (simulated: our own _grow raises
    what torch raises) ends the newcomer with an error; the running row keeps its KV and tokens."""
    small, big = prompts((20, 600), seed=7)
    alone = Driver(tiny_model, smollm_tokenizer)
    expected = alone.submit(small, max_tokens=12)
    alone.run()
    driver = Driver(tiny_model, smollm_tokenizer)
    running = driver.submit(small, max_tokens=12)
    driver.engine._drain_inbox()
    driver.engine.step()
    slots = driver.engine.scheduler.slots
    grow = slots._grow

    def refuse(n_slots, capacity):
        if capacity > slots.allocated[1]:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        grow(n_slots, capacity)
    monkeypatch.setattr(slots, "_grow", refuse)
    newcomer = driver.submit(big, max_tokens=400)
    driver.run()
    last = driver.events[newcomer.request_id][-1]
    assert last.finish_reason == "error" and "out of memory" in last.error
    assert driver.tokens(running) == alone.tokens(expected)

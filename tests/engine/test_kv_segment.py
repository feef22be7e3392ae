"""KV correctness of engine/kv_segment.py with the prefix cache, on tiny random-weight models.

The claim under test: continuing a request from a prefix KV that the radix cache kept from an
earlier, different request gives the same logits (and the same greedy tokens) as computing the
whole sequence from scratch.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from engine.kv_segment import KVSegment
from engine.model_runner import cache_kwarg
from engine.radix_cache import RadixCache

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,  # the default 0.02 makes attention so flat that a 0.1% error in K hides under 1e-4
)
BUDGET = 64 << 20


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    torch.manual_seed(0)
    if request.param == "llama":
        m = LlamaForCausalLM(LlamaConfig(**TINY))
    else:
        m = Qwen2ForCausalLM(Qwen2Config(**TINY))
    return m.eval().to(torch.float32)


def seq(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (n,), generator=g).tolist()


def cache_of(out):
    """The cache a forward pass returns (`cache` in newer transformers, `past_key_values` before)."""
    return getattr(out, "cache", None) or out.past_key_values


@torch.no_grad()
def full_logits(model, tokens):
    return model(input_ids=torch.tensor([tokens])).logits[0]  # [n, vocab]


@torch.no_grad()
def run_and_insert(model, cache, tokens):
    """Prefill `tokens` from scratch (as a finished request would have) and cache them."""
    out = model(input_ids=torch.tensor([tokens]), use_cache=True)
    return cache.insert(tokens, lambda start, end: KVSegment.from_cache(cache_of(out), 0, start, end))


@torch.no_grad()
def logits_from_cached_prefix(model, cache, tokens):
    """Admit `tokens` the way the engine does: match, lock, prefill only the rest."""
    m = cache.match(tokens[:-1])
    cache.lock(m.node)
    kv = m.kv()
    past = kv.to_cache() if kv is not None else None
    rest = torch.tensor([tokens[m.length :]])
    logits = model(input_ids=rest, **{cache_kwarg(model): past}, use_cache=True).logits[0]  # [n - length, vocab]
    cache.unlock(m.node)
    cache.check_integrity()
    return m.length, logits


def test_prefix_from_an_earlier_request_gives_the_same_logits_when_match_ends_mid_edge(model):
    cache = RadixCache(BUDGET)
    prefix = seq(1, 24)
    first = prefix + [5, 6, 7, 8, 9]
    second = prefix + [10, 11, 12, 13, 14, 15]
    assert run_and_insert(model, cache, first) == len(first)  # one edge of 29 tokens
    length, logits = logits_from_cached_prefix(model, cache, second)
    assert length == len(prefix)
    assert [c.key for c in cache.root.children[prefix[0]].children.values()] == [[5, 6, 7, 8, 9]]  # split
    torch.testing.assert_close(logits, full_logits(model, second)[length:], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_the_logit_comparison_detects_a_wrong_prefix(model):
    tokens, other = seq(15, 30), seq(16, 30)
    wrong = cache_of(model(input_ids=torch.tensor([other]), use_cache=True))
    past = KVSegment.from_cache(wrong, 0, 0, 24).to_cache()
    logits = model(input_ids=torch.tensor([tokens[24:]]), **{cache_kwarg(model): past}).logits[0]
    assert (logits - full_logits(model, tokens)[24:]).abs().max() > 1e-2


def test_prefix_spanning_several_edges_gives_the_same_logits(model):
    cache = RadixCache(BUDGET)
    base = seq(2, 30)
    run_and_insert(model, cache, base)
    run_and_insert(model, cache, base[:10] + seq(3, 8))  # splits at 10
    run_and_insert(model, cache, base[:20] + seq(4, 5))  # splits at 20
    query = base[:26] + seq(5, 7)  # root -> [0,10) -> [10,20) -> [20,26) of [20,30): ends mid-edge
    length, logits = logits_from_cached_prefix(model, cache, query)
    assert length == 26 and cache.match(query).node.depth == 26
    torch.testing.assert_close(logits, full_logits(model, query)[length:], atol=1e-4, rtol=1e-4)


def test_whole_request_cached_still_prefills_its_last_token(model):
    cache = RadixCache(BUDGET)
    tokens = seq(6, 20)
    run_and_insert(model, cache, tokens)
    length, logits = logits_from_cached_prefix(model, cache, tokens)
    assert length == 19 and logits.shape[0] == 1
    torch.testing.assert_close(logits, full_logits(model, tokens)[19:], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_greedy_tokens_after_a_cached_prefix_equal_those_without_cache(model):
    cache = RadixCache(BUDGET)
    system = seq(7, 32)
    run_and_insert(model, cache, system + seq(8, 6))  # an earlier turn with the same system prompt
    prompt = system + seq(9, 5)

    ids, uncached = list(prompt), []
    for _ in range(10):  # reference: recompute everything at every step, no KV cache at all
        nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        uncached.append(nxt)
        ids.append(nxt)

    m = cache.match(prompt[:-1])
    assert m.length == len(system)
    past = m.kv().to_cache()
    out = model(input_ids=torch.tensor([prompt[m.length :]]), **{cache_kwarg(model): past}, use_cache=True)
    cached = []
    for _ in range(10):
        nxt = int(out.logits[0, -1].argmax())
        cached.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]]), **{cache_kwarg(model): cache_of(out)}, use_cache=True)
    assert cached == uncached
    # The request's own cache grew; the segments in the prefix cache did not change.
    assert len(m.kv()) == len(system)


@torch.no_grad()
def test_segment_cut_from_one_row_of_a_batch(model):
    cache = RadixCache(BUDGET)
    rows = [seq(10, 16), seq(11, 16)]
    out = model(input_ids=torch.tensor(rows), use_cache=True)
    cache.insert(rows[1], lambda s, e: KVSegment.from_cache(cache_of(out), 1, s, e))
    query = rows[1][:12] + seq(12, 4)
    length, logits = logits_from_cached_prefix(model, cache, query)
    assert length == 12
    torch.testing.assert_close(logits, full_logits(model, query)[12:], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_bytes_slice_concat_and_dtype():
    torch.manual_seed(0)
    bf16_model = LlamaForCausalLM(LlamaConfig(**TINY)).eval().to(torch.bfloat16)
    out = bf16_model(input_ids=torch.tensor([seq(13, 10)]), use_cache=True)
    seg = KVSegment.from_cache(cache_of(out), 0, 0, 10)
    layers, heads, head_dim = 2, 2, 16
    assert seg.dtype == torch.bfloat16 and seg.data.shape == (layers, 2, heads, 10, head_dim)
    assert seg.nbytes == layers * 2 * heads * 10 * head_dim * 2 == 10 * seg.bytes_per_token
    a, b = seg.slice(0, 4), seg.slice(4, 10)
    assert a.data.untyped_storage().nbytes() == a.nbytes  # a copy, not a view of seg
    assert torch.equal(KVSegment.concat([a, b]).data, seg.data)
    past = seg.to_cache()
    assert past.get_seq_length() == 10 and past.layers[0].keys.dtype == torch.bfloat16


def test_bad_inputs_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="shape"):
        KVSegment(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="different models"):
        KVSegment.concat([KVSegment(torch.zeros(2, 2, 2, 1, 16)), KVSegment(torch.zeros(3, 2, 2, 1, 16))])
    with pytest.raises(IndexError, match="out of range"):
        KVSegment(torch.zeros(1, 2, 1, 3, 1)).slice(2, 5)
    sliding = Cache(layers=[DynamicSlidingWindowLayer(sliding_window=4)])
    sliding.update(torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16), 0)
    with pytest.raises(TypeError, match="full-attention"):
        KVSegment.from_cache(sliding, 0, 0, 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@torch.no_grad()
def test_segments_stay_on_the_model_device():
    torch.manual_seed(0)
    gpu_model = LlamaForCausalLM(LlamaConfig(**TINY)).eval().cuda()
    cache = RadixCache(BUDGET)
    prefix = seq(14, 20)
    out = gpu_model(input_ids=torch.tensor([prefix + [1, 2]], device="cuda"), use_cache=True)
    cache.insert(prefix + [1, 2], lambda s, e: KVSegment.from_cache(cache_of(out), 0, s, e))
    query = prefix + [3, 4, 5]
    m = cache.match(query[:-1])
    assert m.length == 20 and m.kv().device.type == "cuda"
    past = m.kv().to_cache()
    logits = gpu_model(input_ids=torch.tensor([query[20:]], device="cuda"), **{cache_kwarg(gpu_model): past}).logits[0]
    full = gpu_model(input_ids=torch.tensor([query], device="cuda")).logits[0, 20:]
    torch.testing.assert_close(logits, full, atol=1e-3, rtol=1e-3)

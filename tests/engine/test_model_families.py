"""Every model family of models.yaml through the engine, without weights: tiny random-weight configs
of Llama 3 (llama3 rope scaling), Qwen2.5, Qwen3, Mistral with a sliding window and Gemma 3 text
(sliding and global layers). For each family, greedy tokens must be exactly those of plain
transformers (a full forward per token, no cache):

- eight rows of different lengths (several longer than the sliding window) batched, each alone;
- prompts whose long prefix is a prefix-cache hit (a shared system prefix; a conversation's next
  turn), against the same prompts with the cache off;
- a constraint that forces a run of tokens, against the same tokens fed as part of the prompt.

The engine keeps every layer's tokens, sliding ones too, in its SlotCache and builds the sliding
window into the attention mask from each row's real positions, so the window holds in a batch and
a prefix can be cut out of every layer.
The engine is stepped from the test thread, so the order of joins and prefill chunks is exact.
"""

import copy

import pytest
import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from engine.host_logits import host_rows
from engine_fixtures import Driver as EngineDriver
from engine_fixtures import ForcesRun

VOCAB = 1536
WINDOW = 8  # sliding window of the Mistral and Gemma 3 configs; most prompts below are longer
LENGTHS = (3, 7, 9, 14, 21, 30, 37, 45)  # eight rows
NEW = 8  # new tokens per request
# initializer_range 0.2: peaked attention and logits, so a wrong mask, position or window changes tokens
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)

FAMILIES = {
    "llama3": (LlamaForCausalLM, lambda: LlamaConfig(**SMALL, num_hidden_layers=2, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen2.5": (Qwen2ForCausalLM, lambda: Qwen2Config(**SMALL, num_hidden_layers=2, tie_word_embeddings=True)),
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(**SMALL, num_hidden_layers=2, head_dim=16)),
    "mistral-sliding": (MistralForCausalLM, lambda: MistralConfig(**SMALL, num_hidden_layers=2, head_dim=16,
                                                                  sliding_window=WINDOW)),
    "gemma3-text": (Gemma3ForCausalLM, lambda: Gemma3TextConfig(
        **SMALL, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"])),
}
SLIDING = ("mistral-sliding", "gemma3-text")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: on a shared 2-core box a second intra-op thread makes each op ~40x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    name = request.param
    model_class, config = FAMILIES[name]
    torch.manual_seed(0)
    return name, model_class(config()).float().eval()


def Driver(model, tokenizer, **kwargs) -> EngineDriver:
    return EngineDriver(model, tokenizer, context_length=256, max_tokens=NEW, **kwargs)


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def reference(model, prompt, n=NEW):
    """Greedy tokens of plain transformers: the whole sequence every step, no KV cache."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
    return ids[len(prompt):]


def alone(model, tokenizer, prompt, max_tokens=NEW, **kwargs):
    driver = Driver(model, tokenizer, **kwargs)
    request = driver.submit(prompt, max_tokens=max_tokens)
    driver.run()
    return driver.tokens(request)


@pytest.mark.parametrize("family", SLIDING, indirect=True)
def test_the_sliding_window_changes_the_reference(family):
    """The window matters for the prompts used here, so the tests below check it is honoured."""
    _, model = family
    wide = copy.deepcopy(model)
    wide.config.sliding_window = 10 ** 6  # every layer attends to the whole prompt
    ps = prompts(LENGTHS)
    assert [reference(model, p) for p in ps] != [reference(wide, p) for p in ps]
    short = [p for p in ps if len(p) < WINDOW]
    assert [reference(model, p, 1) for p in short] == [reference(wide, p, 1) for p in short]  # within it


def test_every_family_steps_on_the_engines_own_logits_rows(family, smollm_tokenizer):
    """The equalities here hold on HostLogits' rows (engine/host_logits.py) in every family: each
    step's logits, batched or alone, are the rows the head wrote, not a tensor of the model's."""
    _, model = family
    seen = []
    driver = Driver(model, smollm_tokenizer, logits_hooks=[lambda logits, seqs: seen.append(host_rows(logits))])
    for p in prompts(LENGTHS[:3]):
        driver.submit(p, max_tokens=3)
    driver.run()
    assert len(seen) >= 3 and all(rows is not None and rows.shape[1] == VOCAB for rows in seen)
    assert max(rows.shape[0] for rows in seen) == 3


def test_eight_rows_batched_equal_each_alone_and_plain_transformers(family, smollm_tokenizer):
    _, model = family
    ps = prompts(LENGTHS)
    n = 2 * NEW  # rows join one a step (longer prompts in chunks): the first is still running when the last joins
    expected = [reference(model, p, n) for p in ps]
    assert [alone(model, smollm_tokenizer, p, n) for p in ps] == expected
    driver = Driver(model, smollm_tokenizer, prefill_chunk=16)  # the longer prompts prefill in chunks
    requests = [driver.submit(p, max_tokens=n) for p in ps]
    sizes = []
    driver.engine._drain_inbox()
    while driver.engine._running or driver.engine._waiting:
        driver.engine.step()
        driver.engine.check_integrity()
        sizes.append(len(driver.engine.scheduler.rows))
    assert max(sizes) == 8, "all eight rows should have decoded together"
    assert [driver.tokens(r) for r in requests] == expected


def test_prefix_cache_hits_give_the_tokens_of_a_miss(family, smollm_tokenizer):
    """A sibling sharing a 30-token prefix (longer than the window) hits the KV cached at its prefill;
    the next turn of a conversation hits the KV of the earlier turn's output too, cut out of a
    batch row's slot (a longer request ran beside it)."""
    _, model = family
    shared, first_tail, sibling_tail, turn_tail, long = prompts((30, 5, 7, 4, 44), seed=1)
    first = shared + first_tail
    driver = Driver(model, smollm_tokenizer, prefix_cache_bytes=16 << 20)
    earlier, beside = driver.submit(first), driver.submit(long)
    driver.run()
    assert driver.tokens(earlier) == reference(model, first)
    sibling = shared + sibling_tail
    turn = first + driver.tokens(earlier) + turn_tail
    hits = [driver.submit(sibling), driver.submit(turn)]
    driver.run()
    assert driver.last(hits[0]).cached_tokens >= len(shared), "the shared prefix should have been a cache hit"
    assert driver.last(hits[1]).cached_tokens >= len(first) + NEW - 1, "the earlier turn should have been a hit"
    misses = [alone(model, smollm_tokenizer, p) for p in (sibling, turn)]
    assert [driver.tokens(r) for r in hits] == misses == [reference(model, p) for p in (sibling, turn)]


def test_a_forced_run_gives_the_tokens_of_feeding_it(family, smollm_tokenizer):
    """Forced tokens enter the KV one step at a time while other rows decode; the continuation must be
    that of the same tokens fed as prompt, and of plain transformers."""
    _, model = family
    ps = prompts((6, 13, 26), seed=2)
    forced_run = prompts((5,), seed=3)[0]
    driver = Driver(model, smollm_tokenizer)
    forced = driver.submit(ps[2], constraint=ForcesRun(forced_run), max_tokens=NEW + len(forced_run))
    free = [driver.submit(p) for p in ps[:2]]
    driver.run()
    tokens = driver.tokens(forced)
    assert tokens[1:1 + len(forced_run)] == forced_run
    fed, rest = ps[2] + tokens[:1 + len(forced_run)], tokens[1 + len(forced_run):]
    assert rest == alone(model, smollm_tokenizer, fed)[:NEW - 1] == reference(model, fed, NEW - 1)
    assert tokens[0] == reference(model, ps[2], 1)[0]
    assert [driver.tokens(r) for r in free] == [reference(model, p) for p in ps[:2]]


def test_decode_passes_run_the_lean_decode_step(family, smollm_tokenizer):
    """Rows feeding one token go through engine/decode_step.py, not the packed forward: the equalities
    above are of that step against plain transformers."""
    _, model = family
    driver = Driver(model, smollm_tokenizer)
    for p in prompts(LENGTHS[:3]):
        driver.submit(p)
    driver.run()
    runner = driver.engine.runner
    assert runner.decode is not None and runner.decode_passes >= NEW - 1
    assert runner.decode_passes < runner.forward_passes  # the prompts went through the packed forward


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("inductor")


def test_the_compiled_step_gives_the_eager_tokens(family, smollm_tokenizer, inductor_cache):
    """The decode step compiled (engine/step_compiler.py, when the engine is made) decodes eight rows
    batched, and each alone, to plain transformers' tokens; no pass falls back to eager."""
    _, model = family
    ps = prompts(LENGTHS)
    expected = [reference(model, p) for p in ps]
    driver = Driver(model, smollm_tokenizer, compile_step=True, compile_cache=str(inductor_cache))
    compiler = driver.engine.step_compiler
    assert compiler.error is None and compiler.compiled is not None
    requests = [driver.submit(p) for p in ps]
    driver.run()
    assert [driver.tokens(r) for r in requests] == expected
    for p, tokens in zip(ps[:3], expected[:3]):
        request = driver.submit(p)
        driver.run()
        assert driver.tokens(request) == tokens
    assert compiler.fallbacks == 0 and driver.engine.runner.decode_passes > 0


def test_layers_are_grouped_alike_for_one_compiled_region():
    """engine/decode_step.py compiles a group of layers per call: the most layers (up to 6) that cut
    the model into groups whose layers' attention kinds run alike."""
    from engine.decode_step import group_size

    full, sliding = ("full_attention", None), ("sliding_attention", 512)
    assert group_size((full,) * 30) == 6  # SmolLM2
    assert group_size(((sliding,) * 5 + (full,)) * 3) == 6  # Gemma 3 270M's pattern
    assert group_size((sliding, sliding, full, sliding)) == 4  # one group: nothing to be alike with
    assert group_size((full,) * 28) == 4 and group_size((full,) * 7) == 1
    assert group_size(((sliding,) * 2 + (full,)) * 4) == 6 and group_size(((sliding,) * 2 + (full,)) * 3) == 3


def test_a_step_of_several_compiled_groups_gives_the_eager_tokens(smollm_tokenizer, inductor_cache, monkeypatch):
    """Gemma 3 layers cut into two compiled groups of two (sliding, full): eight rows batched give
    plain transformers' tokens, with no pass run eagerly."""
    import engine.decode_step

    monkeypatch.setattr(engine.decode_step, "GROUP", 2)
    torch.manual_seed(0)
    config = Gemma3TextConfig(**SMALL, num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16,
                              sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"] * 2)
    model = Gemma3ForCausalLM(config).float().eval()
    ps = prompts(LENGTHS)
    expected = [reference(model, p) for p in ps]
    driver = Driver(model, smollm_tokenizer, compile_step=True, compile_cache=str(inductor_cache))
    compiler, step = driver.engine.step_compiler, driver.engine.runner.decode
    assert compiler.error is None and step.group == 2 and len(step.spans) == 2
    requests = [driver.submit(p) for p in ps]
    driver.run()
    assert [driver.tokens(r) for r in requests] == expected
    assert compiler.fallbacks == 0 and driver.engine.runner.decode_passes > 0


def test_the_decode_step_on_quantized_layers_gives_the_packed_forwards_tokens(family, smollm_tokenizer):
    """Quantized (int4, engine/quantized_linear.py), each family's decode step reads its fused
    q/k/v and gate/up copies; its tokens are those of the same model run packed every pass."""
    from engine.quantized_linear import quantize_model

    _, model = family
    quantized = copy.deepcopy(model)
    quantize_model(quantized, "int4", torch.float32)
    assert hasattr(quantized.model.layers[0].self_attn, "maskd_qkv")
    assert hasattr(quantized.model.layers[0].mlp, "maskd_gate_up")
    ps = prompts(LENGTHS[:4], seed=4)
    packed = [alone(quantized, smollm_tokenizer, p, decode_step=False) for p in ps]
    driver = Driver(quantized, smollm_tokenizer)
    requests = [driver.submit(p) for p in ps]
    driver.run()
    assert driver.engine.runner.decode_passes > 0
    assert [driver.tokens(r) for r in requests] == packed

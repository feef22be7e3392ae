"""The scheduler on a tiny random-weight Llama, stepped by hand (no engine thread) so that the
order of joins, leaves and prefill chunks is exact. check_integrity() runs after every step."""

import pytest
import torch
from fastapi.testclient import TestClient
from transformers import LlamaConfig, LlamaForCausalLM

from engine.engine import Engine
from engine.scheduler import QueueFull
from engine_fixtures import Driver as EngineDriver

VOCAB = 49152
EOS = frozenset({2})


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.2)  # peaked attention: a wrong position or mask changes tokens
    return LlamaForCausalLM(config).eval()


def Driver(model, tokenizer, **kwargs) -> EngineDriver:
    return EngineDriver(model, tokenizer, context_length=1024, eos=EOS, **kwargs)


def prompts(n_tokens=(7, 19, 3, 40), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, VOCAB, (n,), generator=g).tolist() for n in n_tokens]


def alone(model, tokenizer, prompt, **params):
    driver = Driver(model, tokenizer)
    request = driver.submit(prompt, **params)
    driver.run()
    return driver.tokens(request)


def test_batched_greedy_equals_serial_with_rows_joining_mid_flight(tiny_model, smollm_tokenizer):
    ps = prompts()
    serial = [alone(tiny_model, smollm_tokenizer, p, max_tokens=12) for p in ps]
    driver = Driver(tiny_model, smollm_tokenizer)
    first = driver.submit(ps[0], max_tokens=12)
    for _ in range(4):
        driver.step()
    rest = [driver.submit(p, max_tokens=12) for p in ps[1:]]  # join while the first one decodes
    sizes = []
    while not all(driver.done(r) for r in [first, *rest]):
        driver.step()
        sizes.append(len(driver.engine.scheduler.rows))
    assert [driver.tokens(r) for r in [first, *rest]] == serial
    assert max(sizes) == 4, "all four rows should have decoded together"
    assert len(driver.engine.scheduler.rows) == 0


def test_seeded_sampling_is_per_row(tiny_model, smollm_tokenizer):
    ps = prompts((5, 11, 17))
    serial = [alone(tiny_model, smollm_tokenizer, p, max_tokens=10, temperature=1.0, seed=7 + i)
              for i, p in enumerate(ps)]
    driver = Driver(tiny_model, smollm_tokenizer)
    requests = [driver.submit(p, max_tokens=10, temperature=1.0, seed=7 + i) for i, p in enumerate(ps)]
    driver.run()
    assert [driver.tokens(r) for r in requests] == serial


def test_a_prefill_chunk_adds_one_pass_beside_the_running_rows(tiny_model, smollm_tokenizer):
    short, long = prompts((4, 30))
    expected = alone(tiny_model, smollm_tokenizer, long, max_tokens=5)
    driver = Driver(tiny_model, smollm_tokenizer, prefill_chunk=8)
    running = driver.submit(short, max_tokens=40)
    driver.step()
    newcomer = driver.submit(long, max_tokens=5)
    counts = []
    for _ in range(4):  # 29 tokens (all but the last) in chunks of 8: four steps of prefill
        before = len(driver.tokens(running))
        passes = driver.engine.runner.forward_passes
        driver.step()
        counts.append((len(driver.tokens(running)) - before, driver.engine.runner.forward_passes - passes))
    assert counts == [(1, 2)] * 4, "each step: the chunk's pass, then the running row's, which gets a token"
    assert len(driver.tokens(newcomer)) == 1  # its last prompt token fed in the rows' pass of the last chunk's step
    driver.run()
    assert driver.tokens(newcomer) == expected


def test_a_prompt_read_from_the_prefix_cache_gives_the_logits_of_one_prefilled(tiny_model, smollm_tokenizer):
    """Cold (prefilled in chunks) and warm (all but its last token read from the prefix cache), a
    prompt's first logits are the same bits: its last token takes the rows' pass either way. Then a
    greedy request gives the same tokens whenever it comes."""
    first = {}

    def record(logits, seqs):
        for row, seq in zip(logits, seqs):
            first.setdefault(seq.request.request_id, row.clone())

    driver = Driver(tiny_model, smollm_tokenizer, prefill_chunk=8, prefix_cache_bytes=16 << 20, logits_hooks=[record])
    prompt = prompts((30,), seed=11)[0]
    cold = driver.submit(prompt, max_tokens=6)
    driver.run()
    warm = driver.submit(prompt, max_tokens=6)
    driver.run()
    assert driver.last(cold).cached_tokens == 0 and driver.last(warm).cached_tokens == 29
    assert torch.equal(first[cold.request_id], first[warm.request_id])
    assert driver.tokens(cold) == driver.tokens(warm)


def test_a_rows_logits_do_not_depend_on_a_forced_run_beside_it(tiny_model, smollm_tokenizer):
    """A row feeding one token beside a row feeding a forced run gets the logits it gets alone: the
    run goes through a packed pass of its own, the single tokens through the decode step (on a
    served model the two paths round differently). The model is int4, as served on CPU: its kernel
    gives a row the same bits whatever rows share the call (float32 matmuls do not: one row and
    two take different kernels)."""
    import copy

    from engine.quantized_linear import quantize_model
    from engine_fixtures import ForcesRun

    model = copy.deepcopy(tiny_model)
    quantize_model(model, "int4", torch.bfloat16)
    seen = []

    def record(logits, seqs):
        seen.extend((seq.request.request_id, row.clone()) for row, seq in zip(logits, seqs))

    a, b = prompts((12, 9), seed=12)
    run = prompts((5,), seed=13)[0]
    logits, decode_passes = [], []
    for beside in (False, True):
        seen.clear()
        driver = Driver(model, smollm_tokenizer, logits_hooks=[record])
        plain = driver.submit(a, max_tokens=6)
        if beside:  # its first token beside the plain row's, then that token and the run beside its second
            driver.submit(b, constraint=ForcesRun(run), max_tokens=3 + len(run))
        driver.run()
        logits.append([row for rid, row in seen if rid == plain.request_id])
        decode_passes.append(driver.engine.runner.decode_passes)
    assert decode_passes == [6, 6]  # every pass of the plain row's went through the decode step
    assert len(logits[0]) == len(logits[1]) == 6
    assert all(torch.equal(x, y) for x, y in zip(*logits))


def test_cancel_frees_the_row_and_the_prefix_lock_within_one_step(tiny_model, smollm_tokenizer):
    driver = Driver(tiny_model, smollm_tokenizer, prefix_cache_bytes=16 << 20)
    a, b = prompts((12, 9))
    keep, drop = driver.submit(a, max_tokens=50), driver.submit(b, max_tokens=50)
    for _ in range(4):
        driver.step()
    assert len(driver.engine.scheduler.rows) == 2
    driver.engine.cancel(drop.request_id)
    driver.step()
    assert driver.last(drop).finish_reason == "cancelled"
    assert len(driver.engine.scheduler.rows) == 1 and driver.engine._running[0].request is keep
    cache = driver.engine.scheduler.prefix_cache
    assert sum(c.lock_ref for c in cache.root.children.values()) == 1  # only `keep` still locks
    driver.engine.cancel(keep.request_id)
    driver.step()
    assert len(driver.engine.scheduler.rows) == 0 and cache.evictable_bytes == cache.size_bytes


def test_prefix_cache_hit_gives_identical_output_and_reports_cached_tokens(tiny_model, smollm_tokenizer):
    system, q1, q2 = prompts((60, 6, 9), seed=3)
    expected = alone(tiny_model, smollm_tokenizer, system + q2, max_tokens=10)
    driver = Driver(tiny_model, smollm_tokenizer, prefix_cache_bytes=16 << 20, prefill_chunk=16)
    first = driver.submit(system + q1, max_tokens=10)
    driver.run()
    second = driver.submit(system + q2, max_tokens=10)
    again = driver.submit(system + q2, max_tokens=10)
    driver.run()
    assert driver.last(first).cached_tokens == 0
    assert driver.last(second).cached_tokens == len(system)
    assert driver.last(again).cached_tokens >= len(system + q2) - 1  # the prompt was cached at its prefill's end
    assert driver.tokens(second) == expected and driver.tokens(again) == expected
    metrics = driver.engine.metrics.render().decode()
    assert "maskd_cached_prompt_tokens_total" in metrics and "maskd_prefix_cache_hit_ratio" in metrics


def test_tiny_budget_evicts_and_keeps_integrity(tiny_model, smollm_tokenizer):
    per_token = 2 * 2 * 2 * 16 * 4  # layers * (k, v) * kv heads * head dim * fp32
    driver = Driver(tiny_model, smollm_tokenizer, prefix_cache_bytes=50 * per_token)
    requests = [driver.submit(p, max_tokens=6) for p in prompts((30, 25, 40, 10), seed=5)]
    driver.run()
    cache = driver.engine.scheduler.prefix_cache
    assert all(driver.last(r).finish_reason == "length" for r in requests)
    assert 0 < cache.size_bytes <= cache.budget_bytes and cache.evicted_tokens > 0


def test_full_queue_raises_and_the_server_answers_429(tiny_model, smollm_tokenizer):
    driver = Driver(tiny_model, smollm_tokenizer, max_waiting=2)
    driver.submit([5, 6, 7])
    driver.submit([5, 6, 8])
    with pytest.raises(QueueFull, match="max-waiting"):
        driver.submit([5, 6, 9])
    from server.app import create_app
    from server.state import ServerState
    engine = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), EOS, context_length=1024, max_waiting=0)
    state = ServerState(model_name="tiny", tokenizer=smollm_tokenizer, context_length=1024,
                        tool_format="hermes", engine=engine)
    with TestClient(create_app(state)) as http:
        for stream in (False, True):
            reply = http.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
            assert reply.status_code == 429
            assert reply.json()["error"]["type"] == "rate_limit_error"
            assert reply.json()["error"]["code"] == "queue_full"
            assert reply.headers["Retry-After"] == "1"
        assert "maskd_requests_rejected_total 2.0" in http.get("/metrics").text
        assert http.get("/debug/integrity").json()["ok"] is True


def test_a_request_without_max_tokens_gets_the_server_default(tiny_model, smollm_tokenizer):
    from server.app import create_app
    from server.state import ServerState
    engine = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), EOS, context_length=1024)
    state = ServerState(model_name="tiny", tokenizer=smollm_tokenizer, context_length=1024,
                        tool_format="hermes", engine=engine, default_max_tokens=5)
    with TestClient(create_app(state)) as http:
        reply = http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True})
        assert reply.json()["usage"]["completion_tokens"] == 5
        assert reply.json()["choices"][0]["finish_reason"] == "length"
        asked = http.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True, "max_tokens": 7})
        assert asked.json()["usage"]["completion_tokens"] == 7  # a client's own max_tokens is not capped


def test_a_burst_of_short_prompts_prefills_in_one_pass(tiny_model, smollm_tokenizer):
    """Four prompts arriving together share one step's prefill budget: one packed pass of their
    prompts, one pass of their last tokens, four first tokens, each row's tokens those it gives alone."""
    ps = prompts((9, 14, 5, 20), seed=9)
    serial = [alone(tiny_model, smollm_tokenizer, p, max_tokens=6) for p in ps]
    driver = Driver(tiny_model, smollm_tokenizer, prefill_chunk=64)
    requests = [driver.submit(p, max_tokens=6) for p in ps]
    driver.step()
    assert driver.engine.runner.forward_passes == 2
    assert [len(driver.tokens(r)) for r in requests] == [1, 1, 1, 1]
    driver.run()
    assert [driver.tokens(r) for r in requests] == serial


def test_a_prompt_over_the_budget_waits_its_turn_in_the_same_pass(tiny_model, smollm_tokenizer):
    """Budget 16 a step: the first prompt (11 tokens before its last) and 5 of the second (9 before
    its last) go in the first prefill pass."""
    a, b = prompts((12, 10), seed=10)
    driver = Driver(tiny_model, smollm_tokenizer, prefill_chunk=16)
    first, second = driver.submit(a, max_tokens=4), driver.submit(b, max_tokens=4)
    driver.step()
    assert len(driver.tokens(first)) == 1 and not driver.tokens(second)
    assert len(driver.engine.scheduler.prefilling[0].next_input) == 5
    driver.run()
    assert driver.tokens(second) == alone(tiny_model, smollm_tokenizer, b, max_tokens=4)

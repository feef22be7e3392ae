"""What the engine reports beside the tokens (logprobs, the stop string that ended a request) and the
presence / frequency penalties, on the tiny random-weight Llama of engine_fixtures."""

import asyncio
import math

import torch

from engine.engine import Engine
from engine.logprobs import TokenLogprob
from engine.sampling import SamplingParams
from engine.sequence import Request
from engine_fixtures import ForcesRun, engine, only_tokens, prompt, run, run_hooked, tiny_model  # noqa: F401 (fixtures)


def recording(seen):
    """A logits hook that keeps a copy of row 0's logits as the hooks see them."""
    def hook(logits, seqs):  # logits [B, V]
        seen.append(logits[0].clone())
    return hook


def test_penalties_match_a_hand_reference_before_the_hooks_and_count_forced_tokens(tiny_model, smollm_tokenizer):
    forced = smollm_tokenizer.encode(" fox", add_special_tokens=False)[0]
    seen = []
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, presence_penalty=0.7, frequency_penalty=0.4)
    ids = prompt(smollm_tokenizer)
    eng = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), 512, logits_hooks=[recording(seen)])
    eng.start()
    try:
        events = run(eng, Request(prompt_ids=ids, params=params, constraint=ForcesRun([forced])))
    finally:
        eng.shutdown()
    tokens = [t for e in events for t in e.token_ids]
    out = []
    with torch.no_grad():
        for step, hooked in enumerate(seen):  # the hooks saw the penalised logits of each step
            expected = tiny_model(torch.tensor([ids + out])).logits[0, -1]
            for token in set(out):
                expected[token] -= 0.4 * out.count(token) + 0.7
            torch.testing.assert_close(hooked, expected, atol=1e-4, rtol=0)
            out.append(int(expected.argmax()))
            if step == 0:
                out.append(forced)  # counted like any output token
    assert tokens == out[:10] and tokens[1] == forced


def test_a_large_penalty_stops_greedy_repeats(engine, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)

    def greedy(**penalty):
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, **penalty)
        return [t for e in run(engine, Request(prompt_ids=ids, params=params)) for t in e.token_ids]

    free = greedy()
    assert len(set(free)) < len(free), "the tiny model should repeat itself unpenalised"
    for penalty in (dict(presence_penalty=100.0), dict(frequency_penalty=100.0)):
        penalised = greedy(**penalty)
        assert len(set(penalised)) == len(penalised) == 16
        first_repeat = next(i for i, t in enumerate(free) if t in free[:i])
        assert penalised[:first_repeat] == free[:first_repeat]  # no penalty until a token repeats
    assert greedy() == free  # the penalties belonged to those requests alone


def test_logprobs_are_those_of_the_masked_logits_aligned_with_the_tokens(tiny_model, smollm_tokenizer):
    allowed = sorted(set(smollm_tokenizer.encode(" yes no maybe never always", add_special_tokens=False)))
    seen = []
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True, logprobs=20)
    events = run_hooked(tiny_model, smollm_tokenizer, lambda logits, seqs: (only_tokens(allowed)(logits, seqs),
                                                                             recording(seen)(logits, seqs)), params)
    assert all(len(e.logprobs) == len(e.token_ids) == 1 for e in events)  # the final event too
    assert events[-1].finish_reason == "length"
    for event, final in zip(events, seen):
        reference = torch.log_softmax(final.float(), dim=-1)  # no temperature
        (lp,) = event.logprobs
        assert lp.token_id == event.token_ids[0] and abs(lp.logprob - reference[lp.token_id].item()) < 1e-5
        assert len(lp.top) == len(allowed) and {t for t, _ in lp.top} == set(allowed)  # no masked token
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True) and abs(sum(math.exp(v) for v in values) - 1) < 1e-5


def test_logprobs_per_request_in_one_batch_against_a_full_forward(engine, tiny_model, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)

    async def together():
        async def collect(k):
            request = Request(prompt_ids=ids, params=SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=k))
            return [e async for e in engine.generate(request)]
        return await asyncio.gather(collect(4), collect(None), collect(0))
    four, none, zero = asyncio.run(together())
    tokens = [t for e in four for t in e.token_ids]
    assert [t for e in none for t in e.token_ids] == tokens == [t for e in zero for t in e.token_ids]
    assert all(e.logprobs is None for e in none)
    with torch.no_grad():
        for i, (event, event0) in enumerate(zip(four, zero)):
            reference = torch.log_softmax(tiny_model(torch.tensor([ids + tokens[:i]])).logits[0, -1], dim=-1)
            (lp,), (lp0,) = event.logprobs, event0.logprobs
            assert abs(lp.logprob - reference[tokens[i]].item()) < 1e-4 and abs(lp0.logprob - lp.logprob) < 1e-6
            assert len(lp.top) == 4 and lp.top[0] == (tokens[i], lp.logprob)  # greedy: the likeliest
            assert all(abs(v - reference[t].item()) < 1e-4 for t, v in lp.top)
            assert {t for t, _ in lp.top} == set(torch.topk(reference, 4).indices.tolist())
            assert lp0.top == []


def test_forced_tokens_have_logprob_zero(tiny_model, smollm_tokenizer):
    forced = smollm_tokenizer.encode(" fox", add_special_tokens=False)[0]
    eng = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), 512)
    eng.start()
    try:
        events = run(eng, Request(prompt_ids=prompt(smollm_tokenizer), constraint=ForcesRun([forced]),
                                  params=SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=2)))
    finally:
        eng.shutdown()
    lps = [lp for e in events for lp in e.logprobs]
    assert [lp.token_id for lp in lps] == [t for e in events for t in e.token_ids] and lps[1].token_id == forced
    assert lps[1] == TokenLogprob(forced, 0.0, [(forced, 0.0)])
    assert all(lp.logprob < 0 and len(lp.top) == 2 for i, lp in enumerate(lps) if i != 1)


def test_the_stop_string_that_ended_the_request_is_reported(engine, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)
    free = run(engine, Request(prompt_ids=ids, params=SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)))
    text = "".join(e.text for e in free)
    early, late = text[5:8], text[12:15]
    assert early.strip() and late not in text[:12] and early not in text[:5]
    events = run(engine, Request(prompt_ids=ids, params=SamplingParams(
        max_tokens=20, temperature=0, stop=["never in this text \x00", late, early])))
    assert events[-1].finish_reason == "stop" and events[-1].stop_string == early  # the one that matched, wherever listed
    assert all(e.stop_string is None for e in events[:-1])
    assert all(e.stop_string is None for e in free)


def test_stop_token_ids_end_generation_even_with_ignore_eos(engine, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)
    free = [t for e in run(engine, Request(prompt_ids=ids, params=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)))
            for t in e.token_ids]
    at = next(i for i, t in enumerate(free) if i >= 3 and t not in free[:i])
    events = run(engine, Request(prompt_ids=ids, params=SamplingParams(
        max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=[free[at]])))
    assert [t for e in events for t in e.token_ids] == free[:at + 1]
    assert events[-1].finish_reason == "stop" and events[-1].completion_tokens == at + 1
    assert "".join(e.text for e in events) == smollm_tokenizer.decode(free[:at], skip_special_tokens=True)
    assert events[-1].stop_string is None

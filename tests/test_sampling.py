import torch

from engine.sampling import SamplingParams, sample, sample_row


def _logits(seed=0, vocab=1000):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed))


def _draws(params, logits, n=20):
    generator = params.make_generator()
    return [sample_row(logits, params, generator) for _ in range(n)]


def test_greedy_is_argmax_per_row():
    logits = torch.stack([_logits(1), _logits(2)])
    params = [SamplingParams(temperature=0.0)] * 2
    assert sample(logits, params, [None, None]) == logits.argmax(-1).tolist()


def test_same_seed_same_tokens_other_seed_other_tokens():
    logits = _logits() * 0.1  # nearly flat: draws vary
    a = _draws(SamplingParams(temperature=1.0, seed=7), logits)
    b = _draws(SamplingParams(temperature=1.0, seed=7), logits)
    c = _draws(SamplingParams(temperature=1.0, seed=8), logits)
    assert a == b and a != c


def test_top_k_limits_support():
    logits = _logits()
    allowed = set(torch.topk(logits, 5).indices.tolist())
    draws = _draws(SamplingParams(temperature=2.0, top_k=5, seed=1), logits, n=200)
    assert set(draws) <= allowed and len(set(draws)) > 1


def test_top_p_keeps_the_nucleus_only():
    logits = torch.full((100,), -10.0)
    logits[[3, 4]] = torch.tensor([5.0, 4.9])  # together nearly all the mass
    draws = _draws(SamplingParams(temperature=1.0, top_p=0.9, seed=3), logits, n=200)
    assert set(draws) == {3, 4}
    draws = _draws(SamplingParams(temperature=1.0, top_p=0.01, seed=3), logits, n=50)
    assert set(draws) == {3}


def test_masked_tokens_are_never_sampled():
    logits = _logits()
    logits[::2] = float("-inf")
    draws = _draws(SamplingParams(temperature=1.5, seed=5), logits, n=300)
    assert all(token % 2 == 1 for token in draws)


def test_penalties_subtract_frequency_times_count_plus_presence():
    from engine.penalties import TokenPenalties
    penalties = TokenPenalties(presence=0.5, frequency=0.25)
    for token in [3, 3, 7, 3]:
        penalties.add(token)
    logits = torch.zeros(2, 10)
    penalties.apply(logits[1])
    expected = torch.zeros(10)
    expected[3], expected[7] = -(0.25 * 3 + 0.5), -(0.25 * 1 + 0.5)
    assert torch.equal(logits[1], expected) and torch.equal(logits[0], torch.zeros(10))
    penalties.add(7)  # counted incrementally: only token 7's entry changes
    logits = torch.full((10,), float("-inf"))
    logits[7] = 2.0
    penalties.apply(logits)
    assert logits[7] == 2.0 - (0.25 * 2 + 0.5) and logits[3] == float("-inf")  # a masked token stays masked


def test_no_penalties_no_state():
    from engine.penalties import make_penalties
    assert make_penalties(SamplingParams()) is None
    assert make_penalties(SamplingParams(presence_penalty=0.1)) is not None
    assert make_penalties(SamplingParams(frequency_penalty=-0.1)) is not None


def test_logprobs_out_of_range_is_refused_with_the_range():
    import pytest
    with pytest.raises(ValueError, match="between 0 and 20"):
        SamplingParams(logprobs=21)
    with pytest.raises(ValueError, match="between 0 and 20"):
        SamplingParams(logprobs=-1)


class _Row:
    def __init__(self, logprobs):
        self.params = SamplingParams(logprobs=logprobs)


def test_step_logprobs_batched_over_the_rows_that_asked():
    from engine.logprobs import step_logprobs
    logits = torch.stack([_logits(1, 50), _logits(2, 50), _logits(3, 50), _logits(4, 50)])  # [4, 50]
    logits[2, 10:] = float("-inf")  # a tight mask: 10 tokens left
    rows = [_Row(3), _Row(None), _Row(20), _Row(0)]
    tokens = [5, 6, 7, 8]
    out = step_logprobs(logits, rows, tokens)
    assert out[1] is None
    for row in (0, 2, 3):
        reference = torch.log_softmax(logits[row], dim=-1)
        assert out[row].token_id == tokens[row]
        assert abs(out[row].logprob - reference[tokens[row]].item()) < 1e-6
        for token, logprob in out[row].top:
            assert abs(logprob - reference[token].item()) < 1e-6
        logprobs = [lp for _, lp in out[row].top]
        assert logprobs == sorted(logprobs, reverse=True)
    assert [t for t, _ in out[0].top] == torch.topk(logits[0], 3).indices.tolist()
    assert len(out[2].top) == 10 and all(t < 10 for t, _ in out[2].top)  # masked tokens never listed
    assert out[3].top == []
    assert step_logprobs(logits, [_Row(None)] * 4, tokens) is None


def test_forced_logprob_is_certain():
    from engine.logprobs import TokenLogprob, forced_logprob
    assert forced_logprob(9, 2) == TokenLogprob(9, 0.0, [(9, 0.0)])
    assert forced_logprob(9, 0) == TokenLogprob(9, 0.0, [])

import pytest
import torch

from engine.sampling import SamplingParams, choose, sample


def _logits(seed=0, vocab=1000):
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed))


def _draws(params, logits, n=20):
    """n steps of one row alone; logits [V]."""
    generator = params.make_generator()
    return [sample(logits[None], [params], [generator])[0] for _ in range(n)]


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


@pytest.mark.parametrize("target", [SamplingParams(temperature=1.0, seed=7),  # no cut, batched with cuts
                                    SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=7),
                                    SamplingParams(temperature=1.1, top_p=0.7, seed=7)])
def test_a_seeded_row_draws_the_same_alone_and_in_a_mixed_batch(target):
    others = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, top_p=0.8, seed=1),
              SamplingParams(temperature=1.3, top_k=300, seed=2), SamplingParams(top_k=1)]
    alone_gen = target.make_generator()
    batch_params = [others[0], others[1], target, others[2], others[3]]  # the seeded row third of 5
    # batched, a top_k target shares a topk 300 wide, a top_p one a sort, a cut-free one is beside both
    batch_gens = [p.make_generator() for p in batch_params]
    alone, batched = [], []
    for step in range(30):
        logits = torch.stack([_logits(100 * step + row) * 0.3 for row in range(5)])  # [5, 1000], flat-ish
        alone += sample(logits[2:3].clone(), [target], [alone_gen])
        tokens = sample(logits, batch_params, batch_gens)
        batched.append(tokens[2])
        assert tokens[0] == logits[0].argmax() and tokens[4] == logits[4].argmax()  # greedy rows
        assert tokens[3] in torch.topk(logits[3], 300).indices.tolist()
    assert alone == batched and len(set(alone)) > 10


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_draws_follow_the_tempered_distribution():
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0])
    params = SamplingParams(temperature=0.7, seed=11)
    generator = params.make_generator()
    n = 2000  # one batch of n rows sharing one stream: n independent draws
    tokens = sample(logits.expand(n, 5).clone(), [params] * n, [generator] * n)
    counts = torch.bincount(torch.tensor(tokens), minlength=5).float()
    # 4 degrees of freedom: 18.5 is the 0.1% tail; 25 is loose yet fails a wrong temperature
    assert _chi_square(counts, torch.softmax(logits / 0.7, -1)) < 25
    assert _chi_square(counts, torch.softmax(logits, -1)) > 25  # the test can fail
    assert _chi_square(counts, torch.softmax(logits / 0.5, -1)) > 25


def test_top_k_limits_support():
    logits = _logits()
    allowed = set(torch.topk(logits, 5).indices.tolist())
    draws = _draws(SamplingParams(temperature=2.0, top_k=5, seed=1), logits, n=200)
    assert set(draws) <= allowed and len(set(draws)) > 1


def test_top_k_2_never_leaves_the_top_2():
    logits = _logits() * 0.01  # nearly flat: without the cut, any of 1000 tokens
    allowed = set(torch.topk(logits, 2).indices.tolist())
    draws = _draws(SamplingParams(temperature=1.0, top_k=2, seed=4), logits, n=300)
    assert set(draws) == allowed


def test_top_k_keeps_the_tokens_tied_with_the_kth():
    logits = torch.full((1000,), -5.0)
    logits[[10, 20, 30, 40]] = torch.tensor([3.0, 2.0, 2.0, 2.0])  # ranks 2-4 tied
    draws = _draws(SamplingParams(temperature=1.0, top_k=2, seed=6), logits, n=300)
    assert set(draws) == {10, 20, 30, 40}  # a threshold, not a tie order: the same in any batch


def test_top_p_keeps_the_nucleus_only():
    logits = torch.full((100,), -10.0)
    logits[[3, 4]] = torch.tensor([5.0, 4.9])  # together nearly all the mass
    draws = _draws(SamplingParams(temperature=1.0, top_p=0.9, seed=3), logits, n=200)
    assert set(draws) == {3, 4}
    draws = _draws(SamplingParams(temperature=1.0, top_p=0.01, seed=3), logits, n=50)
    assert set(draws) == {3}


@pytest.mark.parametrize("top_p, kept", [(0.45, {0}), (0.6, {0, 1}), (0.85, {0, 1, 2}), (0.0, {0})])
def test_top_p_keeps_the_first_token_past_p(top_p, kept):
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()  # the mass before each: 0, 0.5, 0.8, 0.95
    draws = _draws(SamplingParams(temperature=1.0, top_p=top_p, seed=9), logits, n=300)
    assert set(draws) == kept


def test_masked_tokens_are_never_sampled():
    logits = _logits()
    logits[::2] = float("-inf")
    draws = _draws(SamplingParams(temperature=1.5, seed=5), logits, n=300)
    assert all(token % 2 == 1 for token in draws)
    for params in [SamplingParams(temperature=3.0, top_k=700, seed=5), SamplingParams(top_p=0.999, seed=5)]:
        draws = _draws(params, logits, n=300)  # the cuts reach past the allowed tokens
        assert all(token % 2 == 1 for token in draws) and len(set(draws)) > 50


def test_a_row_with_one_allowed_token_gets_it_whatever_its_params():
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=5.0, seed=1),
              SamplingParams(temperature=2.0, top_k=3, seed=2), SamplingParams(top_p=0.1, seed=3),
              SamplingParams(temperature=0.3, top_k=40, top_p=0.5, seed=4)]
    logits = torch.full((5, 1000), float("-inf"))
    allowed = [17, 999, 0, 512, 3]
    for step in range(20):
        generators = [p.make_generator() for p in params]
        logits[range(5), allowed] = torch.randn(5) * 100
        assert sample(logits, params, generators) == allowed


def test_one_host_sync_per_call(monkeypatch):
    """Counts the tensor -> host conversions sample() makes: only its final .tolist(). A numpy view
    of a tensor already on the CPU (its argmax) copies nothing and waits for nothing: not counted."""
    calls = []
    for name in ["tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"]:
        original = getattr(torch.Tensor, name)
        def counted(self, *args, _name=name, _original=original, **kwargs):
            if not (_name == "numpy" and self.device.type == "cpu"):
                calls.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9, seed=1),
              SamplingParams(top_k=5, seed=2), SamplingParams(temperature=1.2, seed=3)]
    generators = [p.make_generator() for p in params]
    logits = torch.randn(4, 1000)
    tokens = sample(logits, params, generators)
    assert calls == ["tolist"] and len(tokens) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_choose_does_not_sync_on_cuda():
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9, seed=1),
              SamplingParams(top_k=5, seed=2), SamplingParams(temperature=1.2, seed=3)]
    generators = [p.make_generator("cuda") for p in params]
    logits = torch.randn(4, 1000, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = choose(logits, params, generators)  # [4] on the device
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.device.type == "cuda" and tokens[0].item() == logits[0].argmax().item()


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

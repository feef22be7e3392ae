"""The presence / frequency penalties, on the tiny random-weight Llama of engine_fixtures."""

import torch

from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.sequence import Request
from engine_fixtures import engine, prompt, run, tiny_model  # noqa: F401 (fixtures)


class ForcesOnce:
    """A free-text constraint that forces ``token`` once, right after the first sampled token."""
    budget_forced = False

    def __init__(self, token):
        self.token, self.advanced, self.done = token, 0, False

    def fill(self, row, budget=None):
        pass

    def advance(self, token):
        self.advanced += 1

    def forced(self):
        if self.advanced == 1 and not self.done:
            self.done = True
            return [self.token]
        return []

    def finished(self):
        return False

    def closed(self):
        return False

    def is_terminated(self):
        return False

    def min_tokens(self):
        return 0

    def free_text(self):
        return True


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
        events = run(eng, Request(prompt_ids=ids, params=params, constraint=ForcesOnce(forced)))
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

"""ConstraintMasker.ahead: each row's next mask looked up once its tokens are appended, taken by the
call after the next forward pass (engine/constraint_hook.py)."""

import asyncio
import json
from types import SimpleNamespace

import pytest
import torch

from engine.constraint_hook import ConstraintMasker
from engine.engine import Engine
from engine.sampling import Narrowed, SamplingParams
from engine.sequence import Request
from engine_fixtures import VOCAB, prompt, tiny_model  # noqa: F401 (fixtures)
from grammars.masks.sparse_mask import take_routine

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                           "units": {"enum": ["metric", "imperial"]}, "meta": {"type": "object"}},
          "required": ["city", "days", "units", "meta"], "additionalProperties": False}
BUDGETS = (20, 30, 70)  # the first two close the object under a narrowing budget


class Counting(ConstraintMasker):
    """Counts the constrained rows it masks and those whose mask it took from ``ahead``."""

    def __init__(self, *args):
        super().__init__(*args)
        self.masked = self.taken = self.in_c = 0  # in_c: calls whose rows the C loop took (take_ahead)
        take = self._take
        if take is not None:
            def counted(seqs, kind, picker):
                narrowed = take(seqs, kind, picker)
                self.in_c += narrowed is not None
                return narrowed
            self._take = counted

    def __call__(self, logits, seqs):
        before = [s for s in seqs if s.constraint is not None and s.mask_ahead is not None]
        narrowed = super().__call__(logits, seqs)
        self.masked += sum(s.constraint is not None for s in seqs)
        self.taken += sum(s.mask_ahead is None for s in before)
        return narrowed


class NoAhead(ConstraintMasker):
    ahead = None  # every mask looked up after the forward pass, as before ahead existed


@pytest.fixture(scope="module")
def grammar(smollm_tokenizer):
    from grammars import GrammarCompiler, TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(smollm_tokenizer, VOCAB, extra_eos_token_ids=(2,))
    with GrammarCompiler(vocab, timeout_s=60) as compiler:
        yield compiler.compile_json_schema(SCHEMA)


def generate(tiny_model, tokenizer, masker, requests, forced_extend=True) -> list[list]:
    """Every event of each request, run side by side on a fresh engine with ``masker``."""
    eng = Engine(tiny_model, tokenizer, torch.device("cpu"), frozenset({2}), 512, logits_hooks=[masker],
                 forced_extend=forced_extend)
    eng.start()

    async def collect(request):
        return [e async for e in eng.generate(request)]

    async def all_of():
        return await asyncio.gather(*(collect(r) for r in requests))
    try:
        return asyncio.run(all_of())
    finally:
        eng.shutdown()


def requests(tokenizer, constraints) -> list[Request]:
    free = Request(prompt_ids=prompt(tokenizer), params=SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    return [free] + [Request(prompt_ids=prompt(tokenizer, f"JSON {i}:"), constraint=constraint,
                             params=SamplingParams(max_tokens=budget, temperature=0))
                     for i, (budget, constraint) in enumerate(zip(BUDGETS, constraints))]


@pytest.mark.parametrize("forced_extend", [True, False])
def test_masks_looked_up_ahead_give_the_tokens_of_masks_looked_up_after_the_pass(
        tiny_model, smollm_tokenizer, grammar, forced_extend):
    """Three constrained rows (two closed by their budgets) beside a free one, with forced runs fed
    in one pass or a token a step (rows held meanwhile): every masked step but each row's first takes
    its mask from ahead, and every row's tokens are those of looking each mask up after the pass."""
    counting = Counting(VOCAB, 8)
    ahead = generate(tiny_model, smollm_tokenizer, counting,
                     requests(smollm_tokenizer, [grammar.matcher() for _ in BUDGETS]), forced_extend)
    after = generate(tiny_model, smollm_tokenizer, NoAhead(VOCAB, 8),
                     requests(smollm_tokenizer, [grammar.matcher() for _ in BUDGETS]), forced_extend)
    tokens = [[t for e in events for t in e.token_ids] for events in ahead]
    assert tokens == [[t for e in events for t in e.token_ids] for events in after]
    for events in ahead[1:]:
        text = "".join(e.text for e in events)
        assert events[-1].finish_reason == "stop" and set(json.loads(text)) == set(SCHEMA["required"])
    assert counting.masked > 3 * len(BUDGETS) and counting.taken == counting.masked - len(BUDGETS)
    assert counting._take is None or counting.in_c > 0


def seq_ahead(constraint, outputs: int, tokens_left: int, mask, pick=True) -> SimpleNamespace:
    """A row as ConstraintMasker reads it, its mask looked up ahead."""
    return SimpleNamespace(constraint=constraint, output_ids=[0] * outputs, tokens_left=tokens_left,
                           mask_ahead=(constraint, outputs, tokens_left, mask, pick))


@pytest.mark.skipif(take_routine() is None, reason="the C extension is not built here")
def test_the_c_loop_takes_the_rows_only_where_every_ahead_holds():
    """take_ahead (grammars/index/_fast_calls.c) takes the call's rows into a Narrowed, with the picker, where
    each constrained row's ahead holds for its constraint, outputs and budget as they stand and may be
    picked as it is; else it takes none (None), and leaves every row's ahead for the Python loop."""
    take, masks, constraint, picker = take_routine(), [object() for _ in range(3)], object(), object()
    rows = [seq_ahead(constraint, 4, 9, masks[0]), SimpleNamespace(constraint=None),
            seq_ahead(object(), 0, 30, masks[2])]
    narrowed = take(rows, Narrowed, picker)
    assert type(narrowed) is Narrowed and narrowed == {0: masks[0], 2: masks[2]} and narrowed.picker is picker
    assert rows[0].mask_ahead is None and rows[2].mask_ahead is None
    narrowed = take([SimpleNamespace(constraint=None)], Narrowed, picker)
    assert narrowed == {} and narrowed.picker is None  # no row to pick: no picker, as the Python loop
    stale = [lambda s: setattr(s, "tokens_left", 8), lambda s: s.output_ids.append(1),
             lambda s: setattr(s, "constraint", object()), lambda s: setattr(s, "mask_ahead", None),
             lambda s: delattr(s, "mask_ahead"),  # a row that never had one: as the Python loop's getattr default
             lambda s: setattr(s, "mask_ahead", s.mask_ahead[:3] + (None, False)),
             lambda s: setattr(s, "mask_ahead", s.mask_ahead[:4] + (False,))]
    for change in stale:
        rows = [seq_ahead(constraint, 4, 9, masks[0]), seq_ahead(constraint, 2, 7, masks[1])]
        change(rows[1])
        before = [getattr(row, "mask_ahead", None) for row in rows]
        assert take(rows, Narrowed, picker) is None
        assert [getattr(row, "mask_ahead", None) for row in rows] == before
    with pytest.raises(AttributeError):  # a row without the attributes the check reads
        take([SimpleNamespace(constraint=constraint, mask_ahead=(constraint, 0, 9, masks[0], True))], Narrowed, picker)


class BreaksAfterTwo:
    """A JSON matcher whose mask lookup raises once it has advanced twice."""

    def __init__(self, inner):
        self.inner, self.advanced = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def advance(self, token):
        self.inner.advance(token)
        self.advanced += 1

    def sparse_mask(self, budget=None):
        if self.advanced >= 2:
            raise RuntimeError("the lookup broke")
        return self.inner.sparse_mask(budget)


def test_a_lookup_ahead_that_fails_fails_only_its_own_request(tiny_model, smollm_tokenizer, grammar):
    """The lookup now runs outside the masks of the step (where a raise fails every running row):
    it fails its request alone, and the others go on to their ends."""
    broken, fine = BreaksAfterTwo(grammar.matcher()), grammar.matcher()
    events = generate(tiny_model, smollm_tokenizer, ConstraintMasker(VOCAB, 8),
                      requests(smollm_tokenizer, [broken, fine]), forced_extend=False)
    free, bad, good = events
    assert bad[-1].finish_reason == "error" and "the lookup broke" in bad[-1].error
    assert free[-1].finish_reason == "length" and free[-1].completion_tokens == 20
    assert good[-1].finish_reason == "stop" and json.loads("".join(e.text for e in good))

"""The engine loop on a tiny random-weight Llama with the embedded model's tokenizer."""

import asyncio
import json

import torch

from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.sequence import Request
from engine_fixtures import VOCAB, engine, only_tokens, prompt, run, run_hooked, tiny_model  # noqa: F401 (fixtures)


def test_greedy_matches_full_forward_argmax(engine, tiny_model, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)
    events = run(engine, Request(prompt_ids=ids, params=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)))
    tokens = [t for e in events for t in e.token_ids]
    expected = list(ids)
    with torch.no_grad():
        for _ in range(12):  # no KV cache: the whole sequence every step
            expected.append(int(tiny_model(torch.tensor([expected])).logits[0, -1].argmax()))
    assert tokens == expected[len(ids):]
    assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 12
    assert "".join(e.text for e in events) == smollm_tokenizer.decode(tokens, skip_special_tokens=True)


def test_same_seed_same_output_across_runs(engine, smollm_tokenizer):
    def sampled(seed):
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=seed, ignore_eos=True)
        return [t for e in run(engine, Request(prompt_ids=prompt(smollm_tokenizer), params=params)) for t in e.token_ids]
    assert sampled(11) == sampled(11)
    assert sampled(11) != sampled(12)


def test_eos_stops_without_text(engine, smollm_tokenizer, tiny_model):
    ids = prompt(smollm_tokenizer)
    with torch.no_grad():
        first = int(tiny_model(torch.tensor([ids])).logits[0, -1].argmax())
    params = SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[first])
    events = run(engine, Request(prompt_ids=ids, params=params))
    assert len(events) == 1 and events[0].finish_reason == "stop" and events[0].text == ""


def test_stop_string_cuts_the_text(engine, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)
    free = run(engine, Request(prompt_ids=ids, params=SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)))
    text = "".join(e.text for e in free)
    stop = text[5:8]
    assert stop.strip(), "the tiny model's text should have a stop string to find"
    events = run(engine, Request(prompt_ids=ids, params=SamplingParams(max_tokens=20, temperature=0, stop=[stop])))
    assert "".join(e.text for e in events) == text[:text.index(stop)]
    assert events[-1].finish_reason == "stop"


def test_logit_bias_favours_and_bans_tokens_per_request(engine, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)

    def greedy(bias, n=6):
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logit_bias=bias)
        return [t for e in run(engine, Request(prompt_ids=ids, params=params)) for t in e.token_ids]

    free = greedy({})
    assert greedy({500: 100.0}) == [500] * 6
    banned = greedy({free[0]: -100.0})
    assert free[0] not in banned[:1] and banned != free
    assert greedy({}) == free  # the bias belonged to those requests alone


def test_logit_bias_never_unmasks_a_token(tiny_model, smollm_tokenizer):
    allowed = smollm_tokenizer.encode(" yes no", add_special_tokens=False)
    params = SamplingParams(max_tokens=5, temperature=0, logit_bias={500: 100.0})
    events = run_hooked(tiny_model, smollm_tokenizer, only_tokens(allowed), params)
    assert all(t in allowed for e in events for t in e.token_ids)


def test_logits_hook_edits_every_step(tiny_model, smollm_tokenizer):
    allowed = smollm_tokenizer.encode(" yes no", add_special_tokens=False)
    seen_shapes = []
    events = run_hooked(tiny_model, smollm_tokenizer, only_tokens(allowed, seen_shapes),
                        SamplingParams(max_tokens=8, seed=1))
    assert all(t in allowed for e in events for t in e.token_ids)
    assert seen_shapes == [(1, VOCAB)] * 8


def test_failing_step_fails_its_request_and_engine_keeps_serving(tiny_model, smollm_tokenizer):
    calls = []

    def broken_once(logits, seqs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")

    eng = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), 512, logits_hooks=[broken_once])
    eng.start()
    try:
        first = run(eng, Request(prompt_ids=prompt(smollm_tokenizer), params=SamplingParams(max_tokens=4)))
        second = run(eng, Request(prompt_ids=prompt(smollm_tokenizer), params=SamplingParams(max_tokens=4, ignore_eos=True)))
    finally:
        eng.shutdown()
    assert first[-1].finish_reason == "error" and "boom" in first[-1].error
    assert second[-1].finish_reason == "length" and second[-1].completion_tokens == 4


def test_leaving_the_stream_cancels_the_request(engine, smollm_tokenizer):
    async def leave_early():
        request = Request(prompt_ids=prompt(smollm_tokenizer), params=SamplingParams(max_tokens=400, ignore_eos=True))
        async for event in engine.generate(request):
            break
        for _ in range(100):  # the engine drops the row within a step or two
            await asyncio.sleep(0.02)
            if not engine._running and not engine._waiting:
                return True
        return False
    assert asyncio.run(leave_early())


def test_context_length_ends_generation(tiny_model, smollm_tokenizer):
    ids = prompt(smollm_tokenizer)
    eng = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), context_length=len(ids) + 3)
    eng.start()
    try:
        events = run(eng, Request(prompt_ids=ids, params=SamplingParams(max_tokens=50, ignore_eos=True)))
    finally:
        eng.shutdown()
    assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 3


def test_forced_tokens_in_a_batch_give_the_constrained_text(tiny_model, smollm_tokenizer):
    """A const schema forces almost every token (jump-forward); the row shares its batch with a
    free row, and both must come out as they do alone."""
    from grammars import GrammarCompiler, TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(smollm_tokenizer, VOCAB, extra_eos_token_ids=(2,))
    schema = {"type": "object", "properties": {"answer": {"const": "forty two, exactly"}, "n": {"enum": [1, 22]}},
              "required": ["answer", "n"], "additionalProperties": False}
    eng = masked_engine(tiny_model, smollm_tokenizer)
    with GrammarCompiler(vocab, timeout_s=60) as compiler:
        grammar = compiler.compile_json_schema(schema)

        def both():
            collect = collector(eng)

            async def run():
                free = Request(prompt_ids=prompt(smollm_tokenizer),
                               params=SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
                constrained = Request(prompt_ids=prompt(smollm_tokenizer, "JSON:"), constraint=grammar.matcher(),
                                      params=SamplingParams(max_tokens=60, temperature=0))
                return await asyncio.gather(collect(free), collect(constrained))
            return asyncio.run(run())
        try:
            free, constrained = both()
            alone = run(eng, Request(prompt_ids=prompt(smollm_tokenizer),
                                     params=SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)))
        finally:
            eng.shutdown()
    text = "".join(e.text for e in constrained)
    assert json.loads(text)["answer"] == "forty two, exactly" and constrained[-1].finish_reason == "stop"
    assert [t for e in free for t in e.token_ids] == [t for e in alone for t in e.token_ids]


def test_a_constraint_that_fails_fails_only_its_own_request(engine, smollm_tokenizer):
    class Refuses:  # engine/constraint.py's methods; advance refuses every token
        budget_forced = False

        def ready(self):
            return True

        def fill(self, row, budget=None):
            row.fill_(-1)

        def sparse_mask(self, budget=None):
            return None

        def rollback(self, n):
            pass

        def free_text(self):
            return False

        def closed(self):
            return False

        def min_tokens(self):
            return 0

        def advance(self, token):
            raise ValueError("token refused")

        def forced(self):
            return []

        def finished(self):
            return False

        def is_terminated(self):
            return False

    async def both():
        async def collect(request):
            return [e async for e in engine.generate(request)]
        ok = Request(prompt_ids=prompt(smollm_tokenizer), params=SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
        bad = Request(prompt_ids=prompt(smollm_tokenizer, "Hi"), constraint=Refuses(), params=SamplingParams(max_tokens=5))
        return await asyncio.gather(collect(ok), collect(bad))
    ok, bad = asyncio.run(both())
    assert bad[-1].finish_reason == "error" and "token refused" in bad[-1].error
    assert ok[-1].finish_reason == "length" and ok[-1].completion_tokens == 5


def test_a_request_waits_for_its_grammar_units_and_no_one_else_does(tiny_model, smollm_tokenizer):
    """A tool request submitted before its units are compiled is prefilled but for its prompt's last
    token, then held in the rows: a plain request submitted after it finishes meanwhile; once the
    units are attached it decodes a call."""
    from grammars import GrammarCompiler, TokenVocabulary, schema_to_regex
    from grammars.tools.tool_constraint import ToolCallConstraint
    from grammars.tools.tool_grammar import tool_tokens
    from grammars.tools.tool_grammar import tool_grammar
    from grammars.match.unit_union import UnitUnion

    vocab = TokenVocabulary.from_tokenizer(smollm_tokenizer, VOCAB, extra_eos_token_ids=(2,))
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}}}]
    grammar = tool_grammar("hermes", tools, schema_to_regex, parallel=False)
    constraint = ToolCallConstraint(tool_tokens(smollm_tokenizer, grammar.open, grammar.close, None), True, vocab)
    eng = masked_engine(tiny_model, smollm_tokenizer)
    try:
        with GrammarCompiler(vocab, timeout_s=60) as compiler:
            async def scenario():
                collect = collector(eng)
                waiting = asyncio.create_task(collect(Request(
                    prompt_ids=prompt(smollm_tokenizer, "Add:"), constraint=constraint,
                    params=SamplingParams(max_tokens=40, temperature=0))))
                await asyncio.sleep(0.2)  # submitted first
                free = await collect(Request(prompt_ids=prompt(smollm_tokenizer),
                                             params=SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)))
                assert not waiting.done()
                held = [(len(s.next_input), eng.scheduler.slots.lengths[s.slot], len(s.request.prompt_ids))
                        for s in eng.scheduler.rows if s.constraint is constraint]
                constraint.attach(UnitUnion([compiler.compile_regex(grammar.units[0])]))
                eng.wake()
                return free, held, await waiting
            free, held, constrained = asyncio.run(scenario())
    finally:
        eng.shutdown()
    n = len(prompt(smollm_tokenizer, "Add:"))
    assert free[-1].finish_reason == "length" and held == [(1, n - 1, n)]
    text = "".join(e.text for e in constrained)
    assert constrained[-1].finish_reason == "stop" and constrained[-1].completion_tokens > 3
    assert json.loads(text.split("\n")[1])["name"] == "add", text


def test_a_row_whose_chosen_tools_unit_still_compiles_is_held_and_no_one_else_is(tiny_model, smollm_tokenizer):
    """Name first: a required call over two tools starts before their units are compiled; the row
    writes its tool's literal and is held where it ends (in the batch, not fed) while a plain request
    submitted later decodes to its end; once the units are compiled it writes a valid call."""
    import concurrent.futures

    from grammars import GrammarCompiler, TokenVocabulary, schema_to_regex
    from grammars.tools.name_stage import name_stage
    from grammars.tools.tool_constraint import ToolCallConstraint
    from grammars.tools.tool_grammar import tool_tokens
    from grammars.tools.tool_grammar import tool_grammar

    vocab = TokenVocabulary.from_tokenizer(smollm_tokenizer, VOCAB, extra_eos_token_ids=(2,))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": name, "parameters": schema}} for name in ("add", "mul")]
    grammar = tool_grammar("hermes", tools, schema_to_regex, parallel=False)
    futures = [concurrent.futures.Future() for _ in grammar.units]
    preferred = []
    stage = name_stage(vocab, list(grammar.units), futures, preferred.append)
    constraint = ToolCallConstraint(tool_tokens(smollm_tokenizer, grammar.open, grammar.close, None), True, vocab)
    assert constraint.attach_stage(stage, budget=80, room=400)
    eng = masked_engine(tiny_model, smollm_tokenizer)

    def held() -> bool:
        return any(s.constraint is constraint for s in eng.scheduler.rows) and not constraint.ready()

    try:
        with GrammarCompiler(vocab, timeout_s=60) as compiler:
            async def scenario():
                collect = collector(eng)
                waiting = asyncio.create_task(collect(Request(
                    prompt_ids=prompt(smollm_tokenizer, "Add:"), constraint=constraint,
                    params=SamplingParams(max_tokens=80, temperature=0))))
                while not await asyncio.wrap_future(eng.call(held)):
                    assert not waiting.done()
                    await asyncio.sleep(0.05)
                free = await collect(Request(prompt_ids=prompt(smollm_tokenizer),
                                             params=SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)))
                still_held = await asyncio.wrap_future(eng.call(held))
                for future, regex in zip(futures, grammar.units):
                    future.set_result(compiler.compile_regex(regex))
                eng.wake()
                return free, still_held, await waiting
            free, still_held, constrained = asyncio.run(scenario())
    finally:
        eng.shutdown()
    assert free[-1].finish_reason == "length" and still_held and len(preferred) == 1
    text = "".join(e.text for e in constrained)
    call = json.loads(text.split("\n")[1])
    assert constrained[-1].finish_reason == "stop" and call["name"] in ("add", "mul") and isinstance(call["arguments"]["a"], int)
    assert grammar.units[("add", "mul").index(call["name"])] == preferred[0]


def masked_engine(tiny_model, tokenizer) -> Engine:
    """A started engine that applies its requests' constraints (the grammar tests')."""
    from engine.constraint_hook import ConstraintMasker

    eng = Engine(tiny_model, tokenizer, torch.device("cpu"), frozenset({2}), 512,
                 logits_hooks=[ConstraintMasker(VOCAB, 8)])
    eng.start()
    return eng


def collector(eng: Engine):
    """collect(request): every event of the request, awaited to its end."""
    async def collect(request):
        return [e async for e in eng.generate(request)]
    return collect


def test_a_stopped_engine_counts_as_idle(tiny_model, smollm_tokenizer):
    """Background grammar warm-ups wait while the engine is not idle: a shutdown right after a step
    (idle still False) must not leave them waiting for ever (a benchmark's drain hung on it)."""
    import time

    eng = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), context_length=512)
    eng.start()
    time.sleep(0.05)  # the loop waits for work
    eng.idle = False  # as the loop leaves it while it steps
    eng.shutdown()
    assert eng.idle


def test_rows_narrowed_by_two_hooks_are_picked_alike_in_either_order(tiny_model, smollm_tokenizer):
    """The engine merges the {row: SparseMask} of every hook: the masker's Narrowed (its picker, the
    one C call over these logits) and a plain dict from another hook. A free row pinned by that hook
    to two tokens and a constrained row batched with it come out the same whichever hook runs first."""
    from engine.constraint_hook import ConstraintMasker
    from grammars import GrammarCompiler, TokenVocabulary
    from grammars.masks.sparse_mask import SparseMask

    vocab = TokenVocabulary.from_tokenizer(smollm_tokenizer, VOCAB, extra_eos_token_ids=(2,))
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "w": {"enum": ["a", "bb"]}},
              "required": ["n", "w"], "additionalProperties": False}
    pinned = SparseMask(True, torch.tensor([5, 7]), VOCAB)

    def pin(logits, seqs):  # the unconstrained rows: token 5 or 7, picked under this mask
        return {row: pinned for row, seq in enumerate(seqs) if seq.constraint is None}

    def outputs(hooks, compiler):
        eng = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), 512, logits_hooks=hooks)
        eng.start()
        collect = collector(eng)

        async def both():
            free = Request(prompt_ids=prompt(smollm_tokenizer),
                           params=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
            held = Request(prompt_ids=prompt(smollm_tokenizer, "A number"),
                           params=SamplingParams(max_tokens=40, temperature=0),
                           constraint=compiler.compile_json_schema(schema).matcher())
            return await asyncio.gather(collect(free), collect(held))
        try:
            return [[t for e in events for t in e.token_ids] for events in asyncio.run(both())]
        finally:
            eng.shutdown()

    with GrammarCompiler(vocab, timeout_s=60) as compiler:
        first = outputs([ConstraintMasker(VOCAB, 8), pin], compiler)
        second = outputs([pin, ConstraintMasker(VOCAB, 8)], compiler)
    assert first == second
    assert len(first[0]) == 12 and set(first[0]) <= {5, 7}
    value = json.loads(smollm_tokenizer.decode(first[1], skip_special_tokens=True))
    assert isinstance(value["n"], int) and value["w"] in ("a", "bb")


def test_token_counters_count_forced_tokens_too(engine, smollm_tokenizer):
    """maskd_generation_tokens counts every appended token, a forced run's included (it counted one
    per row per step: 79 of 259 on six tool calls), and maskd_forced_tokens the forced ones."""
    from engine_fixtures import ForcesRun

    forced = prompt(smollm_tokenizer, " jumps over the lazy dog")
    request = Request(prompt_ids=prompt(smollm_tokenizer), constraint=ForcesRun(forced),
                      params=SamplingParams(max_tokens=len(forced) + 4, temperature=0, ignore_eos=True))
    events = run(engine, request)
    made = sum(len(e.token_ids) for e in events)
    assert made == events[-1].completion_tokens == len(forced) + 4
    engine.call(lambda: None).result(timeout=60)  # the step that emitted the last event has counted it
    assert engine.metrics.generated_tokens._value.get() == made
    assert engine.metrics.forced_tokens._value.get() == len(forced)

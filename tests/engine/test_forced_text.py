"""grammars/masks/forced_text.py on the SmolLM2 vocabulary: the text a grammar allows alone comes back as
the tokenizer's own tokens (less the last), and nothing comes back where the model has a choice;
the token just sampled and the run after it come back in the split the tokenizer writes for both."""

import json

import torch
from engine_fixtures import VOCAB, prompt, run, tiny_model  # noqa: F401 - tiny_model is a fixture
from grammar_fixtures import shared_compiler, smollm2_tokenizer, smollm2_vocabulary

from engine.constraint_hook import ConstraintMasker
from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.sequence import Request
from grammars.masks.forced_text import ForcedText

SCHEMA = {"type": "object", "properties": {"location": {"type": "string"},
                                           "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["location", "unit"], "additionalProperties": False}


def forced_text():
    return ForcedText(smollm2_vocabulary(), smollm2_tokenizer())


def spell(ids):
    return b"".join(smollm2_vocabulary().token_bytes[t] for t in ids).decode()


def advance(matcher, text):
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        matcher.advance(token)


def test_a_required_key_is_forced_as_the_tokenizer_writes_it():
    matcher = shared_compiler().compile_json_schema(SCHEMA).matcher()
    forced = forced_text()(matcher)
    tokens = smollm2_tokenizer().encode('{"location":"', add_special_tokens=False)
    assert forced == tokens[:-1], spell(forced)  # the last is left to the model: it may merge with the value
    advance(matcher, '{"location":"Paris"')  # the matcher was left as it was: it takes the text from the start
    after = forced_text()(matcher)
    assert after == smollm2_tokenizer().encode(',"unit":"', add_special_tokens=False)[:-1], spell(after)


def test_nothing_is_forced_where_the_model_chooses():
    matcher = shared_compiler().compile_json_schema(SCHEMA).matcher()
    advance(matcher, '{"location":"')
    assert forced_text()(matcher) == []  # the value's first character is free
    advance(matcher, 'Paris","unit":"')
    assert forced_text()(matcher) == []  # celsius or fahrenheit


def test_an_enum_value_is_forced_once_its_first_letters_decide_it():
    matcher = shared_compiler().compile_json_schema(SCHEMA).matcher()
    advance(matcher, '{"location":"Paris","unit":"f')
    forced = forced_text()(matcher)
    text = spell(forced)
    assert text and 'ahrenheit"}'.startswith(text)


def test_a_forced_run_never_spends_the_budget_the_output_needs_to_close():
    # the tokenizer writes `unassignedShard` in 3 tokens where 2 spell it (`unas` `signed`): at a budget of
    # exactly the shortest output, its split would leave the object unable to close
    schema = {"type": "object", "properties": {"unassignedShard": {}, "initializedShard": {}},
              "required": ["unassignedShard", "initializedShard"], "additionalProperties": False}
    matcher = shared_compiler().compile_json_schema(schema).matcher()
    budget = matcher.min_tokens()
    unbounded = forced_text()(matcher)
    for token in unbounded:
        matcher.advance(token)
    assert matcher.min_tokens() > budget - len(unbounded), spell(unbounded)  # the case this guards against
    matcher.rollback(len(unbounded))
    forced = forced_text()(matcher, budget)
    for token in forced:
        matcher.advance(token)
    assert matcher.min_tokens() <= budget - len(forced), spell(forced)
    assert len(forced) >= 1, "the part of the run that fits is still forced"


def test_the_sampled_token_and_the_run_after_it_are_split_together():
    # after a string value the model samples `"`; the text forced after it is `,"unit":"`, and the
    # tokenizer writes `","unit":"` as `","` `unit` `":"`: the sampled `"` is replaced by `","`
    matcher = shared_compiler().compile_json_schema(SCHEMA).matcher()
    advance(matcher, '{"location":"Paris')
    quote = smollm2_tokenizer().encode('"', add_special_tokens=False)
    assert len(quote) == 1
    forced_after = forced_text()(matcher)
    assert forced_after == []  # the value may go on: nothing is forced before the quote
    run = forced_text().joined(matcher, quote[0])
    together = smollm2_tokenizer().encode('","unit":"', add_special_tokens=False)
    assert together[0] != quote[0], "the case this tests: the tokenizer merges the quote with the comma"
    assert run == together[:-1], spell(run)
    for token in run:  # the matcher was left as it was, before the sampled token: it takes the run
        matcher.advance(token)
    assert spell(run) == '","unit'


def test_a_sampled_token_with_nothing_forced_after_it_stays():
    matcher = shared_compiler().compile_json_schema(SCHEMA).matcher()
    advance(matcher, '{"location":"')
    letter = smollm2_tokenizer().encode("P", add_special_tokens=False)[0]
    assert forced_text().joined(matcher, letter) == [letter]
    matcher.advance(letter)  # left as it was


def test_the_engine_feeds_a_sampled_quote_and_the_run_after_it_in_the_joint_split(tiny_model):
    # the model (here steered to `"` wherever the grammar allows it) closes the location at once;
    # `,"unit":"` is forced after that quote, and the engine appends `","` `unit` in its place
    tokenizer = smollm2_tokenizer()
    quote, joint = (tokenizer.encode(text, add_special_tokens=False) for text in ('"', '","'))
    assert len(quote) == 1 and len(joint) == 1

    def prefer_quote(logits, seqs):  # logits [B, V]
        logits[:, quote[0]] += 1e4

    eng = Engine(tiny_model, tokenizer, torch.device("cpu"), frozenset({2}), 512,
                 logits_hooks=[prefer_quote, ConstraintMasker(VOCAB, 8)])
    eng.forced_text = ForcedText(smollm2_vocabulary(), tokenizer)
    eng.start()
    try:
        events = run(eng, Request(prompt_ids=prompt(tokenizer), params=SamplingParams(max_tokens=40, temperature=0),
                                  constraint=shared_compiler().compile_json_schema(SCHEMA).matcher()))
    finally:
        eng.shutdown()
    ids = [t for e in events for t in e.token_ids]
    value = json.loads("".join(e.text for e in events))
    assert value["location"] == "" and value["unit"] in ("celsius", "fahrenheit")
    assert joint[0] in ids, [spell([t]) for t in ids]  # the old code appended `"` `,"` `unit`


def test_a_joint_the_tokenizer_writes_as_one_token_replaces_the_sampled_token_whole():
    # the model wrote `{"location` and then `"`; `:"` is forced after it, and `":"` is one token
    matcher = shared_compiler().compile_json_schema(SCHEMA).matcher()
    advance(matcher, '{"location')
    quote = smollm2_tokenizer().encode('"', add_special_tokens=False)[0]
    whole = smollm2_tokenizer().encode('":"', add_special_tokens=False)
    assert len(whole) == 1
    assert forced_text().joined(matcher, quote) == whole


def test_one_forced_byte_after_the_sampled_token_joins_it():
    # the model wrote `{"location` and then `":`; the string's `"` must follow, and `":"` is one token
    matcher = shared_compiler().compile_json_schema(SCHEMA).matcher()
    advance(matcher, '{"location')
    colon = smollm2_tokenizer().encode('":', add_special_tokens=False)
    whole = smollm2_tokenizer().encode('":"', add_special_tokens=False)
    assert len(colon) == 1 and len(whole) == 1
    assert forced_text()(matcher) == []  # alone, a run of one token is left to the model
    assert forced_text().joined(matcher, colon[0]) == whole

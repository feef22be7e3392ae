"""grammars/forced_text.py on the SmolLM2 vocabulary: the text a grammar allows alone comes back as
the tokenizer's own tokens (less the last), and nothing comes back where the model has a choice."""

from grammar_fixtures import shared_compiler, smollm2_tokenizer, smollm2_vocabulary

from grammars.forced_text import ForcedText

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

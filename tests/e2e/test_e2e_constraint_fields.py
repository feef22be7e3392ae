"""End to end: the constraint fields of other servers (server/constraint_fields.py) through the
official openai SDK's extra_body: vLLM's structured_outputs and guided_* fields and llama.cpp's
json_schema and grammar, enforced; recursive or Lark grammars, lookarounds and a second constraint
refused with a 400 that names the field, never answered unconstrained."""

import json
import re

import openai
import pytest

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Write a US phone number."}]
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


def _chat(client, max_tokens=24, **extra):
    return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=max_tokens, temperature=0.8,
                                          seed=7, extra_body=extra)


def test_a_regex_in_structured_outputs_is_enforced(client):
    reply = _chat(client, structured_outputs={"regex": PHONE})
    assert re.fullmatch(PHONE, reply.choices[0].message.content)
    assert reply.choices[0].finish_reason == "stop"


def test_a_streamed_regex_output_equals_the_non_streamed_one(client):
    whole = _chat(client, guided_regex=PHONE).choices[0].message.content
    chunks = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0.8, seed=7,
                                            stream=True, extra_body={"guided_regex": PHONE})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert re.fullmatch(PHONE, whole)


@pytest.mark.parametrize("field", ["structured_outputs", "guided_choice"])
def test_a_choice_answers_one_of_its_strings(client, field):
    choices = ["positive", "negative", "neutral (mixed)"]
    extra = {"structured_outputs": {"choice": choices}} if field == "structured_outputs" else {field: choices}
    for seed in (1, 2, 3):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Sentiment of: I loved it."}], max_tokens=12,
            temperature=1.0, seed=seed, extra_body=extra)
        assert reply.choices[0].message.content in choices


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                                     "additionalProperties": False}}},
    {"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                     "additionalProperties": False}},
    {"guided_json": json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                                "additionalProperties": False})},
])
def test_a_json_schema_in_another_servers_field_is_enforced(client, extra):
    value = json.loads(_chat(client, max_tokens=16, **extra).choices[0].message.content)
    assert set(value) == {"n"} and isinstance(value["n"], int)


def test_text_completions_take_the_same_fields(client):
    reply = client.completions.create(model=MODEL, prompt="Call me at ", max_tokens=24, temperature=0.8, seed=3,
                                      extra_body={"structured_outputs": {"regex": PHONE}})
    assert re.fullmatch(PHONE, reply.choices[0].text)


GBNF = """
root   ::= answer ", because " reason
answer ::= "yes" | "no"   # one of two
reason ::= [a-z] [a-z ]{0,20}
"""


@pytest.mark.parametrize("field", ["structured_outputs", "grammar"])
def test_a_gbnf_grammar_is_enforced(client, field):
    extra = {"structured_outputs": {"grammar": GBNF}} if field == "structured_outputs" else {field: GBNF}
    reply = _chat(client, max_tokens=32, **extra)
    assert re.fullmatch(r"(yes|no), because [a-z][a-z ]{0,20}", reply.choices[0].message.content)


@pytest.mark.parametrize("extra, field, words", [
    ({"structured_outputs": {"grammar": 'root ::= "(" root ")" | "x"'}}, "structured_outputs.grammar", "recursive"),
    ({"grammar": 'root ::= item\nitem ::= "a" item?'}, "grammar", "recursive"),
    ({"grammar": 'root ::= "a'}, "grammar", "not closed"),
    ({"guided_grammar": "start: \"a\""}, "guided_grammar", "Lark"),
    ({"structured_outputs": {"grammar": '%llguidance {}\nstart: "a"'}}, "structured_outputs.grammar", "Lark"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "structural tag"),
    ({"structured_outputs": {"regex": r"(?=\d)\d+"}}, "structured_outputs.regex", "lookarounds"),
    ({"guided_regex": r"(a)\1"}, "guided_regex", "backreferences"),
    ({"guided_regex": "["}, "guided_regex", "not a valid regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs", "unknown"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_regex": "a", "json_schema": {"type": "object"}}, "json_schema", "not several"),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice", "not several"),
])
def test_what_cannot_be_enforced_is_a_400_naming_the_field(client, extra, field, words):
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, max_tokens=4, **extra)
    error = caught.value.body
    assert error["param"] == field and words in error["message"], error
    assert _chat(client, max_tokens=2).choices[0].message.content is not None  # the server serves on

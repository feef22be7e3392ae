"""StreamParser under hypothesis: random mixtures of text and calls per tool format, cut at random points,
stream to exactly what the whole text parses to (the same events, once adjacent pieces are joined).

Texts are built from well-formed calls (any key order, spacing, escapes, nesting, non-ASCII), text
full of delimiter look-alikes, and broken pieces (a call cut short, a bad escape, a stray delimiter);
for texts made only of well-formed parts the parse must also give back exactly the calls written.
MASKD_PARSER_FUZZ_EXAMPLES sets the examples per format (default 300).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grammars.tools.formats import ArgsDelta, CallEnd, CallStart, Content, get_tool_format
from test_tool_formats_stream import check_event_order, summary

EXAMPLES = int(os.environ.get("MASKD_PARSER_FUZZ_EXAMPLES", "300"))
FORMATS = ["hermes", "llama3_json", "mistral"]
LOOKALIKES = ["<tool_call", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[TOOL", "<|python_tag|>", "<|python",
              "{", "}", "[", "]", '"', "\\", ";", ",", "\n", " ", "é", "🦜", "name", ":", "arguments"]
TEXT = st.lists(st.one_of(st.sampled_from(LOOKALIKES), st.text(max_size=6)), max_size=8).map("".join)
JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=8), st.sampled_from(LOOKALIKES)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)
NAME = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12) | \
    st.sampled_from(["get_weather", "f", "a.b-c", "<tool_call>", "x y"])
SPACE = st.sampled_from(["", " ", "\n", "  \n"])


@st.composite
def call(draw, fmt: str):
    """(the call object's text, name, arguments JSON text as written)."""
    name = draw(NAME)
    arguments = json.dumps(draw(st.dictionaries(st.text(max_size=6), JSON_VALUE, max_size=3)),
                           ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([None, (",", ":")])))
    key = {"hermes": "arguments", "mistral": "arguments"}.get(fmt) or draw(st.sampled_from(["parameters", "arguments"]))
    s = draw(SPACE)
    name_part, args_part = f'"name":{s}{json.dumps(name)}', f'"{key}":{s}{arguments}'
    parts = [name_part, args_part] if draw(st.booleans()) else [args_part, name_part]
    if draw(st.booleans()):  # an extra key the parser skips (mistral's call id, a type)
        parts.insert(draw(st.integers(0, 2)), f'"id":{s}{json.dumps(draw(JSON_VALUE))}')
    return "{" + s + f",{s}".join(parts) + s + "}", name, arguments


@st.composite
def block(draw, fmt: str):
    """A call block in the format's shape: (text, [(name, arguments)])."""
    calls = draw(st.lists(call(fmt), min_size=1, max_size=1 if fmt == "hermes" else 3))
    s = draw(SPACE)
    if fmt == "hermes":
        text = f"<tool_call>{s}{calls[0][0]}{s}</tool_call>"
    elif fmt == "mistral":
        text = f"[TOOL_CALLS]{s}[" + f",{s}".join(c[0] for c in calls) + "]"
    else:  # at the very start of the output the tag may be left out
        tag = draw(st.sampled_from(["<|python_tag|>", "<|python_tag|>", "", " \n"]))
        text = tag + "; ".join(c[0] for c in calls)
    return text, [(name, arguments) for _, name, arguments in calls]


@st.composite
def broken(draw, fmt: str):
    """A block cut short or spoiled at a random point (what an unconstrained model may write)."""
    text, _ = draw(block(fmt))
    cut = draw(st.integers(0, len(text)))
    return text[:cut] + draw(st.sampled_from(["", "\\q", "\x01", "}", "]", "oops", ",", '"', "<tool_call>"]))


@st.composite
def mixture(draw, fmt: str):
    """(text, expected calls or None where a broken piece makes them not ours to predict)."""
    pieces = draw(st.lists(st.one_of(TEXT.map(lambda t: ("text", t)), block(fmt).map(lambda b: ("block", b)),
                                     broken(fmt).map(lambda t: ("broken", t))), max_size=5))
    text, calls, predictable = "", [], True
    for kind, piece in pieces:
        if kind == "block" and text and not piece[0].startswith(get_tool_format(fmt).open):
            piece = (get_tool_format(fmt).open + piece[0], piece[1])  # no bare call after the start
        if kind == "block":
            text += piece[0]
            calls += piece[1]
        else:
            text += piece
            predictable = False
    return text, (calls if predictable else None)


def joined(events: list) -> list:
    """Adjacent Content, and adjacent ArgsDelta of one call, joined: how a split may not differ."""
    out = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, Content) and isinstance(last, Content):
            out[-1] = Content(last.text + event.text)
        elif isinstance(event, ArgsDelta) and isinstance(last, ArgsDelta) and last.index == event.index:
            out[-1] = ArgsDelta(event.index, last.text + event.text)
        else:
            out.append(event)
    return out


def streamed(fmt: str, text: str, cuts: list[int]) -> list:
    parser = get_tool_format(fmt).stream_parser()
    events = []
    for start, end in zip([0] + cuts, cuts + [len(text)]):
        events += parser.feed(text[start:end])
    return events + parser.close()


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_splits_stream_to_the_whole_parse(fmt, data):
    text, calls = data.draw(mixture(fmt))
    whole = streamed(fmt, text, [])
    check_event_order(whole)
    content, parsed = get_tool_format(fmt).parse(text)
    assert summary(whole) == (content, parsed)
    if calls is not None:
        assert parsed == calls
        assert all(isinstance(event, (CallStart, ArgsDelta, CallEnd)) or get_tool_format(fmt).open not in event.text
                   for event in whole)
    for cuts in (data.draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=12).map(sorted)),
                 list(range(1, len(text)))):
        events = streamed(fmt, text, cuts)
        check_event_order(events)
        assert joined(events) == joined(whole), (text, cuts)

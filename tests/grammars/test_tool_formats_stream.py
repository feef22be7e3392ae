"""StreamParser: the same calls for any split of the text, held-back delimiters, and the fallbacks."""

from __future__ import annotations

import json
import random
import zlib

import pytest

from grammars.tools.formats import ArgsDelta, CallEnd, CallStart, Content, get_tool_format

TRICKY_ARGS = '{"q": "a } ] \\" { [ \\\\", "n": [1, {"x": null}], "u": "é 🦜"}'

SAMPLES = {  # format -> [(text, expected content, expected calls)]
    "hermes": [
        ("Hello there.", "Hello there.", []),
        ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         "Let me check.\n", [("get_weather", '{"city": "Paris"}')]),
        ('<tool_call>\n{"name": "a", "arguments": ' + TRICKY_ARGS + '}\n</tool_call>\n<tool_call>\n'
         '{"name": "b", "arguments": {}}\n</tool_call>\n', None, [("a", TRICKY_ARGS), ("b", "{}")]),
        ('<tool_call>{"arguments": {"k": 1}, "name": "late"}</tool_call>', None, [("late", '{"k": 1}')]),
        ("a <toolbox> b <tool_call", "a <toolbox> b <tool_call", []),
    ],
    "llama3_json": [
        ('  {"name": "get_weather", "parameters": {"city": "Paris"}}', None, [("get_weather", '{"city": "Paris"}')]),
        ('{"name": "a", "parameters": ' + TRICKY_ARGS + '}; {"name": "b", "parameters": {}}',
         None, [("a", TRICKY_ARGS), ("b", "{}")]),
        ("The set {1, 2} is small.", "The set {1, 2} is small.", []),
        ('Calling.<|python_tag|>{"name": "t", "parameters": {"x": -1.5e3}}', "Calling.", [("t", '{"x": -1.5e3}')]),
        ('{"type": "function", "name": "t", "arguments": {"x": true}}', None, [("t", '{"x": true}')]),
    ],
    "mistral": [
        ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
         None, [("get_weather", '{"city": "Paris"}')]),
        ('[TOOL_CALLS][{"name": "a", "arguments": ' + TRICKY_ARGS + ', "id": "abcDEF123"}, '
         '{"name": "b", "arguments": {}}]', None, [("a", TRICKY_ARGS), ("b", "{}")]),
        ("No tools [TOOL", "No tools [TOOL", []),
    ],
}
CASES = [(name, *sample) for name, samples in SAMPLES.items() for sample in samples]


def run(name: str, pieces: list[str]) -> list:
    parser = get_tool_format(name).stream_parser()
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    return events + parser.close()


def summary(events: list) -> tuple[str | None, list[tuple[str, str]]]:
    content = "".join(e.text for e in events if isinstance(e, Content)) or None
    names = {e.index: e.name for e in events if isinstance(e, CallStart)}
    args = {i: "".join(e.text for e in events if isinstance(e, ArgsDelta) and e.index == i) for i in names}
    return content, [(names[i], args[i]) for i in sorted(names)]


def check_event_order(events: list) -> None:
    """Indices 0.. contiguous; per call: one CallStart, then ArgsDeltas, then one CallEnd."""
    open_index, next_index = None, 0
    for event in events:
        if isinstance(event, CallStart):
            assert open_index is None and event.index == next_index
            open_index = event.index
        elif isinstance(event, ArgsDelta):
            assert event.index == open_index and event.text
        elif isinstance(event, CallEnd):
            assert event.index == open_index
            open_index, next_index = None, next_index + 1
        else:
            assert event.text
    assert open_index is None


def random_split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(0, min(len(text) - 1, 12))))
    return [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_whole_text_parses_to_expected_calls(name, text, content, calls):
    assert get_tool_format(name).parse(text) == (content, calls)
    for _, arguments in calls:
        json.loads(arguments)


@pytest.mark.parametrize("name,text,content,calls", CASES)
def test_any_split_gives_the_same_result(name, text, content, calls):
    rng = random.Random(zlib.crc32(text.encode()))
    splits = [[text], list(text)] + [random_split(text, rng) for _ in range(60)]
    for pieces in splits:
        events = run(name, pieces)
        check_event_order(events)
        assert summary(events) == (content, calls), pieces
        delimiter = get_tool_format(name).open
        if calls:
            assert all(delimiter not in e.text for e in events if isinstance(e, Content))


PIECES = ["a", " ", "\n", "<", ">", "{", "}", "[", "]", '"', "\\", ";", ",", "é", "🦜", "tool", "<tool_call", "[TOOL",
          "<|python", "_tag|>", "call>"]


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return "".join(rng.choice(PIECES) for _ in range(rng.randrange(6)))
    if kind == 1:
        return rng.choice([0, -1, 2.5, 1e-7, 10**12])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return "<tool_call>}]{" if rng.random() < 0.5 else "[TOOL_CALLS]"
    if kind == 4:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {random_json(rng, 3) if rng.random() < 0.5 else "k": random_json(rng, depth + 1)
            for _ in range(rng.randrange(3))}


def random_output(name: str, rng: random.Random) -> tuple[str, str | None, list[tuple[str, str]]]:
    """A model output in the format: optional content (with delimiter look-alikes), then 0-3 calls."""
    content = "".join(rng.choice(PIECES[:15]) for _ in range(rng.randrange(8))).strip() or None
    if content and name == "llama3_json" and content.lstrip().startswith("{"):
        content = "x" + content
    calls = []
    for n in range(rng.randrange(4)):
        arguments = {"arg": random_json(rng)}
        spaced = rng.random() < 0.5
        calls.append((f"tool_{n}", json.dumps(arguments, ensure_ascii=rng.random() < 0.5,
                                              separators=None if spaced else (",", ":"))))
    if not calls:
        return content or "", content, []
    if name == "hermes":
        text = "\n".join(f'<tool_call>\n{{"name": "{c}", "arguments": {a}}}\n</tool_call>' for c, a in calls)
        return (content or "") + text, content, calls
    if name == "llama3_json":
        text = "; ".join(f'{{"name": "{c}", "parameters": {a}}}' for c, a in calls)
        return (content + "<|python_tag|>" if content else "") + text, content, calls
    text = "[TOOL_CALLS] [" + ", ".join(f'{{"name": "{c}", "arguments": {a}}}' for c, a in calls) + "]"
    return (content or "") + text, content, calls


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_generated_outputs_parse_back_under_random_splits(name):
    rng = random.Random(zlib.crc32(name.encode()))
    for _ in range(150):
        text, content, calls = random_output(name, rng)
        for pieces in ([text], random_split(text, rng) if len(text) > 1 else [text], list(text)):
            events = run(name, pieces)
            check_event_order(events)
            assert summary(events) == (content, calls), text


def test_partial_delimiter_is_held_then_resolved():
    parser = get_tool_format("hermes").stream_parser()
    assert parser.feed("Sure, ") == [Content("Sure, ")]
    assert parser.feed("Hello <tool") == [Content("Hello ")]
    assert parser.feed('_call>\n{"name": "f", "argu') == [CallStart(0, "f")]
    assert parser.feed('ments": {"a": ') == [ArgsDelta(0, '{"a": ')]
    assert parser.feed('1}}\n</tool_call>') == [ArgsDelta(0, "1}"), CallEnd(0)]
    assert parser.close() == []


def test_lookalike_of_delimiter_is_released_as_content():
    parser = get_tool_format("hermes").stream_parser()
    assert parser.feed("a <tool") == [Content("a ")]
    assert parser.feed("box> b") == [Content("<toolbox> b")]
    assert parser.feed("<") == []
    assert parser.close() == [Content("<")]


def test_llama3_waits_for_the_first_non_space_character():
    parser = get_tool_format("llama3_json").stream_parser()
    assert parser.feed("\n ") == []
    assert parser.feed('{"name": "f"') == [CallStart(0, "f")]
    text_parser = get_tool_format("llama3_json").stream_parser()
    assert text_parser.feed(" ") == []
    assert text_parser.feed("Hi {") == [Content(" Hi {")]


MALFORMED = [  # (format, text, content, calls): never a crash, and never a call that was not written
    ("hermes", "<tool_call>\nnot json</tool_call>", "<tool_call>\nnot json</tool_call>", []),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1', None, [("f", '{"a": 1')]),
    # regression: the wrapper's closing `}` once leaked into the fallback content
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {}} oops', " oops", [("f", "{}")]),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ("hermes", '<tool_call>{"name": "f"}</tool_call>', None, [("f", "{}")]),
    ("hermes", '<tool_call>{"name": "bad \\q"}', '<tool_call>{"name": "bad \\q"}', []),
    ("llama3_json", '{"name": "f", "parameters": {}} then text', "then text", [("f", "{}")]),
    ("llama3_json", "<|python_tag|>brave_search.call(query=\"x\")", '<|python_tag|>brave_search.call(query="x")', []),
    ("mistral", "[TOOL_CALLS] sorry", "[TOOL_CALLS] sorry", []),
    # after a complete call, the text since it is what falls back to content
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}}, {"nam', ', {"nam', [("f", "{}")]),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}}, 7]', ", 7]", [("f", "{}")]),
]


@pytest.mark.parametrize("name,text,content,calls", MALFORMED)
def test_malformed_blocks_fall_back_without_crashing(name, text, content, calls):
    assert get_tool_format(name).parse(text) == (content, calls)
    for pieces in ([text], list(text)):
        events = run(name, pieces)
        check_event_order(events)
        assert summary(events) == (content, calls)

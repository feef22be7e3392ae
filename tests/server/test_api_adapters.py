"""The pieces the API adapters share, without a model: reasoning split, answer blocks, request conversion."""

import pytest

from grammars.tools.formats import ArgsDelta, CallEnd, CallStart, Content
from server.anthropic_protocol import MessagesRequest
from server.answer_blocks import BlockBuilder, replay
from server.errors import APIError
from server.output_stream import Reasoning
from server.reasoning import ReasoningSplitter
from server.responses_protocol import chat_messages

THOUGHT = "<think>\nLet me see: 2 + 2 = 4.\n</think>\n\nIt is 4."


def split(text: str, cuts: list[int], inside: bool = False) -> tuple[str, str]:
    splitter, reasoning, answer = ReasoningSplitter(starts_inside=inside), "", ""
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    for i, piece in enumerate(pieces):
        r, a = splitter.feed(piece, final=i == len(pieces) - 1)
        reasoning, answer = reasoning + r, answer + a
    return reasoning, answer


@pytest.mark.parametrize("cuts", [[], [1], [3, 7], [10, 30, 33], list(range(1, len(THOUGHT)))])
def test_thinking_splits_the_same_wherever_the_text_is_cut(cuts):
    assert split(THOUGHT, cuts) == ("\nLet me see: 2 + 2 = 4.\n", "It is 4.")


def test_a_block_opened_by_the_prompt_and_text_without_one():
    assert split("plan\n</think>\n\nanswer", [2, 9], inside=True) == ("plan\n", "answer")
    assert split("<thin", []) == ("", "<thin")  # the end came before a tag did
    assert split("The tag <think> later is text", [5]) == ("", "The tag <think> later is text")
    assert ReasoningSplitter.opened_in("<|im_start|>assistant\n<think>\n")
    assert not ReasoningSplitter.opened_in("<think>\n\n</think>\n\n")


def test_blocks_hold_whitespace_between_calls_and_replay_equals_stream():
    parts = [Reasoning("hm"), Content("Sure."), Content("\n"), CallStart(0, "f"), ArgsDelta(0, '{"a":'),
             ArgsDelta(0, "1}"), CallEnd(0), Content("\n"), CallStart(1, "g"), CallEnd(1), Content("\n")]
    for cut in range(len(parts) + 1):  # fed in two pieces, cut anywhere
        builder = BlockBuilder()
        events = builder.feed(parts[:cut]) + builder.feed(parts[cut:]) + builder.finish()
        blocks = replay(events)
        assert [(b.kind, b.name, b.text) for b in blocks] == [
            ("reasoning", None, "hm"), ("text", None, "Sure.\n"), ("call", "f", '{"a":1}'), ("call", "g", "")]
        assert [type(e).__name__ for e in events].count("Open") == [type(e).__name__ for e in events].count("Close")


def test_anthropic_history_becomes_chat_messages():
    body = MessagesRequest(model="m", max_tokens=5, system=[{"type": "text", "text": "Be brief."}], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": ""},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "down"}]},
                                     {"type": "text", "text": "Retry?"}]}])
    assert body.chat_messages() == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": '{"c": "P"}'}}]},
        {"role": "tool", "content": "Error: down", "tool_call_id": "toolu_1", "name": "w"},
        {"role": "user", "content": "Retry?"}]
    choice, parallel = MessagesRequest(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}],
                                       tools=[{"name": "w", "input_schema": {}}],
                                       tool_choice={"type": "any", "disable_parallel_tool_use": True}).choice()
    assert (choice.mode, parallel) == ("required", False)


def test_response_items_become_chat_messages():
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
             {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"c": 1}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"type": "reasoning", "id": "rs_1", "summary": []}]
    assert chat_messages("Be brief.", items) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "w", "arguments": '{"c": 1}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1", "name": "w"}]
    with pytest.raises(APIError) as err:
        chat_messages(None, [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    assert err.value.param == "input[0].content[0].type"


@pytest.mark.parametrize("item,param", [
    ({"role": "user", "content": True}, "input[0].content"),  # a 500 before (hypothesis found it)
    ({"role": "user", "content": {"type": "input_text", "text": "x"}}, "input[0].content"),
    ({"role": "user", "content": [{"type": "input_text", "text": 5}]}, "input[0].content[0].text"),
    ({"type": "function_call_output", "call_id": "c", "output": 3}, "input[0].output"),
])
def test_message_content_of_another_type_is_a_400_naming_it(item, param):
    with pytest.raises(APIError) as err:
        chat_messages(None, [item])
    assert err.value.status == 400 and err.value.param == param

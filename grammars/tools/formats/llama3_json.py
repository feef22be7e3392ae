"""Llama 3.1 JSON tool calls ("JSON based tool calling" in Meta's prompt format).

Output: either a reply that starts (after optional whitespace) with the call object, or text
followed by `<|python_tag|>` and the calls. Calls are separated by `; `:
    {"name": "NAME", "parameters": ARGS}; {"name": "NAME", "parameters": ARGS}
Block regex (after `<|python_tag|>`, or from the reply's start):
    single: CALL        parallel: CALL(; CALL)*
where CALL = {"name": "NAME", "parameters": ARGS}. `open_text()` is "" : in required/named modes
the whole assistant output is the block itself, as Llama 3.1's template renders past calls.
"""

from __future__ import annotations

from grammars.tools.formats.base import ToolFormat
from grammars.tools.formats.block_shape import BlockShape
from grammars.tools.formats.builtin_prompt import (call_name_and_arguments, dump_json, message_text,
                                                   with_system_text)
from grammars.tools.formats.call_regex import repeated

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = "; "

INSTRUCTIONS = ("You have access to the following functions. To call a function, please respond with JSON "
                "for a function call."
                'Respond in the format {"name": function name, "parameters": dictionary of argument name '
                'and its value}.'
                "Do not use variables.\n\n")
TOOL_RESULT_PREFIX = "Tool result:\n"


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    shape = BlockShape(open=PYTHON_TAG, separator=";", bare_object_at_start=True)

    def open_text(self) -> str:
        return ""

    def call_object_regex(self, name_re: str, args_re: str) -> str:
        return r'\{"name": ' + name_re + r', "parameters": ' + args_re + r"\}"

    def _block_regex(self, call_re: str, parallel: bool) -> str:
        return repeated(call_re, SEPARATOR, call_re) if parallel else call_re

    def _builtin_messages(self, messages, tools, chat_template):
        """Tool results go in role `ipython` when `chat_template` mentions it, else in a user message
        starting with "Tool result:\\n"."""
        tool_role = "ipython" if chat_template and "ipython" in chat_template else "user"
        out: list[dict] = []
        for message in messages:
            role = message.get("role")
            if role == "assistant" and message.get("tool_calls"):
                calls = SEPARATOR.join(self.call_text(call) for call in message["tool_calls"])
                text = message_text(message.get("content"))
                out.append({"role": "assistant", "content": text + PYTHON_TAG + calls if text else calls})
            elif role == "tool":
                content = message_text(message.get("content"))
                out.append({"role": tool_role,
                            "content": content if tool_role == "ipython" else TOOL_RESULT_PREFIX + content})
            else:
                out.append(message)
        if tools:
            text = INSTRUCTIONS + "".join(dump_json(tool, indent=4) + "\n\n" for tool in tools)
            out = with_system_text(out, text.rstrip("\n"), tools_first=True)
        return out

    @staticmethod
    def call_text(call: dict) -> str:
        name, arguments = call_name_and_arguments(call)
        return f'{{"name": {dump_json(name)}, "parameters": {arguments}}}'

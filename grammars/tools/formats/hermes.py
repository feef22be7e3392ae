r"""Hermes-style tool calls, as Qwen2.5 (and NousResearch Hermes) models write them.

Output: optional text, then per call a block
    <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
with `\n` between blocks. Block regex (after the opening `<tool_call>`):
    single:   \n CALL \n</tool_call>
    parallel: \n CALL \n</tool_call> (\n<tool_call>\n CALL \n</tool_call>)*
where CALL = {"name": "NAME", "arguments": ARGS}.
"""

from __future__ import annotations

from grammars.tools.formats.base import ToolFormat
from grammars.tools.formats.block_shape import BlockShape
from grammars.tools.formats.builtin_prompt import (call_name_and_arguments, dump_json, message_text,
                                                   with_system_text)
from grammars.tools.formats.call_regex import repeated

OPEN, CLOSE = "<tool_call>", "</tool_call>"

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class HermesFormat(ToolFormat):
    name = "hermes"
    shape = BlockShape(open=OPEN, close=CLOSE)

    def call_object_regex(self, name_re: str, args_re: str) -> str:
        return r'\{"name": ' + name_re + r', "arguments": ' + args_re + r"\}"

    def _block_regex(self, call_re: str, parallel: bool) -> str:
        one = r"\n" + call_re + r"\n" + CLOSE
        if not parallel:
            return one
        return repeated(one, r"\n" + OPEN, one)

    def _builtin_messages(self, messages, tools, chat_template):
        out: list[dict] = []
        for message in messages:
            role = message.get("role")
            if role == "assistant" and message.get("tool_calls"):
                parts = [message_text(message.get("content"))] if message.get("content") else []
                parts += [self.call_text(call) for call in message["tool_calls"]]
                out.append({"role": "assistant", "content": "\n".join(parts)})
            elif role == "tool":
                response = "<tool_response>\n" + message_text(message.get("content")) + "\n</tool_response>"
                if out and out[-1].get("_tool_responses"):
                    out[-1]["content"] += "\n" + response
                else:
                    out.append({"role": "user", "content": response, "_tool_responses": True})
            else:
                out.append(message)
        out = [{k: v for k, v in m.items() if k != "_tool_responses"} for m in out]
        if tools:
            text = TOOLS_HEADER + "".join("\n" + dump_json(tool) for tool in tools) + TOOLS_FOOTER
            out = with_system_text(out, text, tools_first=False)
        return out

    @staticmethod
    def call_text(call: dict) -> str:
        name, arguments = call_name_and_arguments(call)
        return f"{OPEN}\n{{\"name\": {dump_json(name)}, \"arguments\": {arguments}}}\n{CLOSE}"

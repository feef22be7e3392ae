r"""Mistral tool calls, as Mistral-7B-Instruct-v0.3's template renders them.

Output: `[TOOL_CALLS]` then one JSON list of calls (the template writes a space before the list):
    [TOOL_CALLS] [{"name": "NAME", "arguments": ARGS}, {"name": "NAME", "arguments": ARGS}]
Block regex (after `[TOOL_CALLS]`):
    single:  ?\[CALL\]        parallel:  ?\[CALL(, CALL)*\]
where CALL = {"name": "NAME", "arguments": ARGS}. Call ids are 9 alphanumerics: Mistral's template
refuses others, so `map_call_id` maps any client id to one, deterministically.
"""

from __future__ import annotations

import hashlib
import re

from grammars.tools.formats.base import ALPHANUMERIC, ToolFormat, random_alphanumeric
from grammars.tools.formats.block_shape import BlockShape
from grammars.tools.formats.builtin_prompt import (call_name_and_arguments, dump_json, message_text,
                                                   with_system_text)
from grammars.tools.formats.call_regex import repeated

TOOL_CALLS = "[TOOL_CALLS]"
ID_LENGTH = 9
MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


class MistralFormat(ToolFormat):
    name = "mistral"
    shape = BlockShape(open=TOOL_CALLS, list_open="[", list_close="]", separator=",")

    def call_object_regex(self, name_re: str, args_re: str) -> str:
        return r'\{"name": ' + name_re + r', "arguments": ' + args_re + r"\}"

    def _block_regex(self, call_re: str, parallel: bool) -> str:
        calls = repeated(call_re, ", ", call_re) if parallel else call_re
        return r" ?\[" + calls + r"\]"

    def new_call_id(self) -> str:
        """9 random alphanumerics, the only ids Mistral's templates accept."""
        return random_alphanumeric(ID_LENGTH)

    def map_call_id(self, call_id: str | None) -> str | None:
        """A 9-alphanumeric id stays; any other becomes 9 alphanumerics from its SHA-256."""
        if call_id is None or MISTRAL_ID.fullmatch(call_id):
            return call_id
        number = int.from_bytes(hashlib.sha256(call_id.encode("utf-8")).digest(), "big")
        chars = []
        for _ in range(ID_LENGTH):
            number, digit = divmod(number, len(ALPHANUMERIC))
            chars.append(ALPHANUMERIC[digit])
        return "".join(chars)

    def _builtin_messages(self, messages, tools, chat_template):
        out: list[dict] = []
        for message in messages:
            role = message.get("role")
            if role == "assistant" and message.get("tool_calls"):
                calls = ", ".join(self.call_text(call) for call in message["tool_calls"])
                text = message_text(message.get("content"))
                out.append({"role": "assistant", "content": f"{text}{TOOL_CALLS} [{calls}]"})
            elif role == "tool":
                result = '{"content": ' + message_text(message.get("content"))
                call_id = self.map_call_id(message.get("tool_call_id"))
                if call_id is not None:
                    result += f', "call_id": "{call_id}"'
                out.append({"role": "user", "content": f"[TOOL_RESULTS] {result}}}[/TOOL_RESULTS]"})
            else:
                out.append(message)
        if tools:
            listed = ", ".join(dump_json(self._listed_tool(tool)) for tool in tools)
            out = with_system_text(out, f"[AVAILABLE_TOOLS] [{listed}][/AVAILABLE_TOOLS]", tools_first=True)
        return out

    @staticmethod
    def _listed_tool(tool: dict) -> dict:
        function = {k: v for k, v in (tool.get("function") or {}).items() if k != "return"}
        return {"type": "function", "function": function}

    def call_text(self, call: dict) -> str:
        name, arguments = call_name_and_arguments(call)
        text = f'{{"name": {dump_json(name)}, "arguments": {arguments}'
        call_id = self.map_call_id(call.get("id"))
        return text + (f', "id": "{call_id}"}}' if call_id is not None else "}")

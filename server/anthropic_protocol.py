"""The Anthropic Messages API's request as pydantic models, turned into chat messages and tools."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling import SamplingParams
from server.errors import APIError
from server.tool_calls import ToolChoice


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # cache_control, citations, ... are accepted and ignored


class Block(_Open):
    type: str
    text: str | None = None  # text
    id: str | None = None  # tool_use
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # thinking (earlier turns' reasoning: not sent back to the model)


class Message(_Open):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class AnthropicTool(_Open):
    type: str | None = None  # "custom" or absent; server tools (web_search_..., bash_...) are refused
    name: str = Field(pattern=r"^[a-zA-Z0-9_\-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class AnthropicToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Thinking(_Open):
    type: str  # enabled | disabled | adaptive | between_tools: all but disabled turn thinking on
    budget_tokens: int | None = None


class OutputFormat(_Open):
    type: Literal["json_schema"]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class OutputConfig(_Open):
    format: OutputFormat | None = None  # structured outputs; `effort` is accepted and ignored


class MessagesRequest(_Open):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the beta name of output_config.format
    metadata: dict[str, Any] | None = None
    seed: int | None = None  # maskd extension (as in chat completions): the same seed, the same answer

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=0, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              seed=self.seed, stop=list(self.stop_sequences or []))

    def function_tools(self) -> list[dict] | None:
        """The tools as OpenAI function tools (what the generation path takes)."""
        out = []
        for i, tool in enumerate(self.tools or []):
            if tool.type not in (None, "custom"):
                raise APIError(f"tools[{i}]: server tool type {tool.type!r} is not supported by maskd; send "
                               "client tools (name, description, input_schema)", param=f"tools[{i}].type")
            if tool.input_schema is None:
                raise APIError(f"tools[{i}]: input_schema is required", param=f"tools[{i}].input_schema")
            function = {"name": tool.name, "parameters": tool.input_schema}
            if tool.description:
                function["description"] = tool.description
            out.append({"type": "function", "function": function})
        return out or None

    def choice(self) -> tuple[ToolChoice, bool]:
        """(tool choice, parallel calls allowed)."""
        choice = self.tool_choice
        if choice is None:
            return ToolChoice("auto" if self.tools else "none"), True
        if choice.type == "tool" and not choice.name:
            raise APIError("tool_choice of type 'tool' needs `name`", param="tool_choice.name")
        mode = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}[choice.type]
        return ToolChoice(mode, choice.name if mode == "named" else None), not choice.disable_parallel_tool_use

    def structured_output(self) -> tuple[OutputFormat | None, str]:
        """(the format asked for, the field it came from)."""
        if self.output_config is not None and self.output_config.format is not None:
            return self.output_config.format, "output_config.format"
        return self.output_format, "output_format"

    def template_kwargs(self) -> dict:
        if self.thinking is None:
            return {}
        return {"enable_thinking": self.thinking.type != "disabled"}

    def chat_messages(self) -> list[dict]:
        """System text, then each message as the chat-template dicts chat completions produce."""
        out = []
        if self.system:
            text = self.system if isinstance(self.system, str) else _text(self.system, "system")
            out.append({"role": "system", "content": text})
        names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer them
        for i, message in enumerate(self.messages):
            blocks = [Block(type="text", text=message.content)] if isinstance(message.content, str) \
                else message.content
            if message.role == "assistant":
                out.append(_assistant(blocks, names, i))
            else:
                out.extend(_user(blocks, names, i))
        return out


def _text(blocks: list[Block], where: str) -> str:
    texts = []
    for block in blocks:
        if block.type != "text":
            raise APIError(f"{where}: only text blocks are supported here, got {block.type!r}", param=where)
        texts.append(block.text or "")
    return "\n\n".join(texts)


def _assistant(blocks: list[Block], names: dict[str, str], i: int) -> dict:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_use":
            if not block.id or not block.name:
                raise APIError("a tool_use block needs id and name", param=f"messages[{i}].content[{j}]")
            names[block.id] = block.name
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input or {})}})
        elif block.type not in ("thinking", "redacted_thinking"):
            raise APIError(f"block type {block.type!r} is not supported in assistant messages",
                           param=f"messages[{i}].content[{j}].type")
    entry = {"role": "assistant", "content": "".join(texts)}
    if calls:
        entry["tool_calls"] = calls
    return entry


def _user(blocks: list[Block], names: dict[str, str], i: int) -> list[dict]:
    """Tool results become tool messages (in order, before the user's text); text stays the user's."""
    out, texts = [], []
    for j, block in enumerate(blocks):
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_result":
            content = block.content if isinstance(block.content, str) or block.content is None \
                else _text(block.content, f"messages[{i}].content[{j}].content")
            content = content or ""
            if block.is_error:
                content = f"Error: {content}"
            entry = {"role": "tool", "content": content, "tool_call_id": block.tool_use_id}
            if block.tool_use_id in names:
                entry["name"] = names[block.tool_use_id]
            out.append(entry)
        else:
            raise APIError(f"block type {block.type!r} is not supported by maskd (text, tool_use and "
                           "tool_result are)", param=f"messages[{i}].content[{j}].type")
    if texts:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


class CountTokensRequest(MessagesRequest):
    max_tokens: int | None = Field(default=None, ge=1)  # not part of a count_tokens body


Block.model_rebuild()

"""The OpenAI Responses API's request as pydantic models, turned into chat messages and tools."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.sampling import SamplingParams
from server.errors import APIError
from server.structured_output import OutputFormat
from server.tool_calls import ToolChoice


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # metadata, user, include, truncation, ... accepted


class TextFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextOptions(_Open):
    format: TextFormat | None = None


class ResponsesTool(_Open):
    type: str
    name: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9_\-.]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesRequest(_Open):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool | None = False  # null means false: sglang-router forwards an unset stream as null
    store: bool | None = None  # kept in a bounded in-memory store unless false
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    seed: int | None = None  # maskd extension (as in chat completions): the same seed, the same answer

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=0, temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def function_tools(self) -> list[dict] | None:
        out = []
        for i, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise APIError(f"tools[{i}]: tool type {tool.type!r} is not supported by maskd; send function "
                               "tools", param=f"tools[{i}].type")
            if not tool.name:
                raise APIError(f"tools[{i}]: a function tool needs `name`", param=f"tools[{i}].name")
            function = {"name": tool.name, "parameters": tool.parameters or {"type": "object", "properties": {}}}
            if tool.description:
                function["description"] = tool.description
            out.append({"type": "function", "function": function})
        return out or None

    def choice(self) -> ToolChoice:
        choice = self.tool_choice
        if choice is None:
            return ToolChoice("auto" if self.tools else "none")
        if choice in ("none", "auto", "required"):
            return ToolChoice(choice)
        if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
            return ToolChoice("named", choice["name"])
        raise APIError("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                       param="tool_choice")

    def output_format(self) -> OutputFormat | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        return OutputFormat(fmt.type, fmt.schema_, fmt.strict)

    def items(self) -> list[dict]:
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return list(self.input)


def chat_messages(instructions: str | None, items: list[dict]) -> list[dict]:
    """Instructions, then the input items, as the chat-template dicts chat completions produce;
    consecutive function calls join one assistant message."""
    out = [{"role": "system", "content": instructions}] if instructions else []
    names: dict[str, str] = {}
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(f"input[{i}].role must be user, assistant, system or developer", param=f"input[{i}].role")
            out.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), i)})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not call_id or not name:
                raise APIError(f"input[{i}]: a function_call needs call_id and name", param=f"input[{i}]")
            names[call_id] = name
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            elif out and out[-1]["role"] == "assistant" and not out[-1].get("tool_calls"):
                out[-1]["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            entry = {"role": "tool", "content": _text(item.get("output"), i, "output"), "tool_call_id": call_id}
            if call_id in names:
                entry["name"] = names[call_id]
            out.append(entry)
        elif kind != "reasoning":  # earlier reasoning is not sent back to the model, as chat templates do
            raise APIError(f"input[{i}]: item type {kind!r} is not supported by maskd (message, function_call and "
                           "function_call_output are)", param=f"input[{i}].type")
    return out


def _text(content, i: int, field: str = "content") -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(f"input[{i}].{field} must be a string or a list of content parts; got "
                       f"{type(content).__name__}", param=f"input[{i}].{field}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(f"input[{i}].{field}[{j}]: content type {kind!r} is not supported by maskd (text is)",
                           param=f"input[{i}].{field}[{j}].type")
        text = part.get("text") or ""
        if not isinstance(text, str):
            raise APIError(f"input[{i}].{field}[{j}].text must be a string; got {type(text).__name__}",
                           param=f"input[{i}].{field}[{j}].text")
        texts.append(text)
    return "".join(texts)

"""Shared test data for the tool-format tests: tools, a conversation, an args regex, a renderer."""

from __future__ import annotations

import json
from pathlib import Path

from outlines_core.json_schema import build_regex_from_schema
from transformers.utils.chat_template_utils import render_jinja_template

TEMPLATES = Path(__file__).resolve().parent / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now, UTC"}}
TOOLS = [WEATHER, TIME]

CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc123", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "It is 21 C in Paris."},
    {"role": "user", "content": "And in Lyon?"},
]


def args_regex(schema: dict) -> str:
    return build_regex_from_schema(json.dumps(schema), whitespace_pattern="")


def render(template: str, messages: list[dict], tools: list[dict] | None, generation_prompt: bool = True) -> str:
    """Renders like `apply_chat_template(tokenize=False)`: None-valued keys dropped, then the template."""
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    rendered, _ = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=(TEMPLATES / template).read_text(),
        add_generation_prompt=generation_prompt, bos_token="<s>", eos_token="</s>")
    return rendered[0]

"""Helpers the formats share when they render tools into the prompt themselves (templates that
know nothing of tools). Everything here is deterministic: fixed separators, input order kept."""

from __future__ import annotations

import json

JSON_SEPARATORS = (", ", ": ")


def dump_json(value, indent: int | None = None) -> str:
    """JSON as chat templates' `tojson` writes it: non-ASCII kept, `", "` and `": "` separators."""
    if indent is not None:
        return json.dumps(value, ensure_ascii=False, indent=indent)
    return json.dumps(value, ensure_ascii=False, separators=JSON_SEPARATORS)


def message_text(content) -> str:
    """A message's content as text: a string as is, text parts joined, None as ''."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def arguments_text(arguments) -> str:
    """A past call's arguments as the model wrote them: the client's JSON string, stripped, or
    the object dumped with `dump_json`; empty or missing arguments are `{}`."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments.strip() or "{}"
    return dump_json(arguments)


def call_name_and_arguments(call: dict) -> tuple[str, str]:
    function = call.get("function") or {}
    return str(function.get("name", "")), arguments_text(function.get("arguments"))


def with_system_text(messages: list[dict], text: str, tools_first: bool) -> list[dict]:
    """Merges `text` into the first system message (before or after its content), or puts a new
    system message holding only `text` at the start."""
    if messages and messages[0].get("role") == "system":
        system = message_text(messages[0].get("content"))
        merged = (text + "\n\n" + system if tools_first else system + "\n\n" + text) if system else text
        return [{**messages[0], "content": merged}] + messages[1:]
    return [{"role": "system", "content": text}] + messages

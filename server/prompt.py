"""Chat messages -> prompt text, through the model's own chat template."""

from __future__ import annotations

from server.errors import APIError
from server.protocol import ChatMessage


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """The plain dicts chat templates expect; `developer` is the newer name of `system`."""
    out = []
    for message in messages:
        entry = {"role": "system" if message.role == "developer" else message.role,
                 "content": message.text()}
        if message.tool_calls:
            entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        if message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        if message.name:
            entry["name"] = message.name
        out.append(entry)
    return out


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                template_kwargs: dict | None = None, param: str = "messages") -> str:
    """The prompt text; template_kwargs (chat_template_kwargs) reach the template as variables."""
    if not getattr(tokenizer, "chat_template", None):
        raise APIError("this model has no chat template; set `chat_template` for it in models.yaml",
                       param=param, status=400)
    reserved = {"messages", "tools", "add_generation_prompt", "tokenize", "conversation"} & set(template_kwargs or {})
    if reserved:
        raise APIError(f"chat_template_kwargs may not set {sorted(reserved)}", param="chat_template_kwargs")
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                             **(template_kwargs or {}))
    except Exception as exc:  # jinja raises for conversations the template refuses
        raise APIError(f"the model's chat template rejected these messages: {exc}", param=param) from exc

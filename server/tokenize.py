"""POST /tokenize and /detokenize, as vLLM serves them (routers and clients count tokens with them)."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from server.errors import APIError
from server.generation import GenerationRequest, encode, prompt_ids_of
from server.prompt import message_dicts
from server.protocol import ChatMessage, Tool
from server.state import ServerState
from engine.sampling import SamplingParams


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


async def tokenize(state: ServerState, body: TokenizeRequest) -> dict:
    """A raw prompt, or chat messages rendered with the template as /v1/chat/completions renders them."""
    if body.model is not None:
        state.require_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError("send either `prompt` or `messages`", param="prompt")
    if body.prompt is not None:
        ids = encode(state.tokenizer, body.prompt, "prompt", add_special_tokens=body.add_special_tokens)
    else:
        job = GenerationRequest(prompt=message_dicts(body.messages), sampling=SamplingParams(),
                                tools=[t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None,
                                template_kwargs=body.chat_template_kwargs or {})
        ids, _ = await asyncio.to_thread(prompt_ids_of, state, job)
    return {"count": len(ids), "max_model_len": state.context_length, "tokens": ids}


async def detokenize(state: ServerState, body: DetokenizeRequest) -> dict:
    if body.model is not None:
        state.require_model(body.model)
    outside = [t for t in body.tokens if not 0 <= t < state.vocabulary.size]
    if outside:
        raise APIError(f"token id {outside[0]} is outside the vocabulary [0, {state.vocabulary.size})", param="tokens")
    return {"prompt": state.tokenizer.decode(body.tokens)}

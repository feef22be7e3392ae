"""The OpenAI chat-completions protocol as pydantic models (requests validated, responses shaped)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.sampling import SamplingParams


class _Open(BaseModel):
    # Unknown fields are tolerated (clients send store, metadata, user, ...), never acted on.
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str
    text: str | None = None


class FunctionCall(_Open):
    name: str
    arguments: str = "{}"


class ToolCall(_Open):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content if part.type == "text")


class FunctionDef(_Open):
    name: str = Field(pattern=r"^[a-zA-Z0-9_\-.]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool = False


class JsonSchemaFormat(_Open):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingRequest(_Open):
    """What chat and text completions share: the model, sampling, stop strings and streaming, and
    the constraint fields other servers take (server/constraint_fields.py reads them)."""
    model: str
    structured_outputs: Any = None  # vLLM: exactly one of json, regex, choice, grammar, json_object, ...
    guided_json: Any = None  # vLLM's older names for the same
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    json_schema: Any = None  # llama.cpp's server: a JSON schema
    grammar: Any = None  # llama.cpp's server: a GBNF grammar
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    n: int = Field(default=1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's extension: these tokens end free text too
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # maskd extension, for benchmarks
    forced_extend: bool = True  # maskd extension: false feeds grammar-forced tokens one pass each
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias added to its logit
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value):
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys must be token ids (non-negative integers), got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases must lie in [-100, 100], got {bias} for token {key}")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value):
        if isinstance(value, str):
            value = [value]
        if value is not None and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value

    def sampling_params(self, logprobs: int | None = None) -> SamplingParams:
        """The engine's parameters (max_tokens is set by generation.prepare)."""
        return SamplingParams(max_tokens=0, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              seed=self.seed, stop=self.stop or [], stop_token_ids=self.stop_token_ids or [],
                              ignore_eos=self.ignore_eos, forced_extend=self.forced_extend,
                              logit_bias={int(key): value for key, value in (self.logit_bias or {}).items()},
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              logprobs=logprobs)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false} for Qwen3

    def output_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] = Field(default_factory=dict)


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # the model's thinking, as vLLM and DeepSeek return it
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None
    maskd_budget_forced: bool | None = None  # maskd: the token budget closed the output (README)


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None
    maskd_budget_forced: bool | None = None  # on the last chunk of a constrained request


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None

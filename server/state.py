"""What the HTTP layer holds of the loaded model: its name, tokenizer, limits and engine."""

from __future__ import annotations

from dataclasses import dataclass

from engine.engine import Engine
from server.errors import APIError


@dataclass
class ServerState:
    model_name: str
    tokenizer: object
    context_length: int
    tool_format: str
    engine: Engine
    compiler: object = None  # grammars.GrammarCompiler for this model's vocabulary
    vocabulary: object = None  # grammars.TokenVocabulary
    responses: object = None  # server.responses.ResponseStore (previous_response_id)
    default_max_tokens: int | None = None  # a request without max_tokens gets at most this (None: the context)
    max_tokens_cap: int | None = None  # a request asking for more output tokens is a 400 (None: no cap)
    request_timeout: float | None = None  # seconds a request may run before it is cancelled (None: no limit)

    def require_model(self, name: str) -> None:
        """The request's `model` must be the one served here (a 404 naming it otherwise)."""
        if name != self.model_name:
            raise APIError(f"model {name!r} is not served here; this server serves {self.model_name!r}",
                           status=404, param="model", code="model_not_found", type="not_found_error")

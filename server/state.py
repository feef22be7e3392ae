"""What the HTTP layer holds of the loaded model: its name, tokenizer, limits and engine."""

from __future__ import annotations

from dataclasses import dataclass

from engine.engine import Engine


@dataclass
class ServerState:
    model_name: str
    tokenizer: object
    context_length: int
    tool_format: str
    engine: Engine
    compiler: object = None  # grammars.GrammarCompiler for this model's vocabulary
    vocabulary: object = None  # grammars.TokenVocabulary

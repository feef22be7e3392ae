"""A request as the engine sees it: its prompt, parameters, constraint and output so far."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.constraint import Constraint
from engine.detokenizer import Detokenizer, StopStrings
from engine.logprobs import TokenLogprob
from engine.penalties import make_penalties
from engine.sampling import SamplingParams

_ids = itertools.count()


@dataclass
class Event:
    """What the engine reports after each step of a request; finish_reason set on the last one."""
    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # stop | length | cancelled | error
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    budget_forced: bool = False  # the token budget narrowed the constraint's masks (see Constraint)
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when params.logprobs is set
    stop_string: str | None = None  # on the last event: the entry of params.stop that ended the text


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    constraint: Constraint | None = None
    emit: Callable[[Event], None] = lambda event: None
    keep_special_ids: frozenset[int] = frozenset()  # special tokens that stay in the text
    request_id: int = field(default_factory=lambda: next(_ids))
    submitted_at: float = field(default_factory=time.perf_counter)  # reset by Engine.submit


class Sequence:
    """Engine-thread state of one request."""

    def __init__(self, request: Request, tokenizer, stop_token_ids: frozenset[int],
                 device: torch.device | str = "cpu"):  # where sampling runs: the generator lives there
        self.request = request
        self.params = request.params
        self.constraint = request.constraint
        self.generator = request.params.make_generator(device)
        self.detokenizer = Detokenizer(tokenizer, request.prompt_ids, request.keep_special_ids)
        self.stops = StopStrings(request.params.stop)
        self.stop_token_ids = frozenset() if request.params.ignore_eos else stop_token_ids
        self.stop_token_ids |= frozenset(request.params.stop_token_ids)
        self.output_ids: list[int] = []
        self.next_input: list[int] = list(request.prompt_ids)  # tokens not yet run through the model
        self.slot: int | None = None  # the SlotCache slot holding this request's KV, from admission on
        self.capacity: int | None = None  # tokens (prompt + output) its slot may hold; set at admission
        self.cached_tokens = 0  # prompt tokens whose KV came from the prefix cache
        self.prefix_node = None  # the prefix cache node this request locks (engine.radix_node.RadixNode)
        self.tokens_left = request.params.max_tokens  # set by the engine before each step's masks
        self.mask_ahead = None  # (constraint, outputs, tokens_left, SparseMask | None, pick): ConstraintMasker.ahead
        self.bias = None  # (ids, values) tensors of params.logit_bias, made on first use (sampling.py)
        self.penalties = make_penalties(request.params)  # None without presence/frequency penalties
        self.stop_string: str | None = None  # the stop string that ended the request, if one did
        self.first_token_at: float | None = None
        self.cancelled = False
        self.finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_ids) + len(self.output_ids)

    def event(self, token_ids: list[int], text: str, error: str | None = None,
              logprobs: list[TokenLogprob] | None = None) -> Event:
        """logprobs: one per token id, None when the request asked for none (an event without tokens
        of a request that asked gets an empty list)."""
        if logprobs is None and self.params.logprobs is not None and not token_ids:
            logprobs = []
        return Event(
            token_ids=token_ids, text=text, finish_reason=self.finish_reason,
            prompt_tokens=len(self.request.prompt_ids), completion_tokens=len(self.output_ids),
            cached_tokens=self.cached_tokens, error=error,
            budget_forced=bool(self.constraint is not None and self.constraint.budget_forced),
            logprobs=logprobs, stop_string=self.stop_string)

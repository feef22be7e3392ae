"""Sampling parameters and the choice of the next token of each row from its logits."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from engine.logprobs import MAX_TOP_LOGPROBS


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    presence_penalty: float = 0.0  # subtracted from the logit of every token already in the output
    frequency_penalty: float = 0.0  # times the token's count in the output, subtracted (penalties.py)
    logprobs: int | None = None  # None: off; 0: the chosen token's; k: also the top k (logprobs.py)

    def __post_init__(self):
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS} (or None for none); "
                             f"got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    def make_generator(self) -> torch.Generator | None:
        """Per-request random stream: the same seed gives the same tokens, whatever else runs."""
        if self.greedy:
            return None
        generator = torch.Generator(device="cpu")
        generator.manual_seed(self.seed if self.seed is not None else random.getrandbits(63))
        return generator


def apply_logit_bias(logits: torch.Tensor, seqs) -> None:
    """logits: [B, V], one row per seq; adds each request's logit_bias in place, before the
    constraint masks (a masked token stays masked whatever its bias)."""
    for row, seq in enumerate(seqs):
        if not seq.params.logit_bias:
            continue
        if seq.bias is None:  # once per request: its ids and values as tensors on the logits' device
            bias = seq.params.logit_bias
            seq.bias = (torch.tensor(list(bias), dtype=torch.int64, device=logits.device),
                        torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device))
        logits[row].index_add_(0, *seq.bias)


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [V] float (masked entries -inf). Returns the chosen token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = logits.float() / params.temperature  # [V]
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)  # [V], [V]
        cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
        drop = cumulative - torch.softmax(sorted_scores, dim=-1) >= params.top_p  # keep the first token past p
        scores = scores.scatter(0, order[drop], float("-inf"))
    probs = torch.softmax(scores, dim=-1).cpu()  # [V]
    return int(torch.multinomial(probs, 1, generator=generator))


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> list[int]:
    """logits: [B, V]; one SamplingParams and generator per row. Returns B token ids."""
    if all(p.greedy for p in params):
        return torch.argmax(logits, dim=-1).tolist()
    return [sample_row(logits[i], p, g) for i, (p, g) in enumerate(zip(params, generators))]

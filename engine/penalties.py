"""Presence and frequency penalties (OpenAI semantics) over the tokens a request has generated."""

from __future__ import annotations

import torch


class TokenPenalties:
    """One request's penalties: logit[t] -= frequency * count(t) + presence * (count(t) > 0), where
    count(t) is how often t occurs in the request's output so far (forced tokens included).

    Counts are kept on the host token by token (``add``); the subtracted amounts live in one dense
    vector [V] on the logits' device, made at the first ``apply`` and updated there only at the
    entries of tokens added since, so a step costs one in-place subtraction per row.
    """

    def __init__(self, presence: float, frequency: float):
        self.presence = presence
        self.frequency = frequency
        self.counts: dict[int, int] = {}  # token id -> occurrences in the output
        self._pending: list[int] = []  # tokens added since the vector was last brought up to date
        self._vector: torch.Tensor | None = None  # [V] float32: the amount subtracted from each logit

    def add(self, token_id: int) -> None:
        """Counts one more output token (sampled or forced)."""
        self.counts[token_id] = self.counts.get(token_id, 0) + 1
        self._pending.append(token_id)

    def amount(self, token_id: int) -> float:
        """What is subtracted from token_id's logit now."""
        count = self.counts.get(token_id, 0)
        return self.frequency * count + (self.presence if count else 0.0)

    def apply(self, logits_row: torch.Tensor) -> None:
        """logits_row: [V]; subtracts the penalties in place."""
        if self._vector is None:
            self._vector = torch.zeros(logits_row.shape[-1], dtype=torch.float32, device=logits_row.device)
        for token_id in dict.fromkeys(self._pending):  # each changed entry once
            self._vector[token_id] = self.amount(token_id)
        self._pending.clear()
        logits_row.sub_(self._vector)


def make_penalties(params) -> TokenPenalties | None:
    """The request's TokenPenalties, or None when both penalties are zero (its row costs nothing)."""
    if not params.presence_penalty and not params.frequency_penalty:
        return None
    return TokenPenalties(params.presence_penalty, params.frequency_penalty)


def apply_penalties(logits: torch.Tensor, seqs) -> None:
    """logits: [B, V], one row per seq; subtracts each penalised request's penalties in place,
    after the logit bias and before the constraint masks (a masked token stays masked)."""
    for row, seq in enumerate(seqs):
        if seq.penalties is not None:
            seq.penalties.apply(logits[row])

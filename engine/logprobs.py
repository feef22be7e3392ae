"""Log-probabilities of the chosen tokens (and the likeliest alternatives) under the masked logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """One output token's log-probability under the distribution it was chosen from (after logit
    bias, penalties and the constraint's mask; no temperature), and up to k alternatives, likeliest
    first. ``top`` never holds a masked token, so under a tight mask it can be shorter than k."""
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


def forced_logprob(token_id: int, k: int) -> TokenLogprob:
    """A token the constraint forces is certain: logprob 0, and the only alternative is itself."""
    return TokenLogprob(token_id, 0.0, [(token_id, 0.0)] if k > 0 else [])


def step_logprobs(logits: torch.Tensor, seqs, tokens: list[int]) -> list[TokenLogprob | None] | None:
    """logits: [B, V], the step's final logits (masked entries -inf), one row per seq; tokens: the
    B chosen ids. Returns one TokenLogprob per row whose request asked (params.logprobs is not
    None), else None in its place; None for the whole step when no row asked.

    Batched over the rows that asked: one log_softmax, one topk and one host sync."""
    rows = [row for row, seq in enumerate(seqs) if seq.params.logprobs is not None]
    if not rows:
        return None
    ks = [seqs[row].params.logprobs for row in rows]  # each 0..MAX_TOP_LOGPROBS (SamplingParams checks)
    k = max(ks)
    index = torch.tensor(rows, device=logits.device)  # [R]
    chosen = torch.tensor([tokens[row] for row in rows], device=logits.device).unsqueeze(1)  # [R, 1]
    logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)  # [R, V]
    parts = [logprobs.gather(1, chosen).double()]  # [R, 1]
    if k > 0:
        top = torch.topk(logprobs, k, dim=-1)  # values, indices: [R, k]
        parts += [top.values.double(), top.indices.double()]  # ids exact in float64
    packed = torch.cat(parts, dim=1).tolist()  # [R, 1 + 2k]: the one host sync
    out: list[TokenLogprob | None] = [None] * len(seqs)
    for row, row_k, values in zip(rows, ks, packed):
        top_list = [(int(values[1 + k + j]), values[1 + j]) for j in range(row_k)
                    if values[1 + j] != float("-inf")]
        out[row] = TokenLogprob(tokens[row], values[0], top_list)
    return out

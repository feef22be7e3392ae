"""Sampling parameters and the choice of the next token of each row from its logits."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.host_logits import host_rows
from engine.logprobs import MAX_TOP_LOGPROBS
from grammars.masks.sparse_mask import SparseMask, pick_routine, rows_routine


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
    forced_extend: bool = True  # feed a run of grammar-forced tokens in one forward pass (scheduler.py)

    def __post_init__(self):
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS} (or None for none); "
                             f"got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator | None:
        """Per-request random stream, on the device that samples (sample() draws from it there):
        the same seed gives the same tokens, whatever else runs."""
        if self.greedy:
            return None
        generator = torch.Generator(device=device)
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


class Narrowed(dict):
    """{row: SparseMask}: the greedy rows a logits hook left unwritten (ConstraintMasker), for
    settle() to pick under their masks. ``picker``: settle()'s one C call and its first arguments,
    (pick_rows, address, row stride, (rows, vocab)), where the hook that made it read the logits and
    found them float32 on the CPU with rows of unit stride; else None (settle() asks the logits).
    After a forward pass each of torch's attribute reads costs 1.5-2.5 µs; the hook has read the
    logits already, so they are read once a step. A slot, set by whoever makes one: no instance dict."""

    __slots__ = ("picker",)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list,
           narrowed: dict[int, SparseMask] | None = None) -> list[int]:
    """logits: [B, V] (masked entries -inf); one SamplingParams and generator per row (None for
    greedy rows). Returns B token ids; the .tolist() is the step's only host sync.

    ``narrowed``: row -> SparseMask, for greedy rows of CPU logits whose mask a logits hook left
    unwritten (ConstraintMasker; a Narrowed): settle() picks their tokens under those masks."""
    if not narrowed:
        return choose(logits, params, generators).tolist()
    if len(narrowed) == len(params) and all(mask.allowed for mask in narrowed.values()):
        return settle(logits, [0] * len(params), narrowed)  # no row needs the whole row's argmax
    return settle(logits, choose(logits, params, generators).tolist(), narrowed)


def settle(logits: torch.Tensor, tokens: list[int], narrowed: dict[int, SparseMask]) -> list[int]:
    """The narrowed greedy rows' tokens, each the argmax of its row under its mask (the first of
    equal maxima, as over the masked row): over the allowed ids alone; or, for banned ids, the
    row's own argmax (``tokens[row]``) unless banned, and only then the row masked and argmaxed
    again. logits: [B, V] float on CPU; tokens: B ids, edited in place and returned.

    In C where it is built: through the CPython extension where Python's headers are present, in one
    call for all the rows (grammars/index/_fast_calls.c pick_rows: after the forward pass each Python-level
    step of this loop cost 1.5-4 µs with the caches cold), else a ctypes call per row
    (grammars/index/_mask_row.c pick_f32, the row left as it was; numpy's indexing and argmax cost 8-12 µs
    per row in real generations); else numpy. A Narrowed's ``picker`` is that one call, made without
    reading the logits again."""
    picker = narrowed.picker if type(narrowed) is Narrowed else None
    if picker is not None:
        routine, base, step, shape = picker
        routine(base, step, shape, narrowed, tokens)
        return tokens
    rows = rows_routine()
    step, unit = logits.stride()  # torch's attribute calls cost 1.5-2.5 µs each here: each asked once
    if unit == 1 and logits.dtype is torch.float32:
        if rows is not None:
            rows(logits.data_ptr(), step, logits.shape, narrowed, tokens)
            return tokens
        routine = pick_routine()
        if routine is not None:
            base, vocab = logits.data_ptr(), logits.shape[1]
            for row, mask in narrowed.items():
                tokens[row] = (mask.single if mask.single >= 0  # one allowed token (forced): no call
                               else routine(base + row * step * 4, vocab, mask.address, mask.size, mask.allowed,
                                            tokens[row]))
            return tokens
    scores = logits.numpy()  # [B, V], a view
    for row, mask in narrowed.items():
        ids = mask.id_array()  # [k] ascending
        if mask.allowed:
            tokens[row] = int(ids[scores[row, ids].argmax()])
            continue
        at = int(np.searchsorted(ids, tokens[row]))
        if at < ids.size and ids[at] == tokens[row]:  # the likeliest token is banned: mask, then argmax
            scores[row, ids] = -np.inf
            tokens[row] = int(scores[row].argmax())
    return tokens


def choose(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> torch.Tensor:
    """sample() without the host sync: [B] int64 token ids on the logits' device.

    Batched: per-row temperature; one topk over the rows with a top_k and one sort over those
    with only a top_p (_cut_groups); then one exponential race, argmax(probs / E) with E = -log U ~
    Exp(1), which draws from probs exactly as multinomial would. Each row's U [V] comes from its
    own generator (on the logits' device), V draws per step whatever the batch holds, so a seed
    gives the same tokens alone or batched."""
    if all(p.greedy for p in params):
        return _argmax(logits)
    vocab = logits.shape[-1]
    settings = _to_device([[p.temperature, p.top_p, p.top_k] for p in params], logits.device,
                          torch.float32)  # [B, 3]; top_k as float: exact below 2**24
    temperature, top_p, top_k = settings.unbind(1)  # [B] each
    greedy = (temperature <= 0) | (top_k == 1)  # [B], as SamplingParams.greedy
    scores = logits.float() / torch.where(greedy, 1.0, temperature)[:, None]  # [B, V]
    for group, width in _cut_groups(params, vocab):  # most requests cut nothing: no sort for them
        rows = _to_device(group, logits.device, torch.int64)  # [B']
        cut = _cut_top_k_top_p(scores.index_select(0, rows), top_k[rows], top_p[rows], width)  # [B', V]
        scores.index_copy_(0, rows, cut)
    probs = torch.softmax(scores, dim=-1)  # [B, V]; masked and cut tokens exactly 0
    race = torch.ones_like(probs)  # [B, V]; greedy rows draw nothing (their argmax wins below)
    for row, (p, generator) in enumerate(zip(params, generators)):
        if not p.greedy:
            race[row].uniform_(generator=generator)  # uniform_ then log: on CPU far faster than exponential_
    # U inside (0, 1): E finite and > 0, so any allowed token (probs > 0) beats every masked one (0)
    race = race.clamp_(torch.finfo(race.dtype).tiny, 1 - torch.finfo(race.dtype).eps).log_().neg_()
    sampled = _argmax(probs / race)  # [B]
    return torch.where(greedy, _argmax(logits), sampled)


def _argmax(scores: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B] int64: torch.argmax, through numpy for float32 on CPU (a view, no copy): on 2
    cores torch's CPU argmax took 1.1 ms over 8 rows of 49k and numpy's 57 µs (4.2 ms and 0.54 ms
    over 262k); the first of equal maxima either way."""
    host = host_rows(scores)  # the engine's own rows (engine/host_logits.py): no numpy() call after the pass
    if host is not None:
        return torch.from_numpy(host.array.argmax(axis=-1))
    if scores.device.type == "cpu" and scores.dtype == torch.float32:
        return torch.from_numpy(scores.numpy().argmax(axis=-1))
    return torch.argmax(scores, dim=-1)


def _to_device(data: list, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A Python list as a tensor on device, without a host sync: a pageable CUDA copy waits for
    the queued forward pass, a pinned non_blocking one does not."""
    table = torch.tensor(data, dtype=dtype)
    if torch.device(device).type == "cuda":
        return table.pin_memory().to(device, non_blocking=True)
    return table.to(device)


def _cut_groups(params: list[SamplingParams], vocab: int) -> list[tuple[list[int], int]]:
    """The sampled rows that cut, as (rows, width) groups: those with a top_k share one topk of
    their largest k (on CPU far cheaper than a sort), those with only a top_p one full sort."""
    with_k = [row for row, p in enumerate(params) if not p.greedy and 0 < p.top_k < vocab]
    only_p = [row for row, p in enumerate(params)
              if not p.greedy and not 0 < p.top_k < vocab and p.top_p < 1.0]
    groups = []
    if with_k:
        groups.append((with_k, max(params[row].top_k for row in with_k)))
    if only_p:
        groups.append((only_p, vocab))
    return groups


def _cut_top_k_top_p(scores: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     width: int) -> torch.Tensor:
    """scores: [B, V]; top_k, top_p: [B] (0 and >= 1.0: no limit); width: the most tokens a row
    keeps (V unless every row has a top_k below V). Returns scores with -inf below each row's
    cut: top_k, then top_p over what top_k kept (the first token past p stays, the best one
    always). The cut is a score threshold, so tokens tied with the last kept one stay too and no
    row depends on how a sort or topk orders ties, which may change with the batch around it."""
    if width < scores.shape[-1]:
        best = torch.topk(scores, width, dim=-1).values  # [B, W], descending
    else:
        best = torch.sort(scores, dim=-1, descending=True).values  # [B, V]
    rank = torch.arange(width, device=scores.device)  # [W]
    cut = rank >= torch.where(top_k > 0, top_k, width)[:, None]  # [B, W]
    probs = torch.softmax(best.masked_fill(cut, float("-inf")), dim=-1)  # [B, W]
    before = probs.cumsum(dim=-1) - probs  # mass of the better tokens: keeps the first token past p
    cut |= (before >= top_p[:, None]) & (top_p < 1.0)[:, None]  # top_p 1.0: no cut from rounding
    kept = (~cut).sum(dim=-1).clamp_min(1)  # [B]; the kept ranks are a prefix; top_p 0 keeps one
    threshold = best.gather(1, (kept - 1)[:, None])  # [B, 1]: the last kept score
    return scores.masked_fill(scores < threshold, float("-inf"))

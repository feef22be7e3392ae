"""The tiny random-weight Llama and the helpers the engine tests share: an engine Driver stepped from
the test thread, ForcesRun, prompts and runs."""

import asyncio

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.sequence import Request

VOCAB = 49152


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def engine(tiny_model, smollm_tokenizer):
    eng = Engine(tiny_model, smollm_tokenizer, torch.device("cpu"), frozenset({2}), context_length=512)
    eng.start()
    yield eng
    eng.shutdown()


def run(engine, request):
    async def collect():
        return [event async for event in engine.generate(request)]
    return asyncio.run(collect())


def prompt(tokenizer, text="The quick brown fox"):
    return tokenizer.encode(text, add_special_tokens=False)


def only_tokens(allowed, seen_shapes=None):
    """A logits hook that masks every token but ``allowed``, as a constraint does."""
    def hook(logits, seqs):  # logits [B, V]
        if seen_shapes is not None:
            seen_shapes.append(tuple(logits.shape))
        keep = logits[:, allowed].clone()
        logits.fill_(float("-inf"))
        logits[:, allowed] = keep
    return hook


def run_hooked(tiny_model, tokenizer, hook, params):
    eng = Engine(tiny_model, tokenizer, torch.device("cpu"), frozenset({2}), 512, logits_hooks=[hook])
    eng.start()
    try:
        return run(eng, Request(prompt_ids=prompt(tokenizer), params=params))
    finally:
        eng.shutdown()


class ForcesRun:
    """A free-text constraint (engine/constraint.py) that forces ``tokens`` right after the first
    sampled token (jump-forward)."""
    budget_forced = False

    def __init__(self, tokens):
        self.tokens, self.advanced = list(tokens), 0

    def ready(self):
        return True

    def fill(self, row, budget=None):
        row.fill_(-1)  # every token

    def sparse_mask(self, budget=None):
        return None

    def advance(self, token):
        self.advanced += 1

    def rollback(self, n):
        self.advanced -= n

    def forced(self):
        return self.tokens if self.advanced == 1 else []

    def finished(self):
        return False

    def closed(self):
        return False

    def is_terminated(self):
        return False

    def min_tokens(self):
        return 0

    def free_text(self):
        return True


class Driver:
    """An engine stepped from the test thread (never started): check_integrity() after every step,
    and the most rows that decoded together kept. Requests are greedy and ignore EOS unless told."""

    def __init__(self, model, tokenizer, context_length: int, max_tokens: int = 8, eos=frozenset({2}), **kwargs):
        self.engine = Engine(model, tokenizer, torch.device("cpu"), eos, context_length=context_length, **kwargs)
        self.max_tokens = max_tokens
        self.events: dict[int, list] = {}
        self.most_rows = 0

    def submit(self, prompt, constraint=None, **params) -> Request:
        params = {"temperature": 0, "ignore_eos": True, "max_tokens": self.max_tokens, **params}
        request = Request(prompt_ids=list(prompt), params=SamplingParams(**params), constraint=constraint)
        self.events[request.request_id] = []
        request.emit = self.events[request.request_id].append
        self.engine.submit(request)
        return request

    def step(self) -> None:
        self.engine._drain_inbox()
        self.engine.step()
        self.engine.check_integrity()  # includes: the KV tensors stay within the budget
        self.most_rows = max(self.most_rows, len(self.engine.scheduler.rows))

    def run(self) -> None:
        self.engine._drain_inbox()
        while self.engine._running or self.engine._waiting:
            self.step()

    def tokens(self, request) -> list[int]:
        return [t for e in self.events[request.request_id] for t in e.token_ids]

    def last(self, request):
        return self.events[request.request_id][-1]

    def done(self, request) -> bool:
        events = self.events[request.request_id]
        return bool(events) and events[-1].finish_reason is not None

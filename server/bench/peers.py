"""The constrained-decoding peers `maskd bench` runs beside maskd where installed (`make peers`, or
`pip install -e '.[peers]'`), on the same prompt ids, model, schema and budget as maskd:

- xgrammar: transformers' generate() on maskd's model object with xgrammar's own logits processor
  (xgrammar.contrib.hf.LogitsProcessor);
- outlines: generate() with the logits processor outlines' generator hands transformers
  (OutlinesCoreLogitsProcessor over an outlines-core Index, built in maskd's killable compile
  worker under maskd's time limit);
- llguidance: generate() with its LLMatcher, bitmask fill and apply (llguidance ships those, not a
  transformers processor: LLGuidanceProcessor joins them in a few lines);
- llama-cpp-python: llama.cpp on the very GGUF file maskd loaded (where the model is one), with the
  GBNF grammar LlamaGrammar.from_json_schema makes. Its own runtime (quantized kernels, not maskd's
  float weights), so only its own constrained / unconstrained ratio compares like for like.

Greedy throughout. JSON is compact where the peer lets one say so (xgrammar: no whitespace and
separators "," ":"; outlines: whitespace pattern ""; llguidance: whitespace_flexible off); llama.cpp's
schema grammar allows its own bounded whitespace. A peer that is not installed is skipped, never
failed; one that fails to start is skipped with its error.

Every run returns its new token ids and the time each step's logits were ready (StepClock, or each
token llama.cpp yields), so decode_rate() counts tokens per step the same way for every peer.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import time

import torch

PEERS = {"xgrammar": "xgrammar", "outlines": "outlines", "llguidance": "llguidance",
         "llama-cpp-python": "llama_cpp"}  # name -> module


def missing() -> dict[str, str]:
    """The peers that are not installed, each with why it is skipped."""
    return {name: "not installed" for name, module in PEERS.items() if importlib.util.find_spec(module) is None}


def decode_rate(times: list[float]) -> float:
    """Tokens/s after the first: step k's time is when its token's logits were ready, so the n - 1
    intervals between the first and the last hold n - 1 whole steps (forward, mask, sample)."""
    if len(times) < 2 or times[-1] <= times[0]:
        return float("nan")
    return (len(times) - 1) / (times[-1] - times[0])


class StepClock:
    """A transformers logits processor that notes when each step's logits arrive, then runs ``inner``
    (a peer's processor, or none)."""

    def __init__(self, inner=None) -> None:
        self.inner, self.times = inner, []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores if self.inner is None else self.inner(input_ids, scores)


class LLGuidanceProcessor:
    """llguidance's LLMatcher as a transformers logits processor: consumes the token the last step
    chose, fills the bitmask and applies it (llguidance.torch)."""

    def __init__(self, llguidance, lltok, grammar: str) -> None:
        import llguidance.torch as lt

        self.lt, self.matcher, self.started = lt, llguidance.LLMatcher(lltok, grammar), False
        self.bitmask = lt.allocate_token_bitmask(1, lltok.vocab_size)  # [1, ceil(V / 32)] int32

    def __call__(self, input_ids, scores):  # input_ids [1, P + k], scores [1, V]
        if self.started:
            self.matcher.consume_token(int(input_ids[0, -1]))
        self.started = True
        self.lt.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        self.lt.apply_token_bitmask_inplace(scores, self.bitmask)
        return scores


class HFPeer:
    """transformers' generate() on maskd's model object; ``made`` is a factory of fresh logits
    processors (a peer's), or None for unconstrained."""

    def __init__(self, stack) -> None:
        self.model, self.tokenizer = stack.engine.runner.model, stack.loaded.tokenizer
        self.eos, self.vocab_size = sorted(stack.engine.eos_token_ids), stack.vocabulary.size

    def generate(self, made, prompt_ids: list[int], max_new_tokens: int,
                 ignore_eos: bool = False) -> tuple[list[int], list[float]]:
        prompt = torch.tensor([prompt_ids], device=self.model.device)  # [1, P]
        clock = StepClock(made() if made is not None else None)
        extra = {"min_new_tokens": max_new_tokens} if ignore_eos else {}
        with torch.inference_mode():
            out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt), logits_processor=[clock],
                                      max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=self.eos,
                                      pad_token_id=self.eos[0], **extra)  # [1, P + T]
        return out[0, len(prompt_ids):].tolist(), clock.times

    def close(self) -> None:
        pass


class XGrammarPeer(HFPeer):
    def __init__(self, stack) -> None:
        super().__init__(stack)
        import xgrammar
        from xgrammar.contrib.hf import LogitsProcessor

        info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                       stop_token_ids=self.eos)
        self.compiler, self.processor = xgrammar.GrammarCompiler(info, max_threads=1), LogitsProcessor

    def compile_grammar(self, schema: dict):
        """xgrammar's CompiledGrammar (its compiler caches it: a second call is its warm compile)."""
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def compile(self, schema: dict):
        grammar = self.compile_grammar(schema)
        return lambda: self.processor(grammar)


class OutlinesPeer(HFPeer):
    def __init__(self, stack) -> None:
        super().__init__(stack)
        import outlines
        from outlines.backends.outlines_core import OutlinesCoreBackend, OutlinesCoreLogitsProcessor

        from grammars.compile.compile_worker import CompileWorker

        backend = OutlinesCoreBackend(outlines.from_transformers(self.model, self.tokenizer))
        self.worker = CompileWorker(pickle.dumps(backend.vocabulary))
        self.processor, self.timeout_s = OutlinesCoreLogitsProcessor, stack.compiler.timeout_s

    def compile(self, schema: dict):
        from outlines_core.json_schema import build_regex_from_schema

        index = self.worker.build(build_regex_from_schema(json.dumps(schema), ""), self.timeout_s)
        return lambda: self.processor(index, "torch")

    def close(self) -> None:
        self.worker.kill()


class LLGuidancePeer(HFPeer):
    def __init__(self, stack) -> None:
        super().__init__(stack)
        import llguidance
        import llguidance.hf

        self.llguidance = llguidance
        self.lltok = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos)

    def compile_grammar(self, schema: dict) -> str:
        """llguidance's grammar for ``schema``, checked by building a matcher (where its work is done)."""
        grammar = self.llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                                     defaults={"whitespace_flexible": False})
        matcher = self.llguidance.LLMatcher(self.lltok, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def compile(self, schema: dict):
        grammar = self.compile_grammar(schema)
        return lambda: LLGuidanceProcessor(self.llguidance, self.lltok, grammar)


class LlamaCppPeer:
    """llama.cpp on the GGUF file maskd loaded, in a process of its own (server/bench/llama_process.py);
    ``made`` is the index of a grammar that process compiled, or None."""

    def __init__(self, stack) -> None:
        where, gguf = stack.loaded.spec.locate()
        if gguf is None:
            raise RuntimeError(f"the model {stack.loaded.name} is not a GGUF file")
        from engine.omp_team import cores
        from server.bench.llama_process import LlamaProcess

        self.llm = LlamaProcess(f"{where}/{gguf}", cores())  # as many threads as maskd's forward passes use
        self.eos = set(stack.engine.eos_token_ids) | {self.llm.call("eos")}

    def compile(self, schema: dict):
        return self.llm.call("compile", json.dumps(schema))

    def generate(self, made, prompt_ids: list[int], max_new_tokens: int,
                 ignore_eos: bool = False) -> tuple[list[int], list[float]]:
        return self.llm.call("generate", made, list(prompt_ids), max_new_tokens, ignore_eos, self.eos)

    def prefill(self, prompt_ids: list[int]) -> float:
        """Seconds llama.cpp takes to evaluate the prompt from an empty context."""
        return self.llm.call("prefill", list(prompt_ids))

    def close(self) -> None:
        self.llm.close()


STARTERS = {"xgrammar": XGrammarPeer, "outlines": OutlinesPeer, "llguidance": LLGuidancePeer,
            "llama-cpp-python": LlamaCppPeer}


class Peers:
    """Every installed peer, started on maskd's loaded stack; ``skipped`` says why each other is not."""

    def __init__(self, stack, names=tuple(PEERS)) -> None:
        self.skipped = {name: why for name, why in missing().items() if name in names}
        self.ready: dict[str, object] = {}
        for name in names:
            if name in self.skipped:
                continue
            try:
                self.ready[name] = STARTERS[name](stack)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot start is skipped, with why
                self.skipped[name] = f"failed to start: {type(exc).__name__}: {exc}"

    def compile(self, schema: dict) -> dict[str, object]:
        """Per ready peer: what its runs take (a processor factory or grammar), or why it refused."""
        made: dict[str, object] = {}
        for name, peer in self.ready.items():
            try:
                made[name] = peer.compile(schema)
            except Exception as exc:  # noqa: BLE001 - any compile failure is a refusal
                made[name] = f"refused: {type(exc).__name__}: {exc}"
        return made

    def generate(self, name: str, made, prompt_ids: list[int], max_new_tokens: int,
                 ignore_eos: bool = False) -> tuple[list[int], list[float]]:
        return self.ready[name].generate(made, prompt_ids, max_new_tokens, ignore_eos)

    def close(self) -> None:
        for peer in self.ready.values():
            peer.close()

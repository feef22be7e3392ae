"""Constrained vs unconstrained decode tokens/s with the embedded model, same prompts, same run.

    python benchmarks/constrained_bench.py [--tokens 64] [--rounds 4]

The constrained side decodes under a JSON schema whose string fields leave the model room to write
(the mask is filled and applied at every step; forced tokens are fed like any other); the other side
decodes freely. Rounds alternate; the verdict is the ratio of medians. Writes
benchmarks/results/constrained_bench.json and constrained_bench.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from round_plot import plot_rounds  # benchmarks/ is on sys.path when run as a script
from engine.constraint_hook import ConstraintMasker
from engine.engine import Engine
from engine.model_loader import load_model
from engine.registry import load_registry
from engine.sampling import SamplingParams
from engine.sequence import Request
from grammars import GrammarCompiler, TokenVocabulary

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "Describe a fictional city as JSON, with a long history."
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "history": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["name", "history", "population"], "additionalProperties": False}


def timed(engine: Engine, request: Request) -> tuple[float, int]:
    async def run() -> int:
        last = None
        async for last in engine.generate(request):
            pass
        return last.completion_tokens
    started = time.perf_counter()
    count = asyncio.run(run())
    return count / (time.perf_counter() - started), count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    loaded = load_model(load_registry().get(None))
    tok = loaded.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
    vocab = TokenVocabulary.from_tokenizer(tok, loaded.vocab_size, extra_eos_token_ids=tuple(loaded.eos_token_ids))
    compiler = GrammarCompiler(vocab)
    grammar = compiler.compile_json_schema(SCHEMA)
    engine = Engine(loaded.model, tok, loaded.device, loaded.eos_token_ids, loaded.context_length,
                    logits_hooks=[ConstraintMasker(loaded.vocab_size, 8)])
    engine.start()

    def free() -> Request:
        return Request(prompt_ids=prompt, params=SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True))

    def constrained() -> Request:
        return Request(prompt_ids=prompt, constraint=grammar.matcher(),
                       params=SamplingParams(max_tokens=args.tokens, temperature=0))

    timed(engine, free()), timed(engine, constrained())  # warm-up (mask states memoised as in serving)
    runs = {"unconstrained": [], "json_schema": []}
    counts = {"unconstrained": [], "json_schema": []}
    for _ in range(args.rounds):
        for name, make in (("unconstrained", free), ("json_schema", constrained)):
            rate, count = timed(engine, make())
            runs[name].append(rate)
            counts[name].append(count)
    engine.shutdown()
    compiler.close()
    medians = {k: statistics.median(v) for k, v in runs.items()}
    ratio = medians["json_schema"] / medians["unconstrained"]
    print(f"\n{loaded.name} on {loaded.device}, prompt {len(prompt)} tokens, up to {args.tokens} new tokens, "
          f"{args.rounds} interleaved rounds")
    print(f"{'decoding':16} {'median tok/s':>12} {'tokens':>8}")
    for name in runs:
        print(f"{name:16} {medians[name]:12.2f} {statistics.median(counts[name]):8.0f}")
    print(f"constrained / unconstrained = {ratio:.3f} (target >= 0.97): {'MET' if ratio >= 0.97 else 'NOT MET'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "constrained_bench.json").write_text(json.dumps(
        {"runs_tok_s": runs, "tokens": counts, "median_tok_s": medians, "ratio": ratio}, indent=2))
    plot_rounds(runs, RESULTS / "constrained_bench.png", f"constrained / unconstrained = {ratio:.3f}")


if __name__ == "__main__":
    main()

"""Decode tokens/s of maskd's engine against plain transformers generate(), same prompt, same run.

    python benchmarks/decode_bench.py [--tokens 64] [--rounds 5]

Rounds alternate the two so that machine noise hits both alike; the verdict is the ratio of medians.
Prints a table, writes benchmarks/results/decode_bench.json and decode_bench.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import torch

from round_plot import plot_rounds  # benchmarks/ is on sys.path when run as a script
from engine.engine import Engine
from engine.model_loader import load_model
from engine.registry import load_registry
from engine.sampling import SamplingParams
from engine.sequence import Request

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def hf_generate(loaded, prompt_ids: list[int], tokens: int) -> float:
    ids = torch.tensor([prompt_ids], device=loaded.device)
    started = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                    attention_mask=torch.ones_like(ids))
    elapsed = time.perf_counter() - started
    assert out.shape[1] - ids.shape[1] == tokens
    return tokens / elapsed


def maskd_generate(engine: Engine, prompt_ids: list[int], tokens: int) -> float:
    async def run() -> int:
        last = None
        request = Request(prompt_ids=prompt_ids,
                          params=SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
        async for last in engine.generate(request):
            pass
        return last.completion_tokens
    started = time.perf_counter()
    count = asyncio.run(run())
    elapsed = time.perf_counter() - started
    assert count == tokens
    return tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()

    loaded = load_model(load_registry().get(args.model))
    tok = loaded.tokenizer
    prompt_ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                    add_generation_prompt=True), add_special_tokens=False)
    engine = Engine(loaded.model, tok, loaded.device, loaded.eos_token_ids, loaded.context_length)
    engine.start()
    hf_generate(loaded, prompt_ids, 8)  # warm-up both paths
    maskd_generate(engine, prompt_ids, 8)
    runs = {"transformers.generate": [], "maskd": []}
    for _ in range(args.rounds):
        runs["transformers.generate"].append(hf_generate(loaded, prompt_ids, args.tokens))
        runs["maskd"].append(maskd_generate(engine, prompt_ids, args.tokens))
    engine.shutdown()

    medians = {name: statistics.median(values) for name, values in runs.items()}
    ratio = medians["maskd"] / medians["transformers.generate"]
    print(f"\nmodel {loaded.name} on {loaded.device} ({loaded.dtype}), prompt {len(prompt_ids)} tokens, "
          f"{args.tokens} new tokens, {args.rounds} interleaved rounds")
    print(f"{'path':24} {'median tok/s':>12} {'min':>8} {'max':>8}")
    for name, values in runs.items():
        print(f"{name:24} {medians[name]:12.1f} {min(values):8.1f} {max(values):8.1f}")
    print(f"maskd / transformers = {ratio:.3f} (target >= 0.90): {'MET' if ratio >= 0.9 else 'NOT MET'}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "decode_bench.json").write_text(json.dumps({
        "model": loaded.name, "device": str(loaded.device), "prompt_tokens": len(prompt_ids),
        "new_tokens": args.tokens, "runs_tok_s": runs, "median_tok_s": medians, "ratio": ratio}, indent=2))
    plot_rounds(runs, RESULTS / "decode_bench.png", f"{loaded.name}: maskd / generate() = {ratio:.2f}")
    print(f"wrote {RESULTS / 'decode_bench.json'} and decode_bench.png")


if __name__ == "__main__":
    main()

"""The precision's fidelity for `maskd bench --suite speed`: perplexity on data/fidelity.txt and the
first 16 greedy tokens on 50 chat prompts, float32 against bfloat16 matmuls and against what
`auto` picks (engine/precision.py)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch

from server.bench.context import BenchContext

TEXT = Path(__file__).resolve().parent / "data" / "fidelity.txt"
SUBJECTS = ("the sea", "a library", "bread", "rain", "a train", "the moon", "chess", "a garden", "music", "winter")
FORMS = ("Write one sentence about {}.", "Tell me a fact about {}.", "{} is", "Describe {} in a few words.",
         "A short poem about {}:")
PROMPTS = [form.format(subject) for subject in SUBJECTS for form in FORMS]  # 50

def _perplexity_and_greedy(model, tokenizer, prompts) -> tuple[float, list[list[int]]]:
    with torch.inference_mode():
        ids = torch.tensor([tokenizer(TEXT.read_text())["input_ids"]])
        logits = model(input_ids=ids).logits.float()
        nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
        greedy = []
        for text in prompts:
            x = torch.tensor([tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                            add_generation_prompt=True, return_dict=True)["input_ids"]])
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=16,
                                 pad_token_id=tokenizer.eos_token_id)
            greedy.append(out[0, x.shape[1]:].tolist())
    return math.exp(nll), greedy


def fidelity(ctx: BenchContext, progress) -> dict:
    from engine import precision
    from engine.model_loader import load_model
    from engine.registry import load_registry

    spec = load_registry(ctx.models).get(ctx.model)
    plain = copy.copy(spec)
    object.__setattr__(plain, "dtype", "float32")
    object.__setattr__(plain, "quantization", "none")
    loaded = load_model(plain, "cpu")
    prompts = PROMPTS[:2] if ctx.tiny else PROMPTS
    base_ppl, base = _perplexity_and_greedy(loaded.model, loaded.tokenizer, prompts)
    gguf = "/".join(spec.locate()) if spec.locate()[1] else None
    rows = [{"precision": "float32", "perplexity": base_ppl, "x float32": 1.0, "greedy equal": 1.0}]
    for label, dtype, quantization in (("bfloat16 matmuls", "bfloat16", "none"), ("auto", spec.dtype, spec.quantization)):
        chosen = precision.choose(spec.name, dtype, quantization, torch.device("cpu"), gguf)
        model = copy.deepcopy(loaded.model)
        precision.apply(model, chosen)
        ppl, greedy = _perplexity_and_greedy(model, loaded.tokenizer, prompts)
        rows.append({"precision": f"{label}: {chosen.describe()}", "perplexity": ppl, "x float32": ppl / base_ppl,
                     "greedy equal": sum(a == b for a, b in zip(greedy, base)) / len(prompts)})
        progress.update(1)
    return {"rows": rows, "prompts": len(prompts)}

"""The engine on a GPU, in one script (issue 13, item 5): a Llama-3-8B-shaped random-weight model in
bf16, the engine's equivalence checks run on the device, then the engine-step benchmarks.

    python benchmarks/cuda_check.py [--shape llama3-8b|tiny] [--device cuda|cpu] [--dtype ...]
                                    [--tokenizer DIR] [--out DIR]
    python benchmarks/cuda_check.py --save-tokenizer DIR   # the embedded tokenizer, for a GPU box

Equivalence (greedy tokens through the Engine, stepped from this thread, integrity checked after
every step; as tests/engine/test_model_families.py and tests/engine/test_slot_cache.py do on the CPU):
- eight rows of different prompt lengths batched == each alone, and alone == plain transformers
  (a full forward per token, no cache);
- a prefix-cache hit (a shared prefix, a conversation's next turn) == the same prompt missing;
- a forced run (jump-forward, fed in one pass) == the same tokens fed as prompt;
- a constraint that allows five tokens, masked on the device by ConstraintMasker: every token of
  its rows is one of them, and is plain transformers' argmax over them; a free row beside it.
On the CPU in float32 every token must be equal. In bf16, or on a GPU, two computations of the same
logits differ in their last bits (batch size and prompt chunking change the matmul and attention
kernels and their reduction order), so a token may flip where two logits nearly tie. There the
rule is: the first token of batched vs alone must be equal (both come from the same prefill pass
over one slot, the same arithmetic), and where two token lists first part, both tokens must lie
within TIE standard deviations of the top logit of plain transformers at that point (a near tie);
past that point the texts differ and cannot be compared, so agreement rates are reported, and every
divergence is printed. A failed check makes the exit status 1.

Benchmarks (server/bench/engine_step.py's functions, over this model): the decode step of 8 rows at
a short and a long context vs a bare forward over transformers' StaticCache; a long prompt arriving
while 7 rows decode; a soak with prompt lengths up to the context under a KV budget below their
sum; decode tokens/s at batch 1 and 8.

The Llama shape has a 128,256-token vocabulary and there is no Llama tokenizer here: the engine
needs a tokenizer only to detokenize, so the embedded SmolLM2 one serves (ids past its 49,152
decode to nothing); prompts are random ids below its size, and every request ignores EOS.

Writes <out>/cuda_check-<device name>[-<shape>].json after every section (so a run cut short still
leaves its numbers; "complete" tells) and prints progress with elapsed time, then a table.
`--shape tiny --device cpu` proves the script on the CPU in under two minutes.

On a GPU box without this project's environment (no gguf, no registry model), save the tokenizer
here first and carry it: `--save-tokenizer .gpu/tokenizer`, then there
`PYTHONUNBUFFERED=1 python3 benchmarks/cuda_check.py --tokenizer .gpu/tokenizer --out $OUT`.
It needs torch, transformers, numpy, pyyaml, tqdm, prometheus-client and pytest (tests/engine_fixtures.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # engine, server: also where the project is not installed
sys.path.append(str(ROOT / "tests"))  # engine_fixtures (ForcesRun), behind every installed package

import torch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TIE = 0.1  # a divergence is a near tie when both tokens' logits are within TIE * std of the top one
FIRST = 4  # agreement is reported over the first FIRST tokens and over all

# Llama 3.1's rope scaling; its original context must lie below max_position_embeddings (8192 here,
# which bounds the benchmarks' contexts), or transformers warns. The scaling is static (which
# frequencies are stretched), so with random weights the value changes nothing that is measured.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 2048}
SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_parameters=LLAMA3_ROPE, initializer_range=0.02),
    # as tests/engine/test_model_families.py's llama3: rope scaled past 32 positions; initializer_range 0.2
    # makes attention and logits peaked, so a wrong mask or position changes tokens
    "tiny": dict(vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
                 rope_parameters={**LLAMA3_ROPE, "original_max_position_embeddings": 32}),
}


@dataclass(frozen=True)
class Sizes:
    lengths: tuple[int, ...]  # the eight prompts batched vs alone
    new: int  # tokens generated per request in the checks
    chunk: int  # prefill chunk in the checks: the longer prompts prefill in several passes
    prefix: tuple[int, ...]  # shared prefix, first tail, sibling tail, next-turn tail, a longer row beside
    forced: tuple[int, ...]  # three prompts; the first is forced
    run: int  # forced run length
    contexts: tuple[int, int]  # decode step: 8 rows at these prompt lengths
    steps: int  # timed decode steps per context (each of maskd and bare)
    blocks: int
    short: int  # prefill interference: 7 rows of `short`, a newcomer of `long` in chunks of `long_chunk`
    long: int
    long_chunk: int
    soak_new: int
    rate_prompt: int  # tokens/s at batch 1 and 8
    rate_steps: int


SIZES = {
    "llama3-8b": Sizes(lengths=(5, 30, 77, 150, 260, 400, 640, 1000), new=16, chunk=256,
                       prefix=(600, 20, 30, 10, 900), forced=(260, 60, 130), run=12, contexts=(100, 3000),
                       steps=96, blocks=8, short=100, long=3000, long_chunk=512, soak_new=16,
                       rate_prompt=100, rate_steps=48),
    "tiny": Sizes(lengths=(3, 7, 9, 14, 21, 30, 37, 45), new=16, chunk=16, prefix=(30, 5, 7, 4, 44),
                  forced=(26, 6, 13), run=5, contexts=(16, 200), steps=8, blocks=2, short=16, long=200,
                  long_chunk=32, soak_new=4, rate_prompt=16, rate_steps=16),
}
SOAK = (1.0, 0.73, 0.037, 0.49, 0.012, 0.24, 0.85, 0.12, 0.37, 0.006)  # prompt lengths, share of the context


class Clock:
    """Progress lines with the time since the start, so that a run cut short still shows where it was."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.start:7.1f}s] {message}", flush=True)

    def bar(self, what: str):
        """A stand-in for the progress bar engine_step's functions tick."""
        ticks = [0]

        def update(n: int = 1) -> None:
            ticks[0] += n
            self(f"{what}: block {ticks[0]}")
        return SimpleNamespace(update=update)


# ---- the model, the tokenizer, the hardware ---------------------------------------------------

def build_model(shape: str, device: torch.device, dtype: torch.dtype):
    """Random weights straight on the device in dtype (an 8B init on the CPU would take minutes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SHAPES[shape], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    if path:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    from engine.registry import load_registry  # the embedded model's GGUF, as tests/conftest.py
    where, gguf = load_registry().get("smollm2-135m-instruct").locate()
    return AutoTokenizer.from_pretrained(where, gguf_file=gguf, local_files_only=True)


def hardware(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cpu_count": os.cpu_count()}
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "cpu")
    info["cpu"] = cpu
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}")
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, IndexError):
            info["driver"] = None
    else:
        info.update(name=cpu, threads=torch.get_num_threads())
    return info


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# ---- driving the engine -----------------------------------------------------------------------

class Driver:
    """An engine stepped from this thread (never started), as the tests drive it: check_integrity()
    after every step; the most rows that decoded together is kept."""

    def __init__(self, ctx, **kwargs):
        from engine.constraint_hook import ConstraintMasker
        from engine.engine import Engine

        hooks = [ConstraintMasker(ctx.model_vocab, 8)]  # as the server has it: masks on the device
        self.engine = Engine(ctx.model, ctx.tokenizer, ctx.device, ctx.eos_token_ids, ctx.context_length,
                             logits_hooks=hooks, **kwargs)
        self.events: dict[int, list] = {}
        self.most_rows = 0

    def submit(self, prompt: list[int], max_tokens: int, constraint=None):
        from engine.sampling import SamplingParams
        from engine.sequence import Request

        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        request = Request(prompt_ids=list(prompt), params=params, constraint=constraint)
        self.events[request.request_id] = []
        request.emit = self.events[request.request_id].append
        self.engine.submit(request)
        return request

    def run(self) -> None:
        self.engine._drain_inbox()
        while self.engine._running or self.engine._waiting:
            self.engine.step()
            self.engine.check_integrity()
            self.most_rows = max(self.most_rows, len(self.engine.scheduler.rows))

    def tokens(self, request) -> list[int]:
        return [t for e in self.events[request.request_id] for t in e.token_ids]

    def last(self, request):
        return self.events[request.request_id][-1]


def alone(ctx, prompt: list[int], n: int, **kwargs) -> list[int]:
    driver = Driver(ctx, **kwargs)
    request = driver.submit(prompt, n)
    driver.run()
    return driver.tokens(request)


class AllowOnly:
    """A constraint (engine/constraint.py) that allows `tokens` at every step: it fills the packed
    bitmask row that ConstraintMasker copies to the logits' device and applies there (its
    sparse_mask is None)."""

    budget_forced = False

    def __init__(self, tokens: list[int]):
        self.tokens = sorted(tokens)
        self._row: torch.Tensor | None = None  # int32 [W], made at the first fill

    def ready(self) -> bool:
        return True

    def sparse_mask(self, budget=None) -> None:
        return None

    def rollback(self, n: int) -> None:
        pass

    def fill(self, row: torch.Tensor, budget=None) -> None:  # row: int32 [W], bit j of word w = token 32w + j
        if self._row is None:
            import numpy as np
            words = np.zeros(row.shape[0], dtype=np.uint32)
            for t in self.tokens:
                words[t >> 5] |= np.uint32(1 << (t & 31))
            self._row = torch.from_numpy(words.view(np.int32))
        row.copy_(self._row)

    def advance(self, token: int) -> None:
        if token not in self.tokens:
            raise ValueError(f"token {token} is outside the allowed {self.tokens}")

    def forced(self) -> list[int]:
        return []

    def finished(self) -> bool:
        return False

    def closed(self) -> bool:
        return False

    def is_terminated(self) -> bool:
        return False

    def min_tokens(self) -> int:
        return 0

    def free_text(self) -> bool:
        return False


def prompts(lengths, limit: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, limit, (n,), generator=g).tolist() for n in lengths]


@torch.inference_mode()
def next_logits(ctx, ids: list[int]) -> torch.Tensor:
    """Plain transformers' logits [V] (float32) after ids: the whole sequence, no cache."""
    out = ctx.model(torch.tensor([ids], device=ctx.device), use_cache=False, logits_to_keep=1)
    return out.logits[0, -1].float()


def reference(ctx, prompt: list[int], n: int, allowed: list[int] | None = None) -> list[int]:
    """Greedy tokens of plain transformers (argmax over `allowed` only, if given)."""
    ids = list(prompt)
    for _ in range(n):
        logits = next_logits(ctx, ids)
        if allowed is not None:
            index = torch.tensor(allowed, device=logits.device)
            ids.append(allowed[int(logits.index_select(0, index).argmax())])
        else:
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


# ---- comparing token lists --------------------------------------------------------------------

def compare(ctx, name: str, got: list[list[int]], want: list[list[int]], prompts_: list[list[int]],
            first_exact: bool = False, allowed: list[int] | None = None) -> dict:
    """got[i] vs want[i], both continuations of prompts_[i]. Exact mode: every token equal. Else
    equal up to where they first part, which must be a near tie of plain transformers' logits there
    (over `allowed` where given); first_exact: the first tokens must be equal even then."""
    divergences, ok = [], True
    same_first = same_all = total_first = total_all = 0
    for row, (g, w, p) in enumerate(zip(got, want, prompts_)):
        total_first += min(FIRST, len(w))
        total_all += len(w)
        same_first += sum(a == b for a, b in zip(g[:FIRST], w[:FIRST]))
        same_all += sum(a == b for a, b in zip(g, w))
        if g == w:
            continue
        at = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        record = {"row": row, "prompt_tokens": len(p), "at": at, "got": g[at] if at < len(g) else None,
                  "want": w[at] if at < len(w) else None}
        if ctx.exact or record["got"] is None or record["want"] is None:
            record["verdict"] = "differs"
        else:
            logits = next_logits(ctx, p + w[:at])  # [V]
            spread = logits.std()  # of the whole vocabulary, masked or not
            if allowed is not None:
                logits = torch.full_like(logits, float("-inf")).index_copy_(
                    0, torch.tensor(allowed, device=logits.device), logits[allowed])
            top = logits.max()
            record["gap_got"] = float(top - logits[record["got"]])  # 0: the reference's own choice
            record["gap_want"] = float(top - logits[record["want"]])
            record["tolerance"] = float(TIE * spread)
            near = max(record["gap_got"], record["gap_want"]) <= record["tolerance"]
            record["verdict"] = "near tie" if near and not (first_exact and at == 0) else "differs"
        ok &= record["verdict"] == "near tie"
        divergences.append(record)
    return {"check": name, "ok": ok, "rows": len(want), f"agree_first_{FIRST}": same_first / max(1, total_first),
            "agree_all": same_all / max(1, total_all), "divergences": divergences}


def expect(name: str, condition: bool, detail: str) -> dict:
    return {"check": name, "ok": bool(condition), "detail": detail}


# ---- the equivalence checks -------------------------------------------------------------------

def check_batched(ctx, sizes: Sizes, say) -> list[dict]:
    ps = prompts(sizes.lengths, ctx.prompt_vocab, seed=0)
    n = sizes.new
    say(f"batched vs alone: {len(ps)} prompts of {list(sizes.lengths)} tokens, {n} new each")
    expected = [reference(ctx, p, n) for p in ps]
    say("  plain transformers done")
    singles = [alone(ctx, p, n, prefill_chunk=sizes.chunk) for p in ps]
    say("  each alone done")
    driver = Driver(ctx, prefill_chunk=sizes.chunk)
    requests = [driver.submit(p, n) for p in ps]
    driver.run()
    batched = [driver.tokens(r) for r in requests]
    say(f"  batched done (at most {driver.most_rows} rows decoded together)")
    return [expect("eight rows decode together", driver.most_rows == len(ps), f"most rows {driver.most_rows}"),
            compare(ctx, "batched == alone", batched, singles, ps, first_exact=True),
            compare(ctx, "alone == plain transformers", singles, expected, ps)]


def check_prefix(ctx, sizes: Sizes, say) -> list[dict]:
    """As tests/engine/test_model_families.py: a sibling sharing a long prefix, and the next turn of a
    conversation (whose KV was cut out of a slot while a longer row ran beside it)."""
    n = sizes.new
    shared, first_tail, sibling_tail, turn_tail, long = prompts(sizes.prefix, ctx.prompt_vocab, seed=1)
    say(f"prefix cache: a {len(shared)}-token shared prefix, and a next turn")
    first = shared + first_tail
    driver = Driver(ctx, prefix_cache_bytes=4 << 30, prefill_chunk=sizes.chunk)
    earlier = driver.submit(first, n)
    driver.submit(long, n)
    driver.run()
    sibling, turn = shared + sibling_tail, first + driver.tokens(earlier) + turn_tail
    hits = [driver.submit(sibling, n), driver.submit(turn, n)]
    driver.run()
    cached = [driver.last(r).cached_tokens for r in hits]
    misses = [alone(ctx, p, n, prefill_chunk=sizes.chunk) for p in (sibling, turn)]
    say(f"  cached tokens {cached}")
    return [expect("prefix cache hits", cached[0] >= len(shared) and cached[1] >= len(first) + n - 1,
                   f"cached {cached}; at least {len(shared)} and {len(first) + n - 1}"),
            compare(ctx, "prefix hit == miss", [driver.tokens(r) for r in hits], misses, [sibling, turn])]


def check_forced(ctx, sizes: Sizes, say) -> list[dict]:
    """A run forced right after the first sampled token enters the KV in one pass while two rows
    decode beside it; what follows must be what the same tokens fed as prompt give."""
    from engine_fixtures import ForcesRun

    n = sizes.new
    ps = prompts(sizes.forced, ctx.prompt_vocab, seed=2)
    forced_run = prompts((sizes.run,), ctx.prompt_vocab, seed=3)[0]
    say(f"forced run of {len(forced_run)} tokens beside two free rows")
    driver = Driver(ctx, prefill_chunk=sizes.chunk)
    forced = driver.submit(ps[0], n + len(forced_run), constraint=ForcesRun(forced_run))
    free = [driver.submit(p, n) for p in ps[1:]]
    driver.run()
    tokens = driver.tokens(forced)
    head = tokens[:1 + len(forced_run)]
    fed, rest = ps[0] + head, tokens[1 + len(forced_run):]
    return [expect("the forced run is emitted", tokens[1:1 + len(forced_run)] == forced_run,
                   f"{tokens[1:1 + len(forced_run)]} vs {forced_run}"),
            compare(ctx, "forced first token == alone", [tokens[:1]], [alone(ctx, ps[0], 1, prefill_chunk=sizes.chunk)],
                    [ps[0]], first_exact=True),
            compare(ctx, "after a forced run == fed", [rest], [alone(ctx, fed, n - 1, prefill_chunk=sizes.chunk)], [fed]),
            compare(ctx, "rows beside a forced run == alone", [driver.tokens(r) for r in free],
                    [alone(ctx, p, n, prefill_chunk=sizes.chunk) for p in ps[1:]], ps[1:], first_exact=True)]


def check_masks(ctx, sizes: Sizes, say) -> list[dict]:
    """Two rows under a constraint allowing five tokens (ids in several words of the bitmask, one
    its sign bit), a free row beside them; the masks are applied to the logits on their device."""
    n = sizes.new
    allowed = sorted({31, 63, 1000, ctx.prompt_vocab // 2 + 7, ctx.prompt_vocab - 1})
    ps = prompts((40, 90, 20), ctx.prompt_vocab, seed=4)
    say(f"masks on {ctx.device}: {allowed} allowed")
    driver = Driver(ctx, prefill_chunk=sizes.chunk)
    masked = [driver.submit(p, n, constraint=AllowOnly(allowed)) for p in ps[:2]]
    free = driver.submit(ps[2], n)
    driver.run()
    outputs = [driver.tokens(r) for r in masked]
    outside = sorted({t for out in outputs for t in out} - set(allowed))
    errors = [driver.last(r).error for r in masked if driver.last(r).error]
    return [expect("masked rows stay inside", not outside and not errors and all(len(o) == n for o in outputs),
                   f"outside: {outside}; errors: {errors}"),
            compare(ctx, "masked == plain transformers over the allowed", outputs,
                    [reference(ctx, p, n, allowed) for p in ps[:2]], ps[:2], allowed=allowed),
            compare(ctx, "free row beside masked ones == alone", [driver.tokens(free)],
                    [alone(ctx, ps[2], n, prefill_chunk=sizes.chunk)], ps[2:], first_exact=True)]


# ---- benchmarks -------------------------------------------------------------------------------

def decode_rate(loaded, rows: int, prompt_tokens: int, steps: int) -> dict:
    """Decode tokens/s of `rows` rows once all decode together (after their prefill)."""
    from server.bench.engine_rows import Stepper, bench_engine, random_prompts

    engine = bench_engine(loaded, prefix_cache_bytes=0)
    stepper = Stepper(engine)
    requests = [stepper.submit(p, max_tokens=steps + 16)
                for p in random_prompts(loaded.vocab_size, [prompt_tokens] * rows, seed=rows)]
    while not stepper.decoding(rows):
        stepper.step()
    times = [stepper.step() for _ in range(steps)]
    for request in requests:
        engine.cancel(request.request_id)
    while stepper.busy():
        stepper.step()
    engine.shutdown()
    return {"rows": rows, "prompt": prompt_tokens, "steps": steps, "step_ms": 1000 * statistics.median(times),
            "tokens_per_s": rows * len(times) / sum(times), "tokens_per_s_median": rows / statistics.median(times)}


# ---- the run ----------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="llama3-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                        help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the embedded SmolLM2)")
    parser.add_argument("--save-tokenizer", default=None, metavar="DIR",
                        help="save the embedded tokenizer to DIR (for a box without the GGUF) and exit")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--skip-bench", action="store_true", help="the equivalence checks only")
    args = parser.parse_args()

    if args.save_tokenizer:
        load_tokenizer(None).save_pretrained(args.save_tokenizer)
        print(f"saved the tokenizer to {args.save_tokenizer}")
        return 0

    say = Clock()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if device.type == "cpu" and args.shape == "tiny":
        torch.set_num_threads(1)  # tiny matrices: a second intra-op thread only adds overhead
    info = hardware(device)
    say(f"{args.shape} on {info['name']} ({device}, {dtype}); torch {info['torch']}, cuda {info.get('cuda')}, "
        f"driver {info.get('driver')}")
    tokenizer = load_tokenizer(args.tokenizer)
    model = build_model(args.shape, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    say(f"model built: {params / 1e9:.2f}B parameters")
    sizes = SIZES[args.shape]
    model_vocab = model.config.vocab_size
    ctx = SimpleNamespace(  # also the `loaded` that server/bench/engine_step.py's functions read
        model=model, tokenizer=tokenizer, device=device, eos_token_ids=frozenset({tokenizer.eos_token_id}),
        context_length=model.config.max_position_embeddings, model_vocab=model_vocab,
        prompt_vocab=min(model_vocab, len(tokenizer)), vocab_size=min(model_vocab, len(tokenizer)),
        exact=device.type == "cpu" and dtype == torch.float32)

    name = re.sub(r"[^A-Za-z0-9]+", "-", info["name"]).strip("-")
    out = Path(args.out) / f"cuda_check-{name}{'' if args.shape == 'llama3-8b' else '-' + args.shape}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"shape": args.shape, "config": {k: v for k, v in SHAPES[args.shape].items()}, "parameters": params,
              "dtype": str(dtype).removeprefix("torch."), "device": str(device), "hardware": info,
              "sizes": asdict(sizes), "exact": ctx.exact, "tie": TIE, "equivalence": [], "bench": {},
              "seconds": {}, "errors": {}, "complete": False}

    def save() -> None:
        if device.type == "cuda":
            result["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        result["elapsed_s"] = round(time.perf_counter() - say.start, 1)
        out.write_text(json.dumps(result, indent=1, default=str))

    def section(key: str, fn):
        """Runs one section; a crash is recorded (and fails the run) and the next section still runs."""
        started = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # an OOM or a transformers difference on this box: keep the other numbers
            traceback.print_exc()
            result["errors"][key] = f"{type(exc).__name__}: {exc}"
            say(f"  FAIL {key} raised {type(exc).__name__}: {exc}")
            value = None
        result["seconds"][key] = round(time.perf_counter() - started, 1)
        save()
        return value

    for key, check in (("batched", check_batched), ("prefix", check_prefix), ("forced", check_forced),
                       ("masks", check_masks)):
        records = section(key, lambda: check(ctx, sizes, say)) or []
        result["equivalence"] += records
        save()
        for r in records:
            say(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['check']}: " + (
                r.get("detail") or f"agree first {FIRST} {r[f'agree_first_{FIRST}']:.0%}, all {r['agree_all']:.0%}"))
            for d in r.get("divergences", []):
                say(f"       row {d['row']} ({d['prompt_tokens']} prompt tokens) parts at token {d['at']}: "
                    f"{d['got']} vs {d['want']}, gaps to the top logit {d.get('gap_got', '-')} / "
                    f"{d.get('gap_want', '-')} (tolerance {d.get('tolerance', 0):.3g}): {d['verdict']}")

    if not args.skip_bench:
        run_bench(ctx, sizes, section, result["bench"], say)

    result["complete"] = True
    result["failed"] = [r["check"] for r in result["equivalence"] if not r["ok"]] + list(result["errors"])
    save()
    print_table(result)
    say(f"wrote {out}")
    if result["failed"]:
        say(f"FAILED: {result['failed']}")
    return 1 if result["failed"] else 0


def bandwidth_gbs(device: torch.device) -> float:
    """The device's memory bandwidth as a large copy sees it (read + write), GB/s."""
    data = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    copy = torch.empty_like(data)
    copy.copy_(data)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(10):
        copy.copy_(data)
    sync()
    return 2 * 10 * data.numel() / (time.perf_counter() - started) / 1e9


def compiled_step(ctx, sizes: Sizes, say) -> dict:
    """The compiled decode step (engine/step_compiler.py): its greedy tokens against the eager
    step's on four prompts (equal, or parting at a near tie as `compare` judges), decode tokens/s
    at batch 1 and 32 against the bandwidth ceiling (weights read once a step), the prefill rate of
    one long prompt, and the masks applied to 64 rows."""
    from server.bench.engine_rows import Stepper, bench_engine, random_prompts

    ps = prompts([sizes.lengths[0], sizes.lengths[-1], 17, 33], ctx.prompt_vocab, seed=9)
    eager = [alone(ctx, p, sizes.new) for p in ps]
    driver = Driver(ctx, compile_step=True)
    say(f"  compiled in {driver.engine.step_compiler.seconds or float('nan'):.1f}s "
        f"({driver.engine.step_compiler.error or 'ok'})")
    requests = [driver.submit(p, sizes.new) for p in ps]
    driver.run()
    record = compare(ctx, "compiled step == eager step", [driver.tokens(r) for r in requests], eager, ps)
    weights = sum(p.numel() * p.element_size() for p in ctx.model.parameters())
    ceiling = bandwidth_gbs(ctx.device) * 1e9 / weights  # steps/s if a step read each weight once
    out = {"equality": record, "weight_bytes": weights, "ceiling_steps_per_s": ceiling, "rates": []}
    for rows in (1, 32):
        engine = bench_engine(ctx, prefix_cache_bytes=0, max_batch=rows, compile_step=True)
        stepper = Stepper(engine)
        reqs = [stepper.submit(p, max_tokens=sizes.rate_steps + 16)
                for p in random_prompts(ctx.vocab_size, [sizes.rate_prompt] * rows, seed=rows)]
        while not stepper.decoding(rows):
            stepper.step()
        times = [stepper.step() for _ in range(sizes.rate_steps)]
        for r in reqs:
            engine.cancel(r.request_id)
        while stepper.busy():
            stepper.step()
        engine.shutdown()
        step = statistics.median(times)
        out["rates"].append({"rows": rows, "tokens_per_s": rows / step, "of_ceiling": 1 / step / ceiling})
        say(f"  batch {rows}: {rows / step:.1f} tokens/s, {1 / step / ceiling:.0%} of the bandwidth ceiling")
    engine = bench_engine(ctx, prefix_cache_bytes=0, prefill_chunk=sizes.long)
    stepper = Stepper(engine)
    started = time.perf_counter()
    stepper.submit(random_prompts(ctx.vocab_size, [sizes.long], seed=5)[0], max_tokens=1)
    while stepper.busy():
        stepper.step()
    out["prefill_tokens_per_s"] = sizes.long / (time.perf_counter() - started)
    engine.shutdown()
    logits = torch.randn(64, ctx.model_vocab, device=ctx.device)
    words = torch.randint(-2**31, 2**31 - 1, (64, (ctx.model_vocab + 31) // 32), dtype=torch.int32, device=ctx.device)
    shifts = torch.arange(32, device=ctx.device, dtype=torch.int32)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    for _ in range(20):
        allowed = ((words[:, :, None] >> shifts) & 1).bool().view(64, -1)[:, :ctx.model_vocab]
        logits.masked_fill_(~allowed, float("-inf"))
    sync()
    out["mask_apply_64_rows_us"] = (time.perf_counter() - started) / 20 * 1e6
    say(f"  prefill {out['prefill_tokens_per_s']:.0f} tokens/s; masks applied to 64 rows in "
        f"{out['mask_apply_64_rows_us']:.0f} us")
    return out


def run_bench(ctx, sizes: Sizes, section, bench: dict, say) -> None:
    """server/bench/engine_step.py's measures over this model; each result is in `bench` once done."""
    from server.bench.engine_rows import prefill_interference, soak
    from server.bench.engine_step import step_times

    say("the compiled decode step: equality with eager, batch 1 and 32 against the bandwidth ceiling")
    compiled = section("compiled", lambda: compiled_step(ctx, sizes, say))
    if compiled:
        bench["compiled"] = compiled

    for c in sizes.contexts:
        say(f"decode step, 8 rows at {c} tokens: maskd vs bare StaticCache forward")
        row = section(f"step_{c}", lambda: step_times(ctx, c, sizes.steps, sizes.blocks, say.bar(f"step {c}")))
        if row:
            bench.setdefault("step", []).append(row)
            say(f"  maskd {row['maskd_ms']:.2f} ms, bare {row['bare_ms']:.2f} ms, ratio {row['ratio']:.2f}")
    for rows in (1, 8):
        say(f"decode tokens/s at batch {rows}")
        rate = section(f"rate_{rows}", lambda: decode_rate(ctx, rows, sizes.rate_prompt, sizes.rate_steps))
        if rate:
            bench.setdefault("rate", []).append(rate)
            say(f"  {rate['tokens_per_s']:.1f} tokens/s ({rate['step_ms']:.2f} ms a step)")
    say(f"a {sizes.long}-token prompt arriving while 7 rows decode")
    p = section("prefill", lambda: prefill_interference(ctx, sizes.short, sizes.long, sizes.long_chunk, 2))
    if p:
        bench["prefill"] = p
        say(f"  TBT p99 {p['tbt_during_p99_ms']:.1f} ms (bound {p['tbt_bound_ms']:.1f}), "
            f"TTFT ratio {p['ttft_ratio']:.2f}")
    context = ctx.context_length
    lengths = [min(context - 1, max(1, round(f * context))) for f in SOAK]
    budget = context - context // 64  # below the longest prompt (refused), far below the sum
    say(f"soak: {len(lengths)} prompts, {sum(lengths)} tokens, KV budget {budget} tokens")
    s = section("soak", lambda: soak(ctx, lengths, budget, sizes.soak_new))
    if s:
        bench["soak"] = s
        say(f"  finished {s['finished']}/{s['submitted']}, refused {s['refused']}, "
            f"peak {s['peak_bytes'] / 2**20:.1f} MiB of {s['budget_bytes'] / 2**20:.1f} MiB")


def print_table(result: dict) -> None:
    hw = result["hardware"]
    print(f"\n{result['shape']} ({result['parameters'] / 1e9:.2f}B, {result['dtype']}) on {hw['name']}"
          f" - torch {hw['torch']}, CUDA {hw.get('cuda')}, driver {hw.get('driver')}")
    print(f"\n{'equivalence check':<48} {'verdict':<8} {'agree first ' + str(FIRST):>14} {'agree all':>10}")
    for r in result["equivalence"]:
        first, every = r.get(f"agree_first_{FIRST}"), r.get("agree_all")
        print(f"{r['check']:<48} {'ok' if r['ok'] else 'FAIL':<8} "
              f"{'' if first is None else f'{first:.0%}':>14} {'' if every is None else f'{every:.0%}':>10}")
    bench = result["bench"]
    if not bench:
        return
    print(f"\n{'benchmark':<60} {'value':>14} {'target':>10}")
    lines = []
    for row in bench.get("step", []):
        lines.append((f"decode step, 8 rows at {row['context']} tokens: maskd / bare ms",
                      f"{row['maskd_ms']:.2f}/{row['bare_ms']:.2f}", ""))
        lines.append((f"  ratio", f"{row['ratio']:.2f}", "<= 1.10"))
    for row in bench.get("rate", []):
        lines.append((f"decode tokens/s at batch {row['rows']} ({row['prompt']}-token prompts)",
                      f"{row['tokens_per_s']:.1f}", ""))
    if "prefill" in bench:
        p = bench["prefill"]
        lines += [(f"{p['long']}-token prompt beside 7 rows: TBT p50 before / during ms",
                   f"{p['tbt_before_p50_ms']:.1f}/{p['tbt_during_p50_ms']:.1f}", ""),
                  ("  TBT during p99 ms (bound: one chunk + step p99)", f"{p['tbt_during_p99_ms']:.1f}",
                   f"<= {p['tbt_bound_ms']:.1f}"),
                  ("  rows' extra wait per step / same chunk alone, max", f"{p['delay_over_chunk_max']:.2f}",
                   "<= 1.00"),
                  ("  TTFT beside / alone", f"{p['ttft_ratio']:.2f}", "<= 1.20")]
    if "soak" in bench:
        s = bench["soak"]
        lines += [("soak: finished / submitted, refused", f"{s['finished']}/{s['submitted']}, {s['refused']}", ""),
                  ("  peak KV MiB / budget MiB", f"{s['peak_bytes'] / 2**20:.1f}/{s['budget_bytes'] / 2**20:.1f}", "")]
    for what, value, target in lines:
        print(f"{what:<60} {value:>14} {target:>10}")


if __name__ == "__main__":
    sys.exit(main())

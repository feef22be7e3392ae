"""Naturalness of constrained tokens: the share that differ from the tokenizer's own encoding of the text.

    python benchmarks/naturalness_bench.py [--stride 17] [--limit N] [--no-forced-text] [--model NAME]
                                           [--out benchmarks/results/naturalness_bench.json]

A grammar mask may steer the model into spelling text with tokens its tokenizer would not choose
(a mask that forbids `}}` forces `}` `}`). Per constrained output, through maskd's in-process chat
path (greedy, max_tokens 96, the embedded model or --model, forced runs split as `maskd serve` splits them):
take the generated ids of the constrained span, join their bytes (TokenVocabulary.token_bytes:
exact bytes per token, where decoding one token at a time would mangle split UTF-8), re-encode that
text with ``tokenizer.encode(text, add_special_tokens=False)`` and compare boundaries: a generated
token *differs* when its (start, end) byte span is not the span of a token of the re-encoding. An
output cut by max_tokens counts as generated. Tasks:
  tools       every --stride-th BFCL schema as tools, tool_choice "required". The span is the call
              block: the tokens that start at or after the end of the first `<tool_call>` text in the
              output (a token straddling it is left out) up to, not including, EOS.
  json_object 15 prompts for JSON objects, response_format json_object: the whole output, less EOS.
  free_form   15 json_schema requests whose schemas have free-form parts ({} items, open objects).
Tokens with no bytes (special tokens) are not counted. Where the re-encoding does not spell the
same bytes (it never should) the output is counted as "unmatched" and left out. Prints a table, writes
the JSON (with each output's ids and the differing regions) and a PNG bar chart beside it. Runs with
any maskd version on PYTHONPATH: chat.start where it exists, else engine.generate.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
from pathlib import Path

from tool_bench import DATA, RESULTS, functions_of

from engine.constraint_hook import ConstraintMasker
from engine.engine import Engine
from engine.model_loader import load_model
from engine.registry import load_registry
from grammars import GrammarCompiler, TokenVocabulary
from server import chat
from server.errors import APIError
from server.protocol import ChatCompletionRequest
from server.state import ServerState

TASKS = ("tools", "json_object", "free_form")
SUBJECTS = ("a cat", "a city", "a laptop", "a recipe for pancakes", "a football team", "a book", "a planet",
            "a job applicant", "a weather report", "a car", "a movie", "a hotel booking", "a bank account",
            "a music album", "a hiking trail")
OPEN_OBJECT = {"type": "object", "additionalProperties": True}
FREE_SCHEMAS = (
    {"type": "object", "properties": {"query": {"type": "string"}, "metadata": OPEN_OBJECT,
                                      "tags": {"type": "array", "items": {}}}, "required": ["query", "metadata", "tags"]},
    {"type": "object", "properties": {"name": {"type": "string"}, "details": {}},
     "required": ["name", "details"]},
    {"type": "object", "properties": {"title": {"type": "string"}, "attributes": OPEN_OBJECT,
                                      "related": {"type": "array", "items": OPEN_OBJECT}},
     "required": ["title", "attributes", "related"]},
)


def load_state(cache_dir: str, timeout: float, forced_text: bool = True, model: str | None = None) -> ServerState:
    """As `maskd serve`: disk grammar cache, one compile worker (the machine is shared), forced text
    fed in the tokenizer's split (unless ``forced_text`` is False, or the code predates it)."""
    loaded = load_model(load_registry().get(model))
    vocabulary = TokenVocabulary.from_tokenizer(loaded.tokenizer, loaded.vocab_size,
                                                extra_eos_token_ids=tuple(loaded.eos_token_ids))
    engine = Engine(loaded.model, loaded.tokenizer, loaded.device, loaded.eos_token_ids, loaded.context_length,
                    logits_hooks=[ConstraintMasker(loaded.vocab_size, 8)], prefix_cache_bytes=512 << 20)
    if forced_text:
        try:
            from grammars.masks.forced_text import ForcedText
            engine.forced_text = ForcedText(vocabulary, loaded.tokenizer)
        except ImportError:  # older code: forced singletons only
            pass
    engine.start()
    compiler = GrammarCompiler(vocabulary, cache_dir=cache_dir, timeout_s=timeout, workers=1)
    if hasattr(compiler, "set_engine_idle"):
        compiler.set_engine_idle(lambda: engine.idle)  # as in `maskd serve`: warm-ups wait while it decodes
    if hasattr(compiler, "json_automaton"):
        compiler.json_automaton()  # as `maskd serve` does at startup (new code)
    return ServerState(loaded.name, loaded.tokenizer, loaded.context_length, loaded.spec.tool_format, engine,
                       compiler, vocabulary)


def requests(state: ServerState, stride: int, limit: int | None) -> list[tuple[str, str, ChatCompletionRequest]]:
    common = dict(model=state.model_name, max_tokens=96, temperature=0.0, seed=0)
    out = []
    for i, line in list(enumerate(gzip.open(DATA, "rt")))[::stride][:limit]:
        functions = functions_of(json.loads(line)["schema"])
        out.append(("tools", f"bfcl:{i}", ChatCompletionRequest(
            **common, messages=[{"role": "user", "content": f"Call {next(iter(functions))} with sensible arguments."}],
            tools=[{"type": "function", "function": {"name": n, "parameters": p}} for n, p in functions.items()],
            tool_choice="required", parallel_tool_calls=False)))
    for subject in SUBJECTS[:limit]:
        out.append(("json_object", subject, ChatCompletionRequest(
            **common, messages=[{"role": "user", "content": f"Describe {subject} as a JSON object with nested fields."}],
            response_format={"type": "json_object"})))
    for k, subject in enumerate(SUBJECTS[:limit]):
        schema = FREE_SCHEMAS[k % len(FREE_SCHEMAS)]
        keys = ", ".join(schema["properties"])
        out.append(("free_form", subject, ChatCompletionRequest(
            **common, messages=[{"role": "user", "content": f"Describe {subject} as JSON with the keys {keys}."}],
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})))
    return out


async def generate(state: ServerState, body: ChatCompletionRequest) -> tuple[list[int], str]:
    prepared = await chat.prepare(state, body)
    events = await chat.start(state, prepared) if hasattr(chat, "start") else state.engine.generate(prepared.request)
    ids, finish = [], None
    async for event in events:
        if event.error:
            raise RuntimeError(event.error)
        ids += event.token_ids
        finish = event.finish_reason or finish
    return ids, finish


def spans(pieces: list[bytes]) -> list[tuple[int, int]]:
    ends = list(itertools.accumulate(map(len, pieces)))
    return [(end - len(p), end) for p, end in zip(pieces, ends)]


def compare(state: ServerState, task: str, ids: list[int]) -> dict:
    """Spans of the constrained tokens vs those of the re-encoding (see the module docstring)."""
    eos = state.vocabulary.eos_token_ids
    while ids and ids[-1] in eos:
        ids = ids[:-1]
    pieces = [state.vocabulary.token_bytes.get(t, b"") for t in ids]
    if task == "tools":
        whole = b"".join(pieces)
        opened = whole.find(b"<tool_call>")
        if opened < 0:
            return {"status": "no_open"}
        inside = [start >= opened + len(b"<tool_call>") for start, _ in spans(pieces)]
        ids, pieces = [t for t, i in zip(ids, inside) if i], [p for p, i in zip(pieces, inside) if i]
    kept = [(t, p) for t, p in zip(ids, pieces) if p]
    text = b"".join(p for _, p in kept)
    again = state.tokenizer.encode(text.decode("utf-8", errors="replace"), add_special_tokens=False)
    again_pieces = [state.vocabulary.token_bytes.get(t, b"") for t in again]
    if b"".join(again_pieces) != text:
        return {"status": "unmatched", "text": text.decode("utf-8", errors="replace")}
    mine, theirs = spans([p for _, p in kept]), spans(again_pieces)
    differing = len(set(mine) - set(theirs))  # spans are distinct: each token ends further on
    common = sorted({0} | ({e for _, e in mine} & {e for _, e in theirs}))
    regions = []  # between consecutive shared boundaries: what was generated vs what the tokenizer writes
    for lo, hi in zip(common, common[1:]):
        gen = [text[s:e].decode("utf-8", "replace") for s, e in mine if lo <= s < hi]
        tok = [text[s:e].decode("utf-8", "replace") for s, e in theirs if lo <= s < hi]
        if gen != tok:
            regions.append([gen, tok])
    return {"status": "ok", "tokens": len(kept), "differing": differing, "text": text.decode("utf-8", "replace"),
            "ids": [t for t, _ in kept], "reencoded": again, "regions": regions}


async def bench(state: ServerState, todo, concurrency: int) -> list[dict]:
    gate = asyncio.Semaphore(concurrency)

    async def one(task: str, key: str, body: ChatCompletionRequest) -> dict:
        async with gate:
            try:
                ids, finish = await generate(state, body)
            except APIError as exc:
                return {"task": task, "key": key, "status": "refused", "message": exc.message[:200]}
        record = {"task": task, "key": key, "finish": finish, **compare(state, task, ids)}
        print(f"{task:12} {key[:28]:28} {record['status']:9} {finish}"
              f" {record.get('differing', '-')}/{record.get('tokens', '-')}", flush=True)
        return record

    return await asyncio.gather(*(one(*item) for item in todo))


def summarize(records: list[dict]) -> list[dict]:
    table = []
    for task in TASKS:
        rs = [r for r in records if r["task"] == task]
        ok = [r for r in rs if r["status"] == "ok"]
        tokens, differing = sum(r["tokens"] for r in ok), sum(r["differing"] for r in ok)
        table.append({"task": task, "outputs": len(ok), "not_compared": len(rs) - len(ok), "tokens": tokens,
                      "differing": differing, "share": differing / tokens if tokens else 0.0,
                      "outputs_with_difference": sum(r["differing"] > 0 for r in ok) / len(ok) if ok else 0.0,
                      "cut_by_max_tokens": sum(r["finish"] == "length" for r in ok)})
    return table


def plot(table: list[dict], path: Path, label: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(table))
    ax.bar([i - 0.2 for i in x], [100 * r["share"] for r in table], 0.4, label="tokens differing")
    ax.bar([i + 0.2 for i in x], [100 * r["outputs_with_difference"] for r in table], 0.4,
           label="outputs with any difference")
    ax.set_xticks(list(x), [f"{r['task']}\n({r['outputs']} outputs)" for r in table])
    ax.set_ylim(0, 119), ax.set_ylabel("%"), ax.set_title(f"constrained tokens vs the tokenizer's encoding ({label})"), ax.legend()
    fig.tight_layout(), fig.savefig(path, dpi=100), plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stride", type=int, default=17, help="every k-th BFCL schema (default 17: 62 schemas)")
    parser.add_argument("--limit", type=int, default=None, help="at most N requests per task")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once (batched)")
    parser.add_argument("--grammar-timeout", type=float, default=60.0, help="compile time limit, s")
    parser.add_argument("--grammar-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "maskd", "grammars"))
    parser.add_argument("--no-forced-text", action="store_true", help="forced runs off (singletons only)")
    parser.add_argument("--model", default=None, help="a models.yaml name (default: the embedded model)")
    parser.add_argument("--out", type=Path, default=RESULTS / "naturalness_bench.json")
    args = parser.parse_args()
    print(f"maskd from {Path(chat.__file__).resolve().parents[1]}", flush=True)
    state = load_state(args.grammar_cache, args.grammar_timeout, forced_text=not args.no_forced_text, model=args.model)
    try:
        records = asyncio.run(bench(state, requests(state, args.stride, args.limit), args.concurrency))
    finally:
        state.engine.shutdown()
        state.compiler.close()
    table = summarize(records)
    print(f"\n{'task':12} {'outputs':>7} {'tokens':>7} {'differing':>9} {'share':>7} {'outputs w/ diff':>15}"
          f" {'cut':>4} {'not compared':>12}")
    for r in table:
        print(f"{r['task']:12} {r['outputs']:7} {r['tokens']:7} {r['differing']:9} {r['share']:7.2%}"
              f" {r['outputs_with_difference']:15.1%} {r['cut_by_max_tokens']:4} {r['not_compared']:12}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    source = str(Path(chat.__file__).resolve().parents[1])
    args.out.write_text(json.dumps({"maskd": source, "stride": args.stride, "forced_text": not args.no_forced_text,
                                    "summary": table, "records": records}, indent=1))
    plot(table, args.out.with_suffix(".png"), source)
    print(f"wrote {args.out} and {args.out.with_suffix('.png').name}")


if __name__ == "__main__":
    main()

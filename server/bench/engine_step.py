"""Suite `engine`: the engine step, all modes in one run.

- forced: BFCL tool calls (tool_choice required) through the live server with forced-text
  extension on and off, interleaved call by call: forward passes per generated token (from
  /metrics), seconds per call, valid calls. Each tool is called once before, so that compiling its
  grammar units is not counted.
- step: 8 rows decoding at a short and a long context (100 and 3,000 prompt tokens): maskd's whole
  engine step (forward, sampling, events) against a bare forward of the same shapes over
  transformers' preallocated StaticCache, in alternating blocks.
- prefill: a long prompt arriving while 7 rows decode: the rows' time between tokens (p50, p99)
  before and during its prefill, one chunk's time (median; the longest is the last, which attends
  over the whole prompt), each step's extra wait over the same chunk alone (the two engines
  stepped in lockstep), and the newcomer's time to first token against prefilling it alone.
- soak: prompts of mixed lengths up to the context limit under a KV budget smaller than their sum:
  requests finished, refused (can never fit), the scheduler's integrity checked after every step,
  and the peak KV bytes against the budget.
"""

from __future__ import annotations

import statistics
import time

from server.bench.engine_rows import Stepper, bench_engine, random_prompts, prefill_interference, soak
from server.bench.stats import fmt


def _bare_steps(loaded, context: int, steps: int):
    """Times of bare decode forwards of 8 rows over a StaticCache holding `context` tokens."""
    import torch
    from transformers import StaticCache

    from engine.model_runner import cache_kwarg

    model, device = loaded.model, loaded.device
    cache = StaticCache(config=model.config, max_cache_len=context + steps + 2)
    kwarg = cache_kwarg(model)
    ids = torch.full((8, 1), 200, dtype=torch.long, device=device)  # [8, 1]
    times = []
    with torch.inference_mode():
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kwarg: cache})  # allocates the layers
        for layer in cache.layers:
            layer.cumulative_length.fill_(context)  # as if `context` tokens were cached: same shapes, same work
        for i in range(steps):
            position = torch.full((8, 1), context + i, dtype=torch.long, device=device)  # [8, 1]
            started = time.perf_counter()
            logits = model(input_ids=ids, position_ids=position, use_cache=True, logits_to_keep=1,
                           **{kwarg: cache}).logits
            logits.argmax(-1).tolist()  # the host sync a step pays for its tokens
            times.append(time.perf_counter() - started)
    return times


def _cached_context(engine, loaded, context: int) -> list[int]:
    """Puts `context` tokens of random KV in the engine's prefix cache and returns their ids: rows
    whose prompts start with them are admitted by one copy into their slot (the prefix-hit path),
    instead of prefilling 8 x `context` tokens, which the timing does not need (KV values do not
    change a step's work)."""
    import torch

    from engine.kv_segment import KVSegment

    shape = engine.scheduler.slots.shape
    prefix = random_prompts(loaded.vocab_size, [context], seed=context)[0]
    data = torch.randn(len(shape.heads), 2, shape.heads[0], context, shape.head_dims[0], dtype=shape.dtype,
                       device=loaded.device)  # [L, 2, H, n, D]
    engine.scheduler.prefix_cache.insert(prefix, KVSegment(data))
    return prefix


def step_times(loaded, context: int, steps: int, blocks: int, progress_bar) -> dict:
    from engine.slot_cache import KVShape

    shape = KVShape.probe(loaded.model, loaded.device)
    room = 8 * (context + steps + 8 + 256) * shape.bytes_per_token  # the 8 rows' KV, whatever memory is free now
    engine = bench_engine(loaded, prefix_cache_bytes=2 * context * shape.bytes_per_token, prefill_chunk=512,
                          kv_cache_bytes=room)
    stepper = Stepper(engine)
    prefix = _cached_context(engine, loaded, context)
    rows = [stepper.submit(prefix + [200 + i], max_tokens=steps + 8) for i in range(8)]
    stepper.until_decoding(8)
    ours, bare = [], []
    per_block = max(1, steps // blocks)
    for _ in range(blocks):  # alternate, so that machine noise hits both alike
        ours += [stepper.step() for _ in range(per_block)]
        bare += _bare_steps(loaded, context, per_block)
        progress_bar.update()
    for request in rows:
        engine.cancel(request.request_id)
    while stepper.busy():
        stepper.step()
    engine.shutdown()
    return {"context": context, "maskd_ms": 1000 * statistics.median(ours), "bare_ms": 1000 * statistics.median(bare),
            "ratio": statistics.median(ours) / statistics.median(bare), "steps": len(ours)}


def forced_calls(ctx, functions: dict[str, dict], max_tokens: int, progress_bar) -> list[dict]:
    import httpx

    from server.bench.live_server import metric
    from server.bench.tools import body, check

    url, spec = ctx.server_url(), ctx.spec()
    records = []
    with httpx.Client(timeout=900) as client:
        for i, (name, params) in enumerate(functions.items()):
            request = body(spec.name, {name: params}, "required", max_tokens, {})
            client.post(f"{url}/v1/chat/completions", json=request)  # compiles the units, caches the prompt
            modes = (True, False) if i % 2 == 0 else (False, True)  # alternate which mode goes first
            for extend in modes:
                passes = metric(url, "maskd_forward_passes_total")
                started = time.perf_counter()
                reply = client.post(f"{url}/v1/chat/completions", json={**request, "forced_extend": extend})
                seconds = time.perf_counter() - started
                passes = metric(url, "maskd_forward_passes_total") - passes
                if reply.status_code != 200:
                    records.append({"tool": name, "extend": extend, "verdict": "refused", "seconds": seconds})
                    continue
                data = reply.json()
                choice = data["choices"][0]
                calls = [(c["function"]["name"], c["function"]["arguments"])
                         for c in choice["message"].get("tool_calls") or []]
                records.append({"tool": name, "extend": extend, "seconds": seconds, "passes": passes,
                                "tokens": data["usage"]["completion_tokens"],
                                "verdict": check(calls, choice["finish_reason"], {name: params})})
            progress_bar.update()
    return records


def run(ctx, progress) -> dict:
    from server.bench.schemas import function_rows, functions_of

    sizes, tiny, quick = ctx.sizes, ctx.tiny, ctx.quick
    contexts = (16, 64) if tiny else (100, 3000)
    steps, blocks = (4, 2) if tiny else ((24, 4) if quick else (64, 8))
    long_prompt, chunk = (96, 32) if tiny else (3000, 512)
    functions: dict[str, dict] = {}
    for row in function_rows(ctx.rows):
        for name, params in functions_of(row["schema"]).items():
            functions.setdefault(name, params)
    functions = dict(list(functions.items())[: 2 if tiny else (12 if quick else 40)])
    context_limit = ctx.stack().loaded.context_length
    soak_lengths = [48, 20, 90, 200, 30, 60, 140] if tiny else [
        min(context_limit - 1, n) for n in (context_limit, 5000, 300, 2500, 100, 1200, 50, 700)]
    soak_budget = 160 if tiny else 6000  # tokens: below the sum of the prompts, above all but the first

    bar = progress("engine", len(contexts) * blocks + 2 + len(functions))
    loaded = ctx.stack().loaded
    try:
        steps_rows = [step_times(loaded, c, steps, blocks, bar) for c in contexts]
        prefill = prefill_interference(loaded, contexts[0], long_prompt, chunk, 1 if tiny else (2 if quick else 3))
        bar.update()
        soaked = soak(loaded, soak_lengths, soak_budget, 4 if tiny else 16)
        bar.update()
        forced = forced_calls(ctx, functions, sizes.tool_tokens, bar)
    finally:
        bar.close()

    by_mode = {}
    for extend in (True, False):
        rs = [r for r in forced if r["extend"] == extend and r["verdict"] != "refused"]
        tokens = sum(r["tokens"] for r in rs)
        by_mode[extend] = {"calls": len(rs), "valid": sum(r["verdict"] == "valid" for r in rs),
                           "passes_per_token": sum(r["passes"] for r in rs) / tokens if tokens else None,
                           "seconds": statistics.median([r["seconds"] for r in rs]) if rs else None}
    on, off = by_mode[True], by_mode[False]
    ratios = {"forward passes per generated token (extend on)": on["passes_per_token"],
              "seconds per call, extend on / off": on["seconds"] / off["seconds"] if on["seconds"] and off["seconds"]
              else None}
    for row in steps_rows:
        ratios[f"decode step, maskd / bare StaticCache forward, 8 rows at {row['context']} tokens"] = row["ratio"]
    ratios["time to first token of the long prompt, beside 7 decoding rows / alone"] = prefill["ttft_ratio"]
    ratios["decoding rows' extra wait per step / that chunk's time alone, max"] = prefill["delay_over_chunk_max"]
    tables = [
        {"title": "Forced text in one pass: BFCL tool calls, tool_choice required, live server",
         "columns": ["forced extend", "calls", "valid", "passes / generated token", "median s / call"],
         "rows": [[("on" if e else "off"), str(m["calls"]), str(m["valid"]), fmt(m["passes_per_token"], ".2f"),
                   fmt(m["seconds"], ".3f")] for e, m in by_mode.items()]},
        {"title": "Decode step of 8 rows: maskd engine vs a bare forward over a StaticCache (medians)",
         "columns": ["context tokens", "maskd ms", "bare ms", "maskd / bare", "steps"],
         "rows": [[str(r["context"]), fmt(r["maskd_ms"]), fmt(r["bare_ms"]), fmt(r["ratio"], ".2f"), str(r["steps"])]
                  for r in steps_rows]},
        {"title": f"A {prefill['long']}-token prompt arriving while 7 rows decode (chunk {prefill['chunk']}, "
                  f"medians of {prefill['rounds']} rounds, stepped in lockstep with the prompt alone)",
         "columns": ["TBT before p50 ms", "TBT during p50 ms", "TBT during p99 ms", "one chunk ms",
                     "bound: longest chunk + step p99 ms", "rows' delay / same chunk alone, p50", "max",
                     "TTFT s", "TTFT alone s", "ratio"],
         "rows": [[fmt(prefill["tbt_before_p50_ms"]), fmt(prefill["tbt_during_p50_ms"]),
                   fmt(prefill["tbt_during_p99_ms"]), fmt(prefill["chunk_ms"]), fmt(prefill["tbt_bound_ms"]),
                   fmt(prefill["delay_over_chunk_p50"], ".2f"), fmt(prefill["delay_over_chunk_max"], ".2f"),
                   fmt(prefill["ttft_s"], ".2f"), fmt(prefill["ttft_alone_s"], ".2f"), fmt(prefill["ttft_ratio"], ".2f")]]},
        {"title": "Soak: mixed prompt lengths up to the context under a KV budget below their sum",
         "columns": ["prompts", "prompt tokens", "budget tokens", "finished", "refused (never fit)",
                     "peak KV MiB", "budget MiB", "most running"],
         "rows": [[str(soaked["prompts"]), str(soaked["prompt_tokens"]), str(soaked["budget_tokens"]),
                   f"{soaked['finished']}/{soaked['submitted']}", str(soaked["refused"]),
                   fmt(soaked["peak_bytes"] / (1 << 20)), fmt(soaked["budget_bytes"] / (1 << 20)),
                   str(soaked["most_running"])]]},
    ]
    notes = [f"Refusal message: {soaked['refusal']}"] if soaked["refusal"] else []
    return {"forced": forced, "by_mode": {str(k): v for k, v in by_mode.items()}, "steps": steps_rows,
            "prefill": prefill, "soak": soaked, "ratios": ratios, "tables": tables, "notes": notes}


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    with figure(path, 3) as (ax1, ax2, ax3):
        modes = result["by_mode"]
        labels = ["on", "off"]
        ax1.bar(labels, [modes["True"]["passes_per_token"] or 0, modes["False"]["passes_per_token"] or 0])
        ax1.set_ylabel("forward passes / generated token"), ax1.set_title("forced extend (tool calls)", fontsize=9)
        steps = result["steps"]
        xs = range(len(steps))
        ax2.bar([x - 0.2 for x in xs], [r["maskd_ms"] for r in steps], width=0.4, label="maskd step")
        ax2.bar([x + 0.2 for x in xs], [r["bare_ms"] for r in steps], width=0.4, label="bare forward")
        ax2.set_xticks(list(xs), [f"{r['context']} tok" for r in steps]), ax2.set_ylabel("ms (8 rows)")
        ax2.legend(fontsize=7), ax2.set_title("decode step", fontsize=9)
        p = result["prefill"]
        ax3.bar(["before p50", "during p50", "during p99", "chunk"],
                [p["tbt_before_p50_ms"], p["tbt_during_p50_ms"], p["tbt_during_p99_ms"], p["chunk_ms"]])
        ax3.set_ylabel("ms"), ax3.set_title("time between tokens, long prompt arriving", fontsize=9)

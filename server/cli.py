"""The `maskd` command: serve, models, generate, bench."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

# OpenMP workers that spin long while they wait (libgomp's default, 300,000 spins) turn any other
# busy process on the machine into a 10-50x slowdown of every torch op (two servers on 2 cores: 0.6 s
# of small matmuls became 47 s); workers that never spin (OMP_WAIT_POLICY=PASSIVE) make each of a
# decode step's ~1,000 parallel regions pay a wake-up (SmolLM2 int4: 18 ms of matmuls instead of 5).
# A short spin covers the gaps between a step's regions and little more. Set before torch loads;
# the environment wins.
os.environ.setdefault("GOMP_SPINCOUNT", "50000")

from engine.registry import RegistryError, load_registry  # noqa: E402


def _load(args, leader=None, device_map: str | None = None):
    from engine.engine import Engine
    from engine.model_loader import load_model

    spec = load_registry(args.models).get(args.model)
    loaded = load_model(spec, device=args.device, allow_download=args.allow_download,
                        tp=getattr(args, "tp", 1), device_map=device_map)
    from engine.constraint_hook import ConstraintMasker

    masker = ConstraintMasker(loaded.vocab_size, args.max_batch)
    engine = Engine(loaded.model, loaded.tokenizer, loaded.device, loaded.eos_token_ids,
                    loaded.context_length, max_batch=args.max_batch, logits_hooks=[masker],
                    prefill_chunk=args.prefill_chunk, max_waiting=args.max_waiting,
                    prefix_cache_bytes=int(args.prefix_cache_mb * (1 << 20)),
                    kv_cache_bytes=int(args.kv_cache_mb * (1 << 20)) if args.kv_cache_mb else None,
                    forced_extend=not args.no_forced_extend, leader=leader,
                    compile_step=not args.no_compile, compile_cache=args.compile_cache or None)
    return loaded, engine


def _ranks(args):
    """Tensor parallelism: (what to do now, leader). A launcher starts the ranks and watches them;
    a rank > 0 follows rank 0 until it stops; rank 0 serves with a leader. A model transformers
    cannot shard runs in one process over every device (device_map="auto")."""
    from engine import tensor_parallel
    from engine.model_loader import load_model, pick_device

    ranks = tensor_parallel.rank_env()
    if ranks is None:
        if args.tp <= 1:
            return None, None
        from server.ranks import check_shardable, launch

        why = check_shardable(load_registry(args.models).get(args.model), args.tp)
        if why:
            print(f"maskd: warning: {why}; --tp {args.tp} falls back to one process with device_map=\"auto\", "
                  "which runs the layers one device after another (no faster than one device)", file=sys.stderr)
            return "device_map", None
        return launch(args.argv, args.tp), None
    rank, _, world = ranks
    if world != args.tp:
        raise SystemExit(f"maskd: --tp {args.tp} but WORLD_SIZE is {world}; give --tp the number of ranks")
    group = tensor_parallel.init(pick_device(args.device).type, args.tp_timeout)
    if rank > 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: rank 0 drains, then stops us
        loaded = load_model(load_registry(args.models).get(args.model), device=args.device,
                            allow_download=args.allow_download, tp=world)
        tensor_parallel.follow(loaded.model, loaded.device, group)
        return 0, None
    return None, tensor_parallel.Leader(group)


def cmd_serve(args) -> int:
    import uvicorn

    from engine.collector import freeze_startup
    from server.app import create_app
    from server.state import ServerState

    from grammars import ForcedText, GrammarCompiler, TokenVocabulary, prepare_name_stage

    done, leader = _ranks(args)
    if isinstance(done, int):
        return done
    loaded, engine = _load(args, leader, device_map="auto" if done == "device_map" else None)
    vocabulary = TokenVocabulary.from_tokenizer(loaded.tokenizer, loaded.vocab_size,
                                                extra_eos_token_ids=tuple(loaded.eos_token_ids))
    compiler = GrammarCompiler(vocabulary, cache_dir=args.grammar_cache or None, timeout_s=args.grammar_timeout,
                               lru_bytes=int(args.grammar_memory_mb * (1 << 20)), workers=args.grammar_workers)
    compiler.json_automaton()  # json_object and free-form values need it: built (or read from disk) now
    prepare_name_stage(vocabulary)  # the tables a call written before its units are compiled reads
    compiler.drain()  # the automaton's masks and the holes' exits made before the first request
    compiler.set_engine_idle(lambda: engine.idle)  # background compiles wait for the engine's idle time
    engine.forced_text = ForcedText(vocabulary, loaded.tokenizer)
    from server.responses import ResponseStore
    state = ServerState(model_name=loaded.name, tokenizer=loaded.tokenizer,
                        context_length=loaded.context_length, tool_format=loaded.spec.tool_format,
                        engine=engine, compiler=compiler, vocabulary=vocabulary,
                        responses=ResponseStore(args.response_store),
                        default_max_tokens=args.default_max_tokens or None,
                        max_tokens_cap=args.max_tokens_cap or None, request_timeout=args.request_timeout or None)
    api_key = args.api_key or os.environ.get("MASKD_API_KEY") or None
    app = create_app(state, api_key=api_key, max_body_bytes=int(args.max_body_mb * (1 << 20)),
                     cors_origins=tuple(o for o in args.cors_origins.split(",") if o))
    # On SIGTERM uvicorn drains (no new connections; running requests finish: see create_app), then
    # re-raises the signal so that the process dies by it; a drained stop is a clean one: exit 0.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    freeze_startup()  # startup's ~420k objects: no collection walks them again (engine/collector.py)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def cmd_models(args) -> int:
    from engine.model_loader import pick_device, pick_precision

    registry = load_registry(args.models)
    device = pick_device()
    print(f"{'name':32} {'available':10} {'tool_format':12} {'runs here at (' + device.type + ')':48} source")
    for spec in registry.models.values():
        mark = " (default)" if spec.name == registry.default else ""
        available = spec.is_available()
        try:
            here = pick_precision(spec, device).describe() if available else "-"
        except RegistryError as exc:
            here = f"refused: {exc}"
        print(f"{spec.name + mark:32} {'yes' if available else 'no':10} {spec.tool_format:12} {here:48} {spec.source}")
    return 0


def cmd_generate(args) -> int:
    from engine.sampling import SamplingParams
    from engine.sequence import Request

    loaded, engine = _load(args)
    messages = [{"role": "user", "content": args.prompt}]
    prompt_ids = loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = loaded.tokenizer.encode(prompt_ids, add_special_tokens=False)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)

    async def run() -> int:
        started, count = time.perf_counter(), 0
        async for event in engine.generate(Request(prompt_ids=prompt_ids, params=params)):
            print(event.text, end="", flush=True)
            count = event.completion_tokens
        elapsed = time.perf_counter() - started
        print(f"\n[{count} tokens in {elapsed:.2f}s: {count / elapsed:.1f} tokens/s]", file=sys.stderr)
        return 0

    engine.start()
    try:
        return asyncio.run(run())
    finally:
        engine.shutdown()


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="a name from models.yaml (default: its `default`)")
    parser.add_argument("--device", default="auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:1 ...")
    parser.add_argument("--max-batch", type=int, default=8, help="most requests decoded together")
    parser.add_argument("--prefill-chunk", type=int, default=512,
                        help="most prompt tokens prefilled per step (how long a newcomer stalls running rows)")
    parser.add_argument("--max-waiting", type=int, default=64,
                        help="most requests queued for admission; more get HTTP 429")
    parser.add_argument("--prefix-cache-mb", type=float, default=512,
                        help="KV memory budget of the shared prefix cache in MiB (0 disables it)")
    parser.add_argument("--kv-cache-mb", type=float, default=None,
                        help="KV memory budget of the running rows in MiB (default: every row at full context "
                             "where free memory allows, else 80%% of free GPU memory / 25%% of available RAM); "
                             "admission waits while it is full, a prompt that can never fit is a 400")
    parser.add_argument("--no-forced-extend", action="store_true",
                        help="feed grammar-forced tokens one forward pass each instead of one pass per run")
    parser.add_argument("--no-compile", action="store_true",
                        help="decode with the eager step only (by default the step is compiled in the background "
                             "after startup and serves once ready)")
    parser.add_argument("--compile-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "maskd", "inductor"),
                        help="directory of inductor's compiled kernels, kept across restarts")
    parser.add_argument("--allow-download", action="store_true",
                        help="let transformers fetch weights from the Hugging Face hub")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maskd", description="OpenAI-compatible server with valid tool calls")
    parser.add_argument("--models", default=None, help="path of the model registry (default: models.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model on /v1")
    _model_args(serve)
    serve.add_argument("--tp", type=int, default=1,
                       help="tensor parallelism: shard the model over this many ranks (processes; one GPU each on "
                            "CUDA), started here or by torchrun")
    serve.add_argument("--tp-timeout", type=float, default=600,
                       help="seconds a rank waits for another before the server ends (a rank that died)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--grammar-timeout", type=float, default=10.0,
                       help="seconds a schema may take to compile before the request fails with a 400")
    serve.add_argument("--grammar-cache", default=os.path.join(os.path.expanduser("~"), ".cache", "maskd", "grammars"),
                       help="directory of compiled grammars kept across restarts ('' to keep none)")
    serve.add_argument("--grammar-workers", type=int, default=None,
                       help="grammar compile processes (default: one per core); a request's tools compile side by side")
    serve.add_argument("--grammar-memory-mb", type=float, default=2048,
                       help="compiled grammars kept in memory, in MB (least recently used go first)")
    serve.add_argument("--api-key", default=None,
                       help="require this key (Authorization: Bearer / x-api-key) on every route but /health "
                            "and /metrics; also read from MASKD_API_KEY")
    serve.add_argument("--max-body-mb", type=float, default=32, help="largest request body accepted, in MiB (413 beyond)")
    serve.add_argument("--cors-origins", default="",
                       help="comma-separated origins browsers may call from (e.g. http://localhost:3000); none by default")
    serve.add_argument("--default-max-tokens", type=int, default=4096,
                       help="output tokens of a request that sends no max_tokens (0: the rest of the context)")
    serve.add_argument("--max-tokens-cap", type=int, default=0,
                       help="most output tokens a request may ask for; more is a 400 (0: no cap but the context)")
    serve.add_argument("--request-timeout", type=float, default=600,
                       help="seconds a request may run before it is cancelled and answered with a 504 "
                            "(0: no limit); on SIGTERM, running requests finish within it")
    serve.add_argument("--response-store", type=int, default=1000,
                       help="responses kept in memory for previous_response_id (0 keeps none)")
    serve.set_defaults(func=cmd_serve)
    models = sub.add_parser("models", help="list models.yaml and whether each model is on this machine")
    models.set_defaults(func=cmd_models)
    generate = sub.add_parser("generate", help="complete one prompt and print tokens/s")
    _model_args(generate)
    generate.add_argument("prompt")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    generate.set_defaults(func=cmd_generate)
    from server.bench.run import add_parser as add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the ranks of --tp are started with
    from engine.omp_team import single_main

    single_main()  # the engine thread's OpenMP team is the only one (engine/omp_team.py)
    try:
        return args.func(args)
    except RegistryError as exc:
        print(f"maskd: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

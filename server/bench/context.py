"""What the suites of one `maskd bench` run share: the options, the schema rows, the sizes, the
in-process model stack (loaded once) and the live server over the same model (started once, for
the HTTP suites)."""

from __future__ import annotations

import contextlib
import gc
import tempfile
import time
from dataclasses import dataclass, field

from server.bench.schemas import load_rows


@dataclass
class Sizes:
    """How much each suite runs: full, --quick, or the hidden --tiny (the test's)."""
    rounds: int = 5  # overhead: interleaved rounds
    tokens: int = 128  # overhead: new tokens per run
    compile_per_subset: int = 10**9  # compile: schemas of each subset
    walks: int = 30  # compile: random mask walks
    steps: int = 120  # compile: tokens per walk
    budget_schemas: int = 20  # budget: BFCL schemas
    slacks: tuple[int, ...] = (0, 5, 20)  # budget: tokens above the shortest valid output
    tool_counts: tuple[int, ...] = (1, 10, 50)  # tools: tools per list
    tool_tokens: int = 96  # tools: max_tokens per call
    agents: int = 8  # prefix: agents sharing one prefix
    prefix_tokens: int = 1500  # prefix: tokens of the shared prefix
    prefix_rounds: int = 3
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)  # batch
    batch_tokens: int = 64  # batch: tokens per request

    @classmethod
    def pick(cls, quick: bool, tiny: bool) -> "Sizes":
        if tiny:
            return cls(rounds=1, tokens=8, compile_per_subset=2, walks=2, steps=16, budget_schemas=1, slacks=(0,),
                       tool_counts=(2,), tool_tokens=48, agents=2, prefix_tokens=200, prefix_rounds=1,
                       concurrency=(1, 2), batch_tokens=4)
        if quick:
            return cls(rounds=3, tokens=48, compile_per_subset=8, walks=8, steps=60, budget_schemas=4,
                       slacks=(0, 20), tool_tokens=64, agents=4, prefix_tokens=1000, prefix_rounds=1,
                       batch_tokens=16)
        return cls()


@dataclass
class Stack:
    """The model loaded in this process, with the engine, compiler and ServerState around it."""
    loaded: object
    vocabulary: object
    compiler: object
    engine: object
    state: object
    masker: object  # the TimedMasker in the engine's logits hooks

    def close(self) -> None:
        self.engine.shutdown()
        self.compiler.close()


class TimedMasker:
    """The engine's ConstraintMasker, timed: seconds of each call with constrained rows and how
    many such rows it masked; `on` switches the recording."""

    def __init__(self, inner) -> None:
        self.inner, self.on, self.calls, self._ahead = inner, False, [], 0.0

    def ahead(self, seq) -> None:
        """The masker's lookups ahead (ConstraintMasker.ahead) count in the next timed call."""
        started = time.perf_counter()
        self.inner.ahead(seq)
        if self.on:
            self._ahead += time.perf_counter() - started

    def __call__(self, logits, seqs):
        if not self.on:
            return self.inner(logits, seqs)
        rows = sum(seq.constraint is not None for seq in seqs)
        started = time.perf_counter()
        narrowed = self.inner(logits, seqs)
        if rows:
            self.calls.append((time.perf_counter() - started + self._ahead, rows))
            self._ahead = 0.0
        return narrowed


@dataclass
class BenchContext:
    model: str | None
    device: str
    models: str | None  # registry path
    quick: bool
    tiny: bool
    schemas: str | None
    sizes: Sizes = field(default=None)
    rows: list[dict] = field(default_factory=list)
    _stack: Stack | None = None
    _server: contextlib.ExitStack | None = None
    _url: str | None = None

    def __post_init__(self) -> None:
        self.sizes = self.sizes or Sizes.pick(self.quick, self.tiny)
        self.rows = self.rows or load_rows(self.schemas)  # rows given: a developer script's own selection

    def stack(self) -> Stack:
        if self._stack is None:
            self._stack = self._open_stack()
        return self._stack

    def _open_stack(self) -> Stack:
        from engine.constraint_hook import ConstraintMasker
        from engine.engine import Engine
        from engine.model_loader import load_model
        from engine.registry import load_registry
        from grammars import GrammarCompiler, TokenVocabulary
        from grammars.masks.forced_text import ForcedText
        from server.state import ServerState

        loaded = load_model(load_registry(self.models).get(self.model), device=self.device)
        vocabulary = TokenVocabulary.from_tokenizer(loaded.tokenizer, loaded.vocab_size,
                                                    extra_eos_token_ids=tuple(loaded.eos_token_ids))
        compiler = GrammarCompiler(vocabulary, timeout_s=10.0)
        masker = TimedMasker(ConstraintMasker(loaded.vocab_size, 8))
        engine = Engine(loaded.model, loaded.tokenizer, loaded.device, loaded.eos_token_ids, loaded.context_length,
                        logits_hooks=[masker], prefix_cache_bytes=512 << 20, compile_step=True)  # as `maskd serve`
        engine.forced_text = ForcedText(vocabulary, loaded.tokenizer)
        engine.start()
        state = ServerState(loaded.name, loaded.tokenizer, loaded.context_length, loaded.spec.tool_format, engine,
                            compiler, vocabulary)
        return Stack(loaded, vocabulary, compiler, engine, state, masker)

    def close_stack(self) -> None:
        """Frees the in-process model before the live server loads its own."""
        if self._stack is not None:
            self._stack.close()
            self._stack = None
            gc.collect()
            try:
                import torch
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except ImportError:
                pass

    def server_url(self) -> str:
        """A live server (uvicorn on a free loopback port, in a thread of this process) of the model
        already loaded: `maskd serve`'s app over a fresh engine (room for 16 concurrent requests,
        prefix cache on) and a fresh grammar compiler whose disk cache is a temporary directory, so
        cold means cold. Started on first use."""
        if self._url is None:
            self._url = self._start_server()
        return self._url

    def _start_server(self) -> str:
        import threading

        import uvicorn

        from engine.constraint_hook import ConstraintMasker
        from engine.engine import Engine
        from grammars import GrammarCompiler
        from grammars.masks.forced_text import ForcedText
        from server.app import create_app
        from server.bench.live_server import _free_port
        from server.state import ServerState

        stack = self.stack()
        loaded = stack.loaded
        stack.engine.shutdown()  # idle from here on: the served engine alone runs the model
        self._server = contextlib.ExitStack()
        cache = self._server.enter_context(tempfile.TemporaryDirectory(prefix="maskd-bench-grammars-"))
        compiler = GrammarCompiler(stack.vocabulary, cache_dir=cache, timeout_s=10.0)
        self._server.callback(compiler.close)
        engine = Engine(loaded.model, loaded.tokenizer, loaded.device, loaded.eos_token_ids, loaded.context_length,
                        max_batch=16, logits_hooks=[ConstraintMasker(loaded.vocab_size, 16)],
                        prefix_cache_bytes=512 << 20, compile_step=True)
        engine.forced_text = ForcedText(stack.vocabulary, loaded.tokenizer)  # as `maskd serve`
        state = ServerState(loaded.name, loaded.tokenizer, loaded.context_length, loaded.spec.tool_format, engine,
                            compiler, stack.vocabulary, default_max_tokens=4096)
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, name="maskd-bench-server", daemon=True)
        thread.start()

        def stop() -> None:
            server.should_exit = True
            thread.join(timeout=30)
        self._server.callback(stop)
        deadline = time.time() + 120
        while not server.started:
            if not thread.is_alive() or time.time() > deadline:
                self._server.close()
                raise RuntimeError("the bench's live server did not start (see the log above)")
            time.sleep(0.05)
        return f"http://127.0.0.1:{port}"

    def spec(self):
        from engine.registry import load_registry

        return load_registry(self.models).get(self.model)

    def tokenizer(self):
        """The model's tokenizer (the stack's, or loaded alone: no weights)."""
        if self._stack is not None:
            return self._stack.loaded.tokenizer
        from transformers import AutoTokenizer

        where, gguf = self.spec().locate()
        tokenizer = AutoTokenizer.from_pretrained(where, **({"gguf_file": gguf} if gguf else {}), local_files_only=True)
        if self.spec().chat_template:
            tokenizer.chat_template = self.spec().chat_template
        return tokenizer

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server, self._url = None, None
        self.close_stack()

"""llama.cpp (llama-cpp-python) in a process of its own, driven over a pipe by the bench.

Both llama.cpp and torch compute on libgomp, one copy per process. In one process their OpenMP teams
together outnumber the cores, and libgomp's workers then sleep between parallel regions instead of
spinning (engine/omp_team.py): measured on this 2-core machine, maskd's decode fell from 90 to 49
tok/s once llama.cpp had run beside it, and llama.cpp's from 104 to 72. Run apart, each gets the
cores the way it would on its own, which is how a user runs either. perf_counter() is the system's
monotonic clock, so the times the child notes compare with the parent's.

Requests are pickled tuples (verb, *args) on the child's stdin; each answer is a pickled
("ok", value) or ("error", message) on the descriptor the child was given (its stdout, which
llama.cpp's own prints cannot reach: they go to stderr).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path


class LlamaProcess:
    """A child process holding llama_cpp.Llama on ``gguf`` with ``threads`` threads."""

    def __init__(self, gguf: str, threads: int, n_ctx: int = 4096) -> None:
        command = [sys.executable, "-m", "server.bench.llama_process", gguf, str(threads), str(n_ctx)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=str(Path(__file__).resolve().parents[2]))
        self.call("ready")

    def call(self, verb: str, *args):
        pickle.dump((verb, *args), self.proc.stdin)
        self.proc.stdin.flush()
        try:
            status, value = pickle.load(self.proc.stdout)
        except EOFError:
            raise RuntimeError(f"the llama.cpp process ended (exit code {self.proc.wait()})") from None
        if status != "ok":
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("exit")
            except (RuntimeError, OSError):
                pass
            self.proc.wait(timeout=60)


def _serve(gguf: str, threads: int, n_ctx: int) -> None:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # llama.cpp's prints go to stderr, never into the answers
    from llama_cpp import Llama, LlamaGrammar

    llm = Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, seed=0, verbose=False)
    grammars: list = []

    def generate(grammar, prompt_ids, max_new_tokens, ignore_eos, eos):
        ids, times = [], []
        made = None if grammar is None else grammars[grammar]
        for token in llm.generate(prompt_ids, temp=0.0, grammar=made):
            times.append(time.perf_counter())
            ids.append(token)
            if len(ids) >= max_new_tokens or (token in eos and not ignore_eos):
                break
        return ids, times

    def compile_schema(schema_json):
        grammars.append(LlamaGrammar.from_json_schema(schema_json, verbose=False))
        return len(grammars) - 1

    def prefill(prompt_ids):
        llm.reset()
        started = time.perf_counter()
        llm.eval(prompt_ids)
        seconds = time.perf_counter() - started
        llm.reset()
        return seconds

    verbs = {"ready": lambda: True, "eos": llm.token_eos, "compile": compile_schema, "generate": generate,
             "prefill": prefill}
    while True:
        try:
            verb, *args = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        if verb == "exit":
            pickle.dump(("ok", None), answers)
            answers.flush()
            return
        try:
            answer = ("ok", verbs[verb](*args))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller, who raises it
            answer = ("error", f"{type(exc).__name__}: {exc}")
        pickle.dump(answer, answers)
        answers.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))

"""`maskd serve --tp N`: starts N ranks of the same command on this machine and watches them.

Each rank is `python -m server.cli <the same arguments>` with torch.distributed's environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT), which is what torchrun
gives too, so `torchrun --nproc-per-node N -m server.cli serve --tp N` works the same way. Rank 0
serves HTTP and drives; the others follow (engine/tensor_parallel.py).

The launcher passes SIGTERM and SIGINT to rank 0 (which drains, then tells the others to stop),
and when any rank ends otherwise it stops the rest and exits with that rank's code and a message
naming it: a server with a rank missing cannot answer, so it must not look alive.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

STOP_GRACE_S = 120.0  # after rank 0 has ended, how long the others get to finish before they are killed


def check_shardable(spec, tp: int) -> str | None:
    """Why the model cannot be split over tp ranks by transformers' tensor parallelism (no plan:
    the caller falls back to device_map="auto"), or None. Reads the config only."""
    from transformers import AutoConfig

    where, gguf_file = spec.locate()
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    config = AutoConfig.from_pretrained(where, local_files_only=True, **kwargs)
    config = getattr(config, "text_config", None) or config
    if not getattr(config, "base_model_tp_plan", None):
        return f"{type(config).__name__} has no tensor-parallel plan in transformers"
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if heads and heads % tp:
            raise SystemExit(f"maskd: --tp {tp} does not divide the model's {field} ({heads}); "
                             f"use a --tp that divides it")
    return None


def _die_with_parent() -> None:
    """In a rank, before it runs: a launcher killed outright (SIGKILL) takes its ranks with it."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(argv: list[str], tp: int) -> int:
    port = _free_port()
    procs = []
    for rank in range(tp):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(tp),
               "LOCAL_WORLD_SIZE": str(tp), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "server.cli", *argv], env=env,
                                      preexec_fn=_die_with_parent, start_new_session=True))  # Ctrl-C: one, passed on
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: procs[0].send_signal(signum))
    while True:
        ended = [(rank, proc.poll()) for rank, proc in enumerate(procs)]
        # a follower that ended cleanly was told to stop: rank 0 is ending too
        ended = [(rank, code) for rank, code in ended
                 if code is not None and not (rank > 0 and code == 0 and procs[0].poll() is None)]
        if ended:  # a rank killed by a signal is the cause; a rank that then saw its peer gone exits 1
            rank, code = min(ended, key=lambda e: (e[1] >= 0, e[0]))
            if rank == 0 and code == 0:
                return 0 if _stop(procs, "") else 1
            _stop(procs, f"maskd: rank {rank} of {tp} exited with code {code}; stopping the server")
            return code if code > 0 else 1
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen], why: str) -> bool:
    """Ends every rank (terminating them first when `why` says something went wrong); False if
    one had to be killed."""
    clean = True
    if why:
        print(why, file=sys.stderr, flush=True)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        if proc.poll() is None and why:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"maskd: rank {procs.index(proc)} did not stop within {STOP_GRACE_S:.0f} s; killed",
                  file=sys.stderr, flush=True)
            proc.kill()
            proc.wait()
            clean = False
    return clean

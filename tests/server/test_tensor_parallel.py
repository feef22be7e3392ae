"""`maskd serve --tp 2`: two gloo ranks on the CPU answer token for token as one process does,
with batching and the prefix cache on, through the openai SDK; SIGTERM stops every rank; a rank
that dies ends the server with a message.

The model is a tiny random-weight Llama (4 heads, 2 KV heads: one KV head per rank) saved with the
embedded model's tokenizer, so that both servers load it from a directory as a user's would be.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from server.bench.live_server import ROOT, _free_port, live_server  # noqa: E402

SYSTEM = {"role": "system", "content": "You answer briefly and call tools when asked. " * 12}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"]}}}]


@pytest.fixture(scope="module")
def tiny_registry(tmp_path_factory, smollm_tokenizer) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    where = tmp_path_factory.mktemp("tiny-tp")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(smollm_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.2,  # peaked logits: a wrong KV or position changes tokens
                         bos_token_id=smollm_tokenizer.bos_token_id, eos_token_id=smollm_tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(where)
    smollm_tokenizer.save_pretrained(where)
    registry = where / "models.yaml"
    registry.write_text(f"default: tiny\nmodels:\n  - name: tiny\n    source: {where}\n    tool_format: hermes\n"
                        f"    dtype: float32\n    context_length: 2048\n")
    return str(registry)


def _answers(url: str) -> list:
    """Five requests at once (one row each in the batch, sharing the system prompt's prefix), plain and
    streamed, then the first again (a prefix hit): each answer's text, tool calls and usage."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=1800)
    asks = [dict(messages=[SYSTEM, {"role": "user", "content": f"question {i} " * (1 + 4 * i)}], max_tokens=16)
            for i in range(3)]
    asks.append(dict(messages=[SYSTEM, {"role": "user", "content": "weather in Paris?"}], tools=TOOLS,
                     tool_choice="required", max_tokens=48))
    asks.append(dict(messages=[SYSTEM, {"role": "user", "content": "stream this"}], max_tokens=16, stream=True))

    def ask(kwargs):
        reply = client.chat.completions.create(model="tiny", temperature=0, **kwargs)
        if kwargs.get("stream"):
            return "".join(chunk.choices[0].delta.content or "" for chunk in reply if chunk.choices)
        message = reply.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return message.content, calls, reply.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(ask, asks))
    again = client.chat.completions.create(model="tiny", temperature=0, **asks[0])
    cached = again.usage.prompt_tokens_details.cached_tokens
    return answers + [(again.choices[0].message.content, cached)]


def test_two_ranks_answer_as_one_process_does_and_stop_on_sigterm(tiny_registry, tmp_path):
    with live_server(models=tiny_registry, timeout=1800) as (url, _):
        alone = _answers(url)
    proc, url = _serve_tp(tiny_registry, tmp_path / "serve.log")
    ranks = _rank_pids(proc.pid)
    sharded = _answers(url)
    assert sharded == alone
    name, arguments = alone[3][1][0]
    assert name == "get_weather" and set(json.loads(arguments)) == {"city", "unit"}
    assert alone[-1][1] > 100  # the repeat was served from the prefix cache on both
    proc.send_signal(signal.SIGTERM)  # rank 0 drains, then tells rank 1 to stop
    assert proc.wait(timeout=1800) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert sorted(ranks) == [0, 1] and not any(Path(f"/proc/{pid}").exists() for pid in ranks.values())


def _rank_pids(launcher: int) -> dict[int, int]:
    """The launcher's children by their RANK."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PPid:\t{launcher}\n" in status:
            rank = next((e[5:] for e in environ if e.startswith(b"RANK=")), None)
            if rank is not None:
                found[int(rank)] = int(pid)
    return found


def _serve_tp(registry: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "--models", registry, "serve", "--tp", "2",
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT,
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    import httpx

    url = f"http://127.0.0.1:{port}"
    while True:  # however slow the machine: only a server that exits fails here
        assert proc.poll() is None, log_path.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.3)


def test_a_rank_that_dies_ends_the_server_with_a_message(tiny_registry, tmp_path):
    proc, _ = _serve_tp(tiny_registry, tmp_path / "serve.log")
    ranks = _rank_pids(proc.pid)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGKILL)
    code = proc.wait(timeout=1800)  # bounded by the broadcast timeout at worst; seconds in practice
    log = (tmp_path / "serve.log").read_text()
    assert code != 0 and "rank 1 of 2 exited" in log, log[-3000:]
    assert not any(Path(f"/proc/{pid}").exists() for pid in ranks.values())  # the launcher reaped them


def test_tp_must_divide_the_heads(tiny_registry):
    from engine.registry import load_registry
    from server.ranks import check_shardable

    spec = load_registry(tiny_registry).get("tiny")
    assert check_shardable(spec, 2) is None
    with pytest.raises(SystemExit, match="--tp 3 does not divide the model's num_attention_heads"):
        check_shardable(spec, 3)

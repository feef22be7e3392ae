"""Engine token logprobs in OpenAI's shapes (chat `logprobs.content`, completions' legacy lists)."""

from __future__ import annotations

from server.state import ServerState


def _entry(state: ServerState, token_id: int, logprob: float) -> dict:
    raw = state.vocabulary.decode([token_id])
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(state: ServerState, logprobs: list, top: int) -> dict:
    """{"content": [...]}: each token with its logprob and its `top` most likely alternatives."""
    return {"content": [{**_entry(state, lp.token_id, lp.logprob),
                         "top_logprobs": [_entry(state, t, v) for t, v in lp.top[:top]]} for lp in logprobs]}


def completion_logprobs(state: ServerState, logprobs: list, top: int, offset: int = 0) -> dict:
    """The legacy completions shape: parallel lists of tokens, logprobs, top dicts and text offsets."""
    tokens = [_entry(state, lp.token_id, lp.logprob)["token"] for lp in logprobs]
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{_entry(state, t, v)["token"]: v for t, v in lp.top[:top]} for lp in logprobs],
            "text_offset": offsets}

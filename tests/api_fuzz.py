"""The HTTP API under fuzzing, in process: the app, schemathesis cases, and what every answer must keep.

Shared by tests/server/test_api_fuzz.py (a modest count) and benchmarks/fuzz.py (>= 10,000 requests); the
hypothesis-built requests are in tests/api_fuzz_requests.py, schemathesis draws cases from the app's own
OpenAPI document (positive and negative), and both are sent through the same client. The app is
the real one (create_app) over a real engine: a tiny random-weight Llama, the embedded model's tokenizer,
a real grammar compiler (a short compile limit, so pathological schemas end as 400s quickly) and
forced text, as `maskd serve` wires them. Generations are tiny: the server's default is 4 tokens and its
cap 48 (a constrained output needs room for its shortest valid text, or it is a 400 `budget_too_small`).

What every answer must keep (`problems`): never a 5xx (nor a `server_error` inside a 200 stream); a 4xx
has a well-formed error body (OpenAI's shape, Anthropic's on /v1/messages); a 200 carrying a
constrained output validates against the schema the request sent (jsonschema, independently of the
server's own check). That the server keeps serving is checked by the callers (/health and a canary).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: see server/cli.py

import jsonschema  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from api_fuzz_requests import CASES, MODEL, Case  # noqa: E402,F401 (CASES: for the callers)
VOCAB = 49152
CONTEXT = 512
MAX_TOKENS_CAP = 48


# -- the app -------------------------------------------------------------------------------------------

def load_tokenizer():
    """The embedded model's tokenizer, read from its GGUF file (no network)."""
    from transformers import AutoTokenizer

    from engine.registry import load_registry
    where, gguf = load_registry().get("smollm2-135m-instruct").locate()
    return AutoTokenizer.from_pretrained(where, gguf_file=gguf, local_files_only=True)


def tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT)
    return LlamaForCausalLM(config).eval()


def build_state(model, tokenizer, tool_format: str = "hermes", compile_timeout: float = 2.0):
    """A ServerState wired as cmd_serve wires it; the engine is not started (the caller starts it).
    The caller closes `state.compiler` at the end (its worker is a child process)."""
    import torch

    from engine.constraint_hook import ConstraintMasker
    from engine.engine import Engine
    from grammars import GrammarCompiler, TokenVocabulary
    from grammars.masks.forced_text import ForcedText
    from server.state import ServerState

    vocabulary = TokenVocabulary.from_tokenizer(tokenizer, VOCAB, extra_eos_token_ids=(2,))
    compiler = GrammarCompiler(vocabulary, timeout_s=compile_timeout, workers=1)
    compiler.json_automaton()
    engine = Engine(model, tokenizer, torch.device("cpu"), frozenset({2}), CONTEXT,
                    logits_hooks=[ConstraintMasker(VOCAB, 8)])
    engine.forced_text = ForcedText(vocabulary, tokenizer)
    return ServerState(model_name=MODEL, tokenizer=tokenizer, context_length=CONTEXT, tool_format=tool_format,
                       engine=engine, compiler=compiler, vocabulary=vocabulary, default_max_tokens=4,
                       max_tokens_cap=MAX_TOKENS_CAP, request_timeout=1800)  # bounds a hang, not the machine



def schemathesis_cases(app):
    """One strategy over every operation of the app's OpenAPI document (positive and negative cases)."""
    import schemathesis
    from schemathesis.generation import GenerationMode

    # from the document itself: from_asgi would run the app's lifespan (a second engine loop)
    schema = schemathesis.openapi.from_dict(app.openapi())
    operations = [result.ok() for result in schema.get_all_operations()]
    modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    return st.one_of([op.as_strategy(generation_mode=mode) for op in operations for mode in modes])


def as_case(sx_case) -> Case:
    """A schemathesis case as the Case the checks read (its body sent as JSON, or raw where it is not JSON)."""
    from schemathesis.core import NotSet

    path = sx_case.formatted_path
    if sx_case.query:
        from urllib.parse import urlencode
        path += "?" + urlencode(sx_case.query, doseq=True)
    body = None if isinstance(sx_case.body, NotSet) else sx_case.body
    if isinstance(body, (bytes, str)):
        return Case(path, raw=body.encode() if isinstance(body, str) else body, method=sx_case.method.upper())
    return Case(path, body, method=sx_case.method.upper())


# -- what every answer must keep ---------------------------------------------------------------------------

def problems(case: Case, reply) -> list[str]:
    """What is wrong with `reply` to `case` (empty: nothing)."""
    status = reply.status_code
    if status >= 500:
        return [f"{status} on {case.path}: {reply.text[:300]}"]
    if 400 <= status < 500:
        return _error_shape(case.path, reply)
    if status != 200:
        return [f"unexpected status {status}"]
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        return _stream_problems(case, reply.text)
    if case.method == "POST" and case.path in CHECKED_ROUTES:
        return CHECKED_ROUTES[case.path](case.body, reply.json())
    return []


def _error_shape(path: str, reply) -> list[str]:
    try:
        body = reply.json()
    except ValueError:
        return [f"{reply.status_code} with a body that is not JSON: {reply.text[:200]!r}"]
    if path.startswith("/v1/messages"):
        ok = isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict) \
            and isinstance(body["error"].get("type"), str) and isinstance(body["error"].get("message"), str) \
            and body["error"]["message"]
    else:
        error = body.get("error") if isinstance(body, dict) else None
        ok = isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"] \
            and isinstance(error.get("type"), str) and "param" in error and "code" in error
    return [] if ok else [f"{reply.status_code} error body not in the API's shape: {body!r:.300}"]


def validation_error(value_text, schema) -> str | None:
    """None when the JSON text is valid under the schema (None schema: any JSON object)."""
    try:
        value = json.loads(value_text) if isinstance(value_text, str) else value_text
    except ValueError as exc:
        return f"not JSON ({exc}): {value_text!r:.200}"
    if schema is None:
        return None if isinstance(value, dict) else f"not an object: {value!r:.200}"
    try:
        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
            .iter_errors(value))
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError, RecursionError):
        return None  # a schema jsonschema cannot use: the server's acceptance is not ours to judge here
    except Exception as exc:  # noqa: BLE001 (jsonschema's own failures on odd schemas)
        return None if "Unresolvable" in type(exc).__name__ else f"jsonschema raised {exc!r:.200}"
    return None if error is None else f"{error.message:.200} in {json.dumps(value)[:200]}"


def _chat_expectations(body: dict):
    """(format schema or None, whether a format applies, {tool name: parameters}, forced name or None)."""
    fmt = body.get("response_format") or {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    schema = None
    if kind == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") if spec.get("strict") is not False else None
    tools = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object", "properties": {}}
             for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)}
    choice = body.get("tool_choice")
    named = choice["function"]["name"] if isinstance(choice, dict) and isinstance(choice.get("function"), dict) else None
    return schema, kind in ("json_object", "json_schema"), tools, named


def _call_problems(tools: dict, named, name, arguments, finish) -> list[str]:
    if name not in tools:
        return [f"a call to {name!r}, not among the tools {sorted(tools)}"]
    if named is not None and name != named:
        return [f"a call to {name!r} where tool_choice named {named!r}"]
    if finish == "length":
        return []
    error = validation_error(arguments or "{}", tools[name])
    return [f"the arguments of {name!r}: {error}"] if error else []


def _chat_problems(body: dict, reply: dict) -> list[str]:
    schema, formatted, tools, named = _chat_expectations(body)
    out = []
    for choice in reply.get("choices", []):
        message, finish = choice["message"], choice["finish_reason"]
        for call in message.get("tool_calls") or []:
            out += _call_problems(tools, named, call["function"]["name"], call["function"]["arguments"], finish)
        if formatted and not tools and finish != "length":
            error = validation_error(message.get("content") or "", schema)
            out += [f"the structured output: {error}"] if error else []
    return out


def _messages_problems(body: dict, reply: dict) -> list[str]:
    tools = {t["name"]: t["input_schema"] for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t}
    fmt = (body.get("output_config") or {}).get("format")
    out = []
    for block in reply.get("content", []):
        if block["type"] == "tool_use":
            cut = "length" if reply.get("stop_reason") == "max_tokens" else "tool_use"
            out += _call_problems(tools, None, block["name"], block["input"], cut)
        elif block["type"] == "text" and fmt and not tools and reply.get("stop_reason") != "max_tokens":
            error = validation_error(block["text"], fmt.get("schema"))
            out += [f"the structured output: {error}"] if error else []
    return out


def _responses_problems(body: dict, reply: dict) -> list[str]:
    tools = {t["name"]: t.get("parameters") or {"type": "object", "properties": {}}
             for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t}
    fmt = (body.get("text") or {}).get("format")
    cut = reply.get("status") == "incomplete"
    out = []
    for item in reply.get("output", []):
        if item["type"] == "function_call":
            out += _call_problems(tools, None, item["name"], item["arguments"], "length" if cut else "tool_calls")
        elif item["type"] == "message" and fmt and not tools and not cut:
            text = "".join(part.get("text", "") for part in item["content"])
            error = validation_error(text, fmt.get("schema"))
            out += [f"the structured output: {error}"] if error else []
    return out


CHECKED_ROUTES = {"/v1/chat/completions": _chat_problems, "/v1/messages": _messages_problems,
                  "/v1/responses": _responses_problems}


def _stream_problems(case: Case, text: str) -> list[str]:
    """A 200 stream: every payload is JSON, none is a server error; a chat stream's output is validated."""
    payloads, out = [], []
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                continue
            try:
                payloads.append(json.loads(data))
            except ValueError:
                out.append(f"a stream payload that is not JSON: {data[:200]!r}")
    for payload in payloads:
        error = payload.get("error") if isinstance(payload, dict) else None
        error = error or (payload.get("response", {}).get("error") if isinstance(payload.get("response"), dict) else None)
        if isinstance(error, dict) and (error.get("type") in ("server_error", "api_error")
                                        or "internal error" in str(error.get("message"))):
            out.append(f"a server error inside the stream: {error!r:.300}")
    events = [line.removeprefix("event:").strip() for line in text.splitlines() if line.startswith("event:")]
    data = [line.removeprefix("data:").strip() for line in text.splitlines() if line.startswith("data:")]
    route = case.path.split("?")[0]
    ended = {"/v1/chat/completions": data[-1:] == ["[DONE]"], "/v1/completions": data[-1:] == ["[DONE]"],
             "/v1/messages": events[-1:] in (["message_stop"], ["error"]),
             "/v1/responses": events[-1:] in (["response.completed"], ["response.failed"], ["response.incomplete"])}
    if not ended.get(route, True):
        out.append(f"a stream cut off before its end: {text[-200:]!r}")
    if case.path == "/v1/chat/completions" and not out:
        out += _chat_problems(case.body, _joined_chat(payloads))
    return out


def _joined_chat(payloads: list) -> dict:
    """The streamed chat chunks joined into the shape of a plain answer."""
    choices: dict[int, dict] = {}
    for chunk in payloads:
        for choice in chunk.get("choices") or []:
            joined = choices.setdefault(choice["index"], {"message": {"content": "", "tool_calls": {}},
                                                          "finish_reason": None})
            delta = choice.get("delta") or {}
            joined["message"]["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = joined["message"]["tool_calls"].setdefault(call["index"], {"function": {"name": "",
                                                                                              "arguments": ""}})
                function = call.get("function") or {}
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            joined["finish_reason"] = choice.get("finish_reason") or joined["finish_reason"]
    for joined in choices.values():
        joined["message"]["tool_calls"] = list(joined["message"]["tool_calls"].values())
    return {"choices": list(choices.values())}


def constrained(case: Case) -> bool:
    """Whether the request asked for a constrained output (tools or a JSON format)."""
    body = case.body if isinstance(case.body, dict) else {}
    return bool(body.get("tools") or body.get("response_format") or body.get("output_config") or body.get("text"))

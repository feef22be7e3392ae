"""The one internal request every API adapts to: validated, rendered, constrained and submitted.

Chat completions, text completions, the Anthropic Messages API and the OpenAI Responses API each
turn their body into a `GenerationRequest` (naming their own fields in `Fields`, for errors), call
`prepare` and `start`, and turn the parts of `server/output_stream.py` into their wire format. No
adapter holds decoding logic: a fix here reaches every API.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from engine.sampling import SamplingParams
from engine.sequence import Request
from server.errors import APIError
from server.output_check import OutputCheck
from server.prompt import render_chat
from server.reasoning import ReasoningSplitter
from server.state import ServerState
from server.structured_output import OutputFormat, build_format_constraint
from server.tool_calls import PendingTools, ToolChoice, build_tool_call, tool_format_of


@dataclass(frozen=True)
class Fields:
    """How this API names the fields an error may point at."""
    messages: str = "messages"
    max_tokens: str = "max_tokens"
    tools: str = "tools"
    tool_schema: str = "tools[{i}].function.parameters"
    tool_choice: str = "tool_choice"
    tool_name: str = "tool_choice.function.name"
    format: str = "response_format"
    format_schema: str = "response_format.json_schema.schema"
    logit_bias: str = "logit_bias"


@dataclass
class GenerationRequest:
    prompt: list[dict] | str | list[int]  # chat messages (template dicts), or raw text / token ids
    sampling: SamplingParams  # max_tokens is set by prepare
    max_tokens: int | None = None  # what the client asked for; None: --default-max-tokens within the context
    tools: list[dict] | None = None  # OpenAI function tools: {"type": "function", "function": {...}}
    tool_choice: ToolChoice = field(default_factory=lambda: ToolChoice("none"))
    parallel_tool_calls: bool = True
    output_format: OutputFormat | None = None
    template_kwargs: dict = field(default_factory=dict)  # chat_template_kwargs (enable_thinking, ...)
    n: int = 1
    fields: Fields = field(default_factory=Fields)


@dataclass
class Prepared:
    requests: list[Request]  # n engine requests for the same prompt
    reads_tools: bool  # whether the output is read for tool calls
    thinking_open: bool  # the prompt left a <think> block open
    budget: int | None = None
    room: int = 0  # context left after the prompt
    pending: list[PendingTools] = field(default_factory=list)  # tool units still compiling, per request
    fields: Fields = field(default_factory=Fields)
    check: OutputCheck = field(default_factory=OutputCheck)  # validates outputs before they leave
    deadline: float | None = None  # event-loop time past which the request is cancelled (--request-timeout)
    failure: APIError | None = None  # a tool's unit failed while the request ran ahead of its units
    _watchers: list = field(default_factory=list)

    @property
    def request(self) -> Request:
        return self.requests[0]

    @property
    def constrained(self) -> bool:
        return self.requests[0].constraint is not None

    async def settle(self, state=None) -> None:
        """Waits for the tool units (attaching them to each constraint) and checks the budget against
        the shortest valid output; raises APIError (a 400) where either fails. A request that may
        begin its calls before its units are compiled (a name stage) is not waited for: its units
        are awaited beside it, and one that fails sets ``failure`` and cancels it. Without ``state``
        (the running server's) every unit is waited for: the constraint's minimum is then exact."""
        for pending, request in zip(self.pending, self.requests):
            if state is not None and await pending.name_first(state, self.budget, self.room):
                self._watch(pending, request.request_id, state.engine.cancel)
                continue
            pending.hurry()  # waited on now, without the engine's idle time (benchmarks keep it busy)
            await pending.wait()
            check_budget(request.constraint, self.budget, self.room, self.fields)
        self.pending = []

    def _watch(self, pending: PendingTools, request_id: int, cancel) -> None:
        def done(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                error = task.exception()
                self.failure = error if isinstance(error, APIError) else APIError(str(error), status=500)
                cancel(request_id)
        task = asyncio.ensure_future(pending.wait())
        task.add_done_callback(done)
        self._watchers.append(task)

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(starts_inside=self.thinking_open)


def prompt_ids_of(state: ServerState, job: GenerationRequest) -> tuple[list[int], bool]:
    """(prompt token ids, whether a thinking block is left open)."""
    if isinstance(job.prompt, str):
        return encode(state.tokenizer, job.prompt, job.fields.messages, add_special_tokens=True), False
    if job.prompt and isinstance(job.prompt[0], int):
        ids = list(job.prompt)
        if any(t < 0 or t >= state.vocabulary.size for t in ids):
            raise APIError(f"prompt token ids must lie in [0, {state.vocabulary.size})", param=job.fields.messages)
        return ids, False
    fmt = tool_format_of(state)
    template = state.tokenizer.chat_template or ""
    messages, template_tools = fmt.prepare_messages(job.prompt, job.tools, "tools" in template,
                                                    chat_template=template)
    text = render_chat(state.tokenizer, messages, template_tools, job.template_kwargs, job.fields.messages)
    return encode(state.tokenizer, text, job.fields.messages, add_special_tokens=False), ReasoningSplitter.opened_in(text)


def encode(tokenizer, text: str, param: str, add_special_tokens: bool) -> list[int]:
    """The text's token ids; text that is not valid Unicode (a lone UTF-16 surrogate such as the JSON
    escape \\ud800, which JSON parsers accept) is a 400, not a tokenizer failure."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"{param} holds a lone UTF-16 surrogate ({text[exc.start]!r} at character {exc.start} of "
                       "the prompt); send valid Unicode text", param=param, code="invalid_unicode") from None
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


async def prepare(state: ServerState, job: GenerationRequest) -> Prepared:
    """Validates the request, renders the prompt and builds its constraints; raises APIError."""
    deadline = asyncio.get_running_loop().time() + state.request_timeout if state.request_timeout else None
    f, choice = job.fields, job.tool_choice
    cap = state.max_tokens_cap
    if cap is not None and job.max_tokens is not None and job.max_tokens > cap:
        # refused, not clamped: a client that asked for more would read a silent cut as the model's own end
        raise APIError(f"{f.max_tokens} is {job.max_tokens}, above this server's cap of {cap} output tokens "
                       f"(--max-tokens-cap); ask for at most {cap}", param=f.max_tokens, code="max_tokens_exceeded")
    names = [tool["function"]["name"] for tool in job.tools or []]
    if choice.mode != "none" and not names:
        raise APIError(f"tool_choice {choice.mode!r} needs tools; send the tools the model may call",
                       param=f.tool_choice)
    if choice.mode == "named" and choice.name not in names:
        raise APIError(f"tool_choice names tool {choice.name!r}, which is not among the tools {names}",
                       param=f.tool_name)
    if choice.mode != "none" and job.output_format is not None:
        raise APIError(f"{f.format} cannot be combined with tool calls; send tool_choice 'none' or drop "
                       f"{f.format}", param=f.format)
    prompt_ids, thinking_open = await asyncio.to_thread(prompt_ids_of, state, job)
    if not prompt_ids:  # the engine cannot prefill nothing
        raise APIError("the prompt is empty (0 tokens); send at least one token of prompt", param=f.messages,
                       code="empty_prompt")
    room = state.context_length - len(prompt_ids)
    too_long = state.engine.scheduler.never_fits(len(prompt_ids))
    if too_long is not None:
        raise APIError(too_long, param=f.messages, code="context_length_exceeded")
    if room <= 0:
        raise APIError(f"the prompt is {len(prompt_ids)} tokens, the model's context is {state.context_length}; "
                       "shorten it", param=f.messages, code="context_length_exceeded")
    budget = job.max_tokens
    if budget is not None and budget > room:
        raise APIError(f"{f.max_tokens} {budget} + prompt {len(prompt_ids)} tokens exceed the context of "
                       f"{state.context_length}; ask for at most {room}", param=f.max_tokens,
                       code="context_length_exceeded")
    bias = job.sampling.logit_bias
    if any(token >= state.vocabulary.size or token < 0 for token in bias):
        outside = next(t for t in bias if t >= state.vocabulary.size or t < 0)
        raise APIError(f"{f.logit_bias}: token id {outside} is outside the vocabulary [0, {state.vocabulary.size})",
                       param=f.logit_bias)
    default = min(n for n in (room, state.default_max_tokens, cap) if n)  # the cap bounds the default too
    params = replace(job.sampling, max_tokens=budget or default)
    requests, pending, keep = [], [], frozenset()
    call = await build_tool_call(state, job.tools, choice, job.parallel_tool_calls, f) if choice.mode != "none" else None
    for row in range(job.n):  # each row has its own constraint state; the calls' parts are built once
        constraint = None
        row_params = params if params.seed is None else replace(params, seed=params.seed + row)  # n distinct rows
        if call is not None:
            pending.append(PendingTools(call, call.row(), f))
            constraint, keep = pending[-1].constraint, call.keep
        elif job.output_format is not None:
            constraint = await build_format_constraint(state, job.output_format, f)
            check_budget(constraint, budget, room, f)
            prime(constraint, min(row_params.max_tokens, room))
        requests.append(Request(prompt_ids=prompt_ids, params=row_params, constraint=constraint,
                                keep_special_ids=keep))
    return Prepared(requests, reads_tools=choice.mode != "none", thinking_open=thinking_open, budget=budget,
                    room=room, pending=pending, fields=f, check=_output_check(job), deadline=deadline)


def _output_check(job: GenerationRequest) -> OutputCheck:
    tools = {t["function"]["name"]: t["function"].get("parameters") or {} for t in job.tools or []} \
        if job.tool_choice.mode != "none" else None
    fmt = job.output_format
    if fmt is None:
        return OutputCheck(tools)
    schema = fmt.schema if fmt.kind == "json_schema" and fmt.strict is not False else None
    return OutputCheck(tools, schema, fmt.kind, pattern=fmt.pattern, choices=fmt.choices)


async def start(state: ServerState, prepared: Prepared) -> list:
    """Submits every request (prompts prefill while units compile), then waits for the units: a unit
    that fails, or a budget below the minimum, cancels them and raises the 400. Returns each
    request's engine event iterator."""
    generated = []
    try:
        for request in prepared.requests:
            generated.append(state.engine.generate(request))  # a full queue is a 429 here
        try:
            async with asyncio.timeout_at(prepared.deadline):  # units queued behind many compiles
                await prepared.settle(state)
        except TimeoutError:
            raise APIError(f"the request's tool grammars were still compiling at this server's limit of "
                           f"{state.request_timeout:g} s (--request-timeout); retry later (compiled units "
                           "are kept) or add --grammar-workers", status=504, code="timeout") from None
    except BaseException:
        for request in prepared.requests:
            state.engine.cancel(request.request_id)
        raise
    state.engine.wake()
    return generated


def prime(constraint, budget: int) -> None:
    """Makes the first step's mask of a fresh constraint now, before the request is submitted and
    its prompt prefilled: the memos it fills are shared, so the engine's first step reads them (on a
    grammar's first request that step took 100-180 µs, replayed on SmolLM2; 60-80 primed). The
    constraint's own state is left as it was."""
    forced = constraint.budget_forced
    sparse = constraint.sparse_mask(budget)
    constraint.budget_forced = forced
    if sparse is not None:
        sparse.address  # noqa: B018 - made once per mask: where the pick reads its ids


def check_budget(constraint, budget: int | None, room: int, f: Fields) -> None:
    """A budget below the constraint's shortest valid output is a 400 stating that minimum."""
    if constraint is None:
        return
    minimum = constraint.min_tokens()
    if budget is not None and budget < minimum:
        raise APIError(f"{f.max_tokens} is {budget}, but the shortest output valid under this request's "
                       f"tool choice / output format is {minimum} tokens; ask for at least {minimum}",
                       param=f.max_tokens, code="budget_too_small")
    if budget is None and room < minimum:
        raise APIError(f"the context leaves {room} tokens after the prompt, but the shortest output valid "
                       f"under this request's tool choice / output format is {minimum} tokens; shorten "
                       "the messages", param=f.messages, code="context_length_exceeded")

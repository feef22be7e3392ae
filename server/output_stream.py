"""The one stream of output every API reads: engine events become reasoning, text and tool-call parts.

Each engine event becomes one `Step`: its parts in output order (`Reasoning`, `Content`, and for
each call `CallStart`, `ArgsDelta`s, `CallEnd`), its tokens' logprobs, and on the last step the
`Finish`. Streaming adapters translate steps as they come; non-streaming ones `collect` the same
steps, so a streamed answer and a non-streamed one for the same seed are the same by construction.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass, field
from typing import AsyncIterator, Union

from grammars import ArgsDelta, CallEnd, CallStart, Content
from server.errors import APIError
from server.generation import Prepared
from server.state import ServerState
from server.tool_calls import tool_format_of

log = logging.getLogger("maskd.server")


@dataclass(frozen=True)
class Reasoning:
    """Thinking text (the model's `<think>` block), never part of the answer or of a call."""
    text: str


Part = Union[Reasoning, Content, CallStart, ArgsDelta, CallEnd]


@dataclass
class Finish:
    reason: str  # stop | length | tool_calls | stop_sequence | cancelled | error
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    budget_forced: bool | None = None  # set for constrained requests (README: maskd_budget_forced)
    stop_string: str | None = None  # the stop sequence that ended the output
    error: str | None = None
    timed_out: bool = False  # the error is the request's deadline (--request-timeout), not a failure
    api_error: APIError | None = None  # the error to answer with as it is (a tool's unit failed: a 400)


def failure(finish: Finish) -> APIError:
    """What a request that ended in an error is answered with: its own APIError, a 504 past its
    deadline, else a 500."""
    if finish.api_error is not None:
        return finish.api_error
    if finish.timed_out:
        return APIError(finish.error, status=504, type="timeout_error", code="request_timeout")
    return APIError(f"generation failed: {finish.error}", status=500, type="server_error")


@dataclass
class Step:
    parts: list[Part]
    token_ids: list[int]
    logprobs: list | None = None  # engine TokenLogprob per token, when asked for
    finish: Finish | None = None


async def steps(state: ServerState, prepared: Prepared, events, row: int = 0) -> AsyncIterator[Step]:
    """The steps of one engine request; closing early cancels it (also before its first event). Past
    the request's deadline the engine request is cancelled and the last step is a timed-out error."""
    splitter = prepared.splitter()
    parser = tool_format_of(state).stream_parser() if prepared.reads_tools else None
    calls: dict[int, Call] = {}
    content: list[str] = []
    counts = (len(prepared.requests[row].prompt_ids), 0, 0)  # prompt, completion, cached: as of the last event
    try:
        while True:
            try:
                async with asyncio.timeout_at(prepared.deadline):  # None: no deadline
                    event = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError:  # the engine's iterator was cancelled at its wait, which cancels the request
                message = f"the request ran past this server's limit of {state.request_timeout:g} s " \
                          "(--request-timeout) and was cancelled; ask for fewer tokens or retry later"
                yield Step([], [], None, Finish("error", *counts, error=message, timed_out=True))
                return
            counts = (event.prompt_tokens, event.completion_tokens, event.cached_tokens)
            final = event.finish_reason is not None
            if prepared.failure is not None and (not final or event.finish_reason == "cancelled"):
                error = prepared.failure  # a tool's unit failed while the request ran ahead of its units
                yield Step([], [], None, Finish("error", *counts, error=error.message, api_error=error))
                return
            reasoning, answer = splitter.feed(event.text, final=final)
            parts: list[Part] = [Reasoning(reasoning)] if reasoning else []
            if parser is None:
                parts += [Content(answer)] if answer else []
            else:
                parsed = parser.feed(answer) if answer else []
                parts += [p for p in parsed + (parser.close() if final else [])
                          if not (isinstance(p, Content) and not p.text)]
            finish = _finish(event, bool(calls) or any(isinstance(p, CallStart) for p in parts),
                             prepared.constrained) if final else None
            invalid = _check(prepared, parts, calls, content, finish)
            if invalid is not None:  # withheld: an error takes the place of the rest
                yield Step([], [], None, Finish("error", *counts, error=invalid))
                return
            yield Step(parts, list(event.token_ids), event.logprobs, finish)
    finally:
        state.engine.cancel(prepared.requests[row].request_id)  # a no-op once it finished


def _check(prepared: Prepared, parts: list[Part], calls: dict, content: list[str], finish: Finish | None) -> str | None:
    """Validates each call as it ends and a structured output at its end; the reason if one fails.
    An output cut by the budget (finish `length`) is reported as cut, not checked."""
    cut = finish is not None and finish.reason == "length"
    for part in parts:
        if isinstance(part, CallStart):
            calls[part.index] = Call(part.name)
        elif isinstance(part, ArgsDelta):
            calls[part.index].arguments.append(part.text)
        elif isinstance(part, CallEnd) and not cut:
            failure = prepared.check.call(calls[part.index].name, "".join(calls[part.index].arguments))
            if failure is not None:
                return failure
        elif isinstance(part, Content):
            content.append(part.text)
    if finish is not None and finish.reason in ("stop", "stop_sequence") and prepared.constrained \
            and not prepared.reads_tools:
        return prepared.check.text("".join(content))
    return None


def _finish(event, has_calls: bool, constrained: bool) -> Finish:
    reason = event.finish_reason
    stop_string = event.stop_string
    if reason == "stop" and has_calls:
        reason = "tool_calls"
    elif reason == "stop" and stop_string is not None:
        reason = "stop_sequence"
    error = None
    if event.error:  # the engine's exception text stays in the log; the client gets an incident id
        incident = secrets.token_hex(8)
        log.error("request failed in the engine, incident %s: %s", incident, event.error)
        error = f"the engine failed on this request (incident {incident}); the server log has the details"
    return Finish(reason, event.prompt_tokens, event.completion_tokens, event.cached_tokens,
                  event.budget_forced if constrained else None, stop_string, error)


@dataclass
class Call:
    name: str
    arguments: list[str] = field(default_factory=list)

    @property
    def arguments_text(self) -> str:
        return "".join(self.arguments) or "{}"


@dataclass
class Collected:
    """A whole answer: what a non-streamed response is built from."""
    content: str
    reasoning: str
    calls: list[Call]
    logprobs: list
    finish: Finish


async def collect(stream: AsyncIterator[Step]) -> Collected:
    """Reads a step stream to its end; a failed generation raises a 500 APIError."""
    content, reasoning, calls, logprobs, finish = [], [], {}, [], None
    try:
        async for step in stream:
            for part in step.parts:
                if isinstance(part, Content):
                    content.append(part.text)
                elif isinstance(part, Reasoning):
                    reasoning.append(part.text)
                elif isinstance(part, CallStart):
                    calls[part.index] = Call(part.name)
                elif isinstance(part, ArgsDelta):
                    calls[part.index].arguments.append(part.text)
            logprobs += step.logprobs or []
            finish = step.finish or finish
    finally:
        await stream.aclose()  # a cancelled request (client gone) cancels its engine request now
    if finish.reason == "error":
        raise failure(finish)
    return Collected("".join(content), "".join(reasoning), [calls[i] for i in sorted(calls)], logprobs, finish)


async def merged(streams: list[AsyncIterator[Step]]) -> AsyncIterator[tuple[int, Step]]:
    """(row, step) pairs of n step streams as they come; closing it closes (cancels) every row."""
    if len(streams) == 1:
        try:
            async for step in streams[0]:
                yield 0, step
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(row: int, stream: AsyncIterator[Step]) -> None:
        try:
            async for step in stream:
                await queue.put((row, step))
        finally:
            await queue.put((row, None))

    tasks = [asyncio.create_task(pump(row, stream)) for row, stream in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            row, step = await queue.get()
            if step is None:
                left -= 1
            else:
                yield row, step
    finally:
        for task in tasks:
            task.cancel()

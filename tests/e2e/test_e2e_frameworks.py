"""End to end: popular agent frameworks make one real tool-calling turn against the live server.

Each test drives a real SDK (no mocks) at the session's `maskd serve` through the OpenAI
chat-completions API, forces a call (tool_choice `required` or a named tool, since the model is tiny),
and checks that the call is valid: the right tool name, and arguments that parse as JSON and
validate against the schema the framework sent (or that the framework's own typed parsing accepts).

Nothing may leave 127.0.0.1: telemetry and hub access are switched off by environment, and an audit
hook fails the test (and refuses the connection) if any framework still resolves or connects to
another host. Client timeouts are long (30 min): a busy machine makes the tests slow, never wrong.
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import jsonschema
import pytest

MODEL = "smollm2-135m-instruct"
TIMEOUT = 1800  # seconds, for every client
MAX_TOKENS = 64
ASK = "What is the weather in Paris?"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                 "parameters": WEATHER}}
QUIET_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else litellm fetches its price list from GitHub on import
    "LITELLM_TELEMETRY": "False",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
}

# --- a guard that nothing but the local server is reached -------------------------------------------

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_guard = {"on": False, "seen": []}


def _audit(event, args):
    if not _guard["on"] or event not in ("socket.getaddrinfo", "socket.connect"):
        return
    host = args[0] if event == "socket.getaddrinfo" else args[1]
    if event == "socket.connect":
        if not isinstance(host, tuple):
            return  # a unix socket
        host = host[0]
    host = host.decode() if isinstance(host, bytes) else host
    if host is not None and host not in LOOPBACK:
        _guard["seen"].append(f"{event} {host}")
        raise OSError(f"test_e2e_frameworks: network access to {host!r} is not allowed")


sys.addaudithook(_audit)  # process-wide and permanent, so it acts only while _guard["on"]


@pytest.fixture(scope="module", autouse=True)
def quiet_env():
    with pytest.MonkeyPatch.context() as patch:
        for key, value in QUIET_ENV.items():
            patch.setenv(key, value)
        yield


@pytest.fixture(autouse=True)
def local_only(quiet_env):
    _guard["seen"].clear()
    _guard["on"] = True
    try:
        yield
    finally:
        _guard["on"] = False
    assert not _guard["seen"], f"a framework tried to reach the network: {_guard['seen']}"


@pytest.fixture
def base_url(server_url):
    return f"{server_url}/v1"


def valid_args(arguments, schema) -> dict:
    """The arguments (a JSON string or an already parsed dict), checked against the schema."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert isinstance(args, dict), f"arguments are not a JSON object: {arguments!r}"
    jsonschema.validate(args, schema)
    return args


# --- LangChain ---------------------------------------------------------------------------------------

def test_langchain_streamed_named_tool_choice_gives_one_valid_call(base_url):
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=MODEL, base_url=base_url, api_key="unused", temperature=0, max_tokens=MAX_TOKENS,
                     timeout=TIMEOUT, max_retries=0)
    message = None
    for chunk in llm.bind_tools([get_weather], tool_choice="get_weather").stream(ASK):
        message = chunk if message is None else message + chunk
    assert not message.invalid_tool_calls
    assert message.response_metadata["finish_reason"] == "tool_calls"
    schema = convert_to_openai_tool(get_weather)["function"]["parameters"]
    for call in message.tool_call_chunks:
        assert call["name"] == "get_weather"
        valid_args(call["args"], schema)
    # A named tool_choice means exactly one call, even with parallel_tool_calls left unset (the server's
    # rule since ebc71ad; before it the model added a second call after the named one).
    assert len(message.tool_calls) == 1, f"named tool_choice gave {len(message.tool_calls)} calls: {message.tool_calls}"


# --- LiteLLM -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_litellm_required_tool_call(base_url, stream):
    import litellm
    litellm.telemetry = False
    litellm.suppress_debug_info = True

    messages = [{"role": "user", "content": ASK}]
    kwargs = dict(model=f"openai/{MODEL}", api_base=base_url, api_key="unused", messages=messages,
                  tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_TOKENS,
                  temperature=0, timeout=TIMEOUT, num_retries=0)
    if stream:
        reply = litellm.stream_chunk_builder(list(litellm.completion(stream=True, **kwargs)), messages=messages)
    else:
        reply = litellm.completion(**kwargs)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls, f"no tool call, content {choice.message.content!r}"
    for call in choice.message.tool_calls:
        assert call.function.name == "get_weather"
        valid_args(call.function.arguments, WEATHER)


# --- instructor --------------------------------------------------------------------------------------

def test_instructor_tools_mode_returns_the_response_model(base_url):
    # Not in the dev extra: every instructor release caps jiter<0.15, which holds openai at <=3.3.0,
    # and openai 3.3's chat.completions.stream() refuses non-strict tools (test_e2e_tools breaks).
    instructor = pytest.importorskip("instructor", reason="instructor is not installed (see the comment)")
    from openai import OpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: str

    client = instructor.from_openai(OpenAI(base_url=base_url, api_key="unused", timeout=TIMEOUT, max_retries=0),
                                    mode=instructor.Mode.TOOLS)
    city, completion = client.chat.completions.create_with_completion(
        model=MODEL, response_model=City, max_retries=0, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "user", "content": "Which city is the capital of France?"}])
    assert isinstance(city, City)
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "City"
    valid_args(call.function.arguments, City.model_json_schema())


# --- pydantic-ai -------------------------------------------------------------------------------------

def pydantic_ai_model(base_url):
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    client = AsyncOpenAI(base_url=base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)
    return OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))


def test_pydantic_ai_agent_calls_its_tool(base_url):
    from dataclasses import dataclass

    from pydantic_ai import Agent, Tool
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.settings import ModelSettings

    calls = []

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return "sunny"

    @dataclass
    class ToolFirst(AbstractCapability):
        """pydantic-ai's way to vary tool_choice per step: a call on step 1, then text only."""
        def get_model_settings(self):
            return lambda ctx: ModelSettings(tool_choice="required" if ctx.run_step <= 1 else "none")

    tool = Tool(get_weather)
    agent = Agent(pydantic_ai_model(base_url), tools=[tool], retries=0, capabilities=[ToolFirst()],
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0, parallel_tool_calls=False))
    result = agent.run_sync(ASK)
    parts = [part for message in result.all_messages() if isinstance(message, ModelResponse)
             for part in message.parts if isinstance(part, ToolCallPart)]
    assert parts and all(part.tool_name == "get_weather" for part in parts)
    for part in parts:
        valid_args(part.args, tool.tool_def.parameters_json_schema)
    assert len(calls) == len(parts) and all(isinstance(city, str) for city in calls)
    assert isinstance(result.output, str)


def test_pydantic_ai_structured_output(base_url):
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.settings import ModelSettings

    class City(BaseModel):
        name: str
        country: str

    agent = Agent(pydantic_ai_model(base_url), output_type=City, retries=0,
                  model_settings=ModelSettings(max_tokens=MAX_TOKENS, temperature=0))
    result = agent.run_sync("Which city is the capital of France?")
    assert isinstance(result.output, City)


# --- smolagents --------------------------------------------------------------------------------------

def test_smolagents_tool_calling_agent_calls_its_tool(base_url):
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool
    from smolagents.memory import ActionStep
    from smolagents.models import get_tool_json_schema
    from smolagents.monitoring import LogLevel

    calls = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return "sunny"

    # Model kwargs override what the agent sends: name the tool, or the model may pick final_answer.
    model = OpenAIServerModel(model_id=MODEL, api_base=base_url, api_key="unused",
                              client_kwargs={"timeout": TIMEOUT, "max_retries": 0}, max_tokens=MAX_TOKENS,
                              temperature=0, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    agent = ToolCallingAgent(tools=[get_weather], model=model, max_steps=1, verbosity_level=LogLevel.OFF)
    # Streamed steps, stopped after the first action: with max_steps reached the agent would ask
    # for a final answer without tools, which a named tool_choice rightly refuses.
    step = next(s for s in agent.run(ASK, stream=True) if isinstance(s, ActionStep))
    assert step.error is None, step.error
    assert step.tool_calls and all(call.name == "get_weather" for call in step.tool_calls)
    schema = get_tool_json_schema(get_weather)["function"]["parameters"]
    for call in step.tool_calls:
        valid_args(call.arguments, schema)
    assert len(calls) == len(step.tool_calls)


# --- OpenAI Agents SDK -------------------------------------------------------------------------------

def agents_sdk_run(model_factory):
    """One Runner.run with a required function tool; returns (result, recorded calls, the tool)."""
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    set_tracing_disabled(True)
    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return "sunny"

    agent = Agent(name="weather", instructions="Answer with the tools.", tools=[get_weather],
                  model=model_factory(), tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_TOKENS,
                                               temperature=0))
    result = asyncio.run(Runner.run(agent, ASK, max_turns=1))
    return result, calls, get_weather


def assert_agents_sdk_called(result, calls, tool):
    from agents.items import ToolCallItem
    items = [item for item in result.new_items if isinstance(item, ToolCallItem)]
    assert items and all(item.raw_item.name == "get_weather" for item in items)
    for item in items:
        valid_args(item.raw_item.arguments, tool.params_json_schema)
    assert calls and all(isinstance(city, str) for city in calls)
    assert result.final_output == "sunny"  # stop_on_first_tool: the tool's own output


def test_openai_agents_chat_completions_calls_function_tool(base_url):
    from agents import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    def model():
        client = AsyncOpenAI(base_url=base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)
        return OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    assert_agents_sdk_called(*agents_sdk_run(model))


@pytest.fixture
def responses_api(server_url):
    """Skips while the server has no POST /v1/responses (a 404: the model is served, so only a missing
    route gives one). pytest.mark.skipif cannot ask: the server starts after collection."""
    reply = httpx.post(f"{server_url}/v1/responses", timeout=TIMEOUT,
                       json={"model": MODEL, "input": "Hi", "max_output_tokens": 1})
    if reply.status_code == 404:
        pytest.skip("the server has no POST /v1/responses yet")


def test_openai_agents_responses_api_calls_function_tool(base_url, responses_api):
    from agents import OpenAIResponsesModel
    from openai import AsyncOpenAI

    def model():
        client = AsyncOpenAI(base_url=base_url, api_key="unused", timeout=TIMEOUT, max_retries=0)
        return OpenAIResponsesModel(model=MODEL, openai_client=client)
    assert_agents_sdk_called(*agents_sdk_run(model))

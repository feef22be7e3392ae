"""A ReAct-style agent loop: the model calls two local Python tools through maskd until it answers.

    make serve            # in one terminal
    .venv/bin/python examples/react_agent.py "What is the weather in Paris, and what is 17 + 25?"

The first turn requires a tool call; later turns let the model choose (tool_choice "auto") until it
replies in text or the step limit is reached. Every call the server returns is valid against the
tool's schema, so the arguments are passed to the Python functions without any repair.
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI


def get_weather(city: str, unit: str = "celsius") -> dict:
    """A stand-in weather service."""
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit, "sky": "clear"}


def add(a: int, b: int) -> int:
    return a + b


PYTHON_TOOLS = {"get_weather": get_weather, "add": add}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]


def run(question: str, base_url: str, model: str | None, max_steps: int = 4) -> str:
    client = OpenAI(base_url=base_url, api_key="unused")
    model = model or client.models.list().data[0].id
    messages = [{"role": "system", "content": "Use the tools to answer. Answer briefly."},
                {"role": "user", "content": question}]
    for step in range(max_steps):
        reply = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice="required" if step == 0 else "auto",
            parallel_tool_calls=False, max_tokens=120, temperature=0)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            result = PYTHON_TOOLS[call.function.name](**json.loads(call.function.arguments))
            print(f"step {step}: {call.function.name}({call.function.arguments}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",
                                           max_tokens=120, temperature=0)
    return final.choices[0].message.content or ""


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("question", nargs="?", default="What is the weather in Paris?")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    print("answer:", run(args.question, args.base_url, args.model))

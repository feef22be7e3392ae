"""A ReAct agent through the Anthropic Messages API: the anthropic SDK, maskd, and two real local tools.

    make serve            # in one terminal
    .venv/bin/python examples/claude_style_agent.py "What is 12 * (7 + 5)? Then find where Fields is defined."

Tools: `calculate` evaluates arithmetic (numbers, + - * / ** and parentheses; nothing else is run)
and `search_files` greps this repository's Python and Markdown files for a literal string. The first
turn must call a tool (tool_choice "any"); later turns let the model choose ("auto") until it answers
in text or the step limit is reached. Each step prints the tool_use block and what the tool returned;
the inputs are valid against the tools' schemas by construction, so they go to Python unrepaired.
A small model (the default SmolLM2-135M) picks tools and arguments poorly; the loop shows the
mechanics, a 7-8B model gives sensible answers.
"""

from __future__ import annotations

import argparse
import ast
import operator
from pathlib import Path

import anthropic

ROOT = Path(__file__).resolve().parent.parent
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """Arithmetic only: the expression's syntax tree is walked, never eval()'d."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / ** and parentheses are allowed")
    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"


def search_files(query: str, max_results: int = 5) -> str:
    """Lines of the repository's .py and .md files that contain `query` (path:line: text)."""
    if not query.strip():
        return "error: the query is empty"
    hits = []
    for path in sorted(ROOT.rglob("*")):
        if path.suffix not in (".py", ".md") or ".venv" in path.parts or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if query in line:
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
                if len(hits) >= max_results:
                    return "\n".join(hits)
    return "\n".join(hits) or "no matches"


PYTHON_TOOLS = {"calculate": calculate, "search_files": search_files}
TOOLS = [
    {"name": "calculate", "description": "Evaluate an arithmetic expression such as 12 * (7 + 5)",
     "input_schema": {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 80}},
                      "required": ["expression"], "additionalProperties": False}},
    {"name": "search_files", "description": "Find lines containing a string in this repository's code and docs",
     "input_schema": {"type": "object", "properties": {
         "query": {"type": "string", "minLength": 1, "maxLength": 60},
         "max_results": {"type": "integer", "minimum": 1, "maximum": 20}},
         "required": ["query"], "additionalProperties": False}},
]


def run(question: str, base_url: str, model: str | None = None, max_steps: int = 4) -> str:
    client = anthropic.Anthropic(base_url=base_url, api_key="unused")
    model = model or client.models.list().data[0].id
    messages = [{"role": "user", "content": question}]
    greedy = {"temperature": 0}  # the SDK no longer has sampling arguments; maskd reads them from the body
    for step in range(max_steps):
        reply = client.messages.create(
            model=model, max_tokens=200, system="Use the tools to answer. Answer briefly.", messages=messages,
            tools=TOOLS, tool_choice={"type": "any" if step == 0 else "auto", "disable_parallel_tool_use": True},
            extra_body=greedy)
        messages.append({"role": "assistant", "content": reply.content})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return "".join(block.text for block in reply.content if block.type == "text")
        results = []
        for use in uses:
            result = PYTHON_TOOLS[use.name](**use.input)
            print(f"step {step}: {use.name}({use.input}) -> {result!r}")
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": result})
        messages.append({"role": "user", "content": results})
    final = client.messages.create(model=model, max_tokens=200, messages=messages, tools=TOOLS,
                                   tool_choice={"type": "none"}, extra_body=greedy)
    return "".join(block.text for block in final.content if block.type == "text")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("question", nargs="?", default="What is 12 * (7 + 5)?")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    print("answer:", run(args.question, args.base_url, args.model))

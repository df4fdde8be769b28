"""Arithmetic with a calculator tool: the model may call `calculator` before it answers.

A tool call is the Hermes/Qwen form the chat templates of tool-using models emit:
<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>. The tool's
reply comes back as a `tool` message; a turn with no tool call is the answer, scored 1 if its
first integer is right. Tool latency can be injected (`latency_s`, `latency_sigma`: lognormal
sleeps) to model slow tools; the sleep is async, so other episodes keep running meanwhile.
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import random
import re

from flashq.envs.base import StepResult

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
NUMBER = re.compile(r"-?\d+")
SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an integer arithmetic expression with + - * and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}


def evaluate(expression: str) -> int:
    """Integer arithmetic only: no names, calls or attribute access, so model output is safe."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"unsupported expression element {type(node).__name__}")

    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    return ev(ast.parse(expression, mode="eval"))


class CalculatorMathEnv:
    def __init__(self, max_value: int = 99, max_turns: int = 4, latency_s: float = 0.0, latency_sigma: float = 1.0):
        self.max_value, self.max_turns = max_value, max_turns
        self.latency_s, self.latency_sigma = latency_s, latency_sigma
        self.rng = random.Random()
        self.answer, self.turns = 0, 0

    def tools(self) -> list[dict]:
        return [SCHEMA]

    def reset(self, task: dict, seed: int) -> list[dict]:
        rng = random.Random(seed)
        a, b, c = (rng.randint(2, self.max_value) for _ in range(3))
        self.answer, self.turns, self.rng = a * b + c, 0, random.Random(f"latency:{seed}:{id(self)}")
        return [{"role": "user", "content": f"{a}*{b}+{c}=?"}]

    async def step(self, assistant: dict) -> StepResult:
        self.turns += 1
        content = assistant.get("content") or ""
        call = TOOL_CALL.search(content)
        if call is None:
            found = NUMBER.search(content)
            reward = 1.0 if found and int(found.group()) == self.answer else 0.0
            return StepResult([], reward=reward, terminated=True, info={"turns": self.turns})
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s * self.rng.lognormvariate(0.0, self.latency_sigma))
        try:
            request = json.loads(call.group(1))
            if request.get("name") != "calculator":
                raise ValueError(f"unknown tool {request.get('name')!r}")
            reply = str(evaluate(str(request["arguments"]["expression"])))
        except (ValueError, KeyError, TypeError, SyntaxError, AttributeError, RecursionError) as e:
            reply = f"error: {type(e).__name__}: {e}"
        if self.turns >= self.max_turns:
            return StepResult([], truncated=True, info={"turns": self.turns})
        return StepResult([{"role": "tool", "content": reply, "tool_call_id": f"call-{self.turns}"}])

    def demonstration(self, task: dict, seed: int) -> list[dict]:
        """A warm-start conversation: half the time the calculator is called and its result
        copied, half the time the model answers at once with a plausible wrong number, so that
        RL has a choice to learn (use the tool)."""
        question = self.reset(task, seed)
        rng = random.Random(f"demo:{seed}")
        if rng.random() < 0.5:
            call = json.dumps({"name": "calculator", "arguments": {"expression": question[0]["content"].removesuffix("=?")}})
            return [*question, {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
                    {"role": "tool", "content": str(self.answer), "tool_call_id": "call-1"},
                    {"role": "assistant", "content": str(self.answer)}]
        return [*question, {"role": "assistant", "content": str(self.answer + rng.choice([-10, -1, 1, 10]))}]

"""The built-in calculator task (flashq.envs.calculator) written as an agent against the OpenAI
client, the way agents are written anywhere: flashq serves it the policy through an
OpenAI-compatible endpoint and trains on exactly the tokens it sampled.

    flashq launch configs/agent_calculator.yaml

`task` is the task source's task with the episode's `seed`; the same seed gives the same
question as the environment class, so the two can be compared like for like.
"""

from __future__ import annotations

import json

from flashq.envs.calculator import NUMBER, SCHEMA, CalculatorMathEnv, evaluate


async def agent(task: dict, client) -> float:
    env = CalculatorMathEnv(max_value=task.get("max_value", 9))
    messages = env.reset(task, task["seed"])
    for _ in range(task.get("max_turns", 3)):
        reply = await client.chat.completions.create(model="flashq-policy", messages=messages, tools=[SCHEMA], max_tokens=96)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:  # the answer
            found = NUMBER.search(message.content or "")
            return 1.0 if found and int(found.group()) == env.answer else 0.0
        for call in message.tool_calls:
            try:
                result = str(evaluate(str(json.loads(call.function.arguments)["expression"])))
            except (ValueError, KeyError, TypeError, SyntaxError, RecursionError) as e:
                result = f"error: {type(e).__name__}: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0  # out of turns

"""Guess the number: a multi-turn game whose reward needs the model to use what it is told.

The environment picks a secret in [1, high] from the seed (a group's episodes share it) and
answers each guess with "higher" or "lower". Reward 1 for finding it within `max_turns` guesses.
Guessing at random finds it about half the time; using the answers (binary search) always.
"""

from __future__ import annotations

import random
import re

from flashq.envs.base import StepResult

NUMBER = re.compile(r"-?\d+")


class GuessNumberEnv:
    def __init__(self, high: int = 8, max_turns: int = 4):
        if high < 2 or max_turns < 1:
            raise ValueError("GuessNumberEnv needs high >= 2 and max_turns >= 1")
        self.high, self.max_turns = high, max_turns
        self.secret, self.turns = 0, 0

    def reset(self, task: dict, seed: int) -> list[dict]:
        self.secret, self.turns = random.Random(seed).randint(1, self.high), 0
        return [{"role": "user", "content": f"guess 1-{self.high}"}]

    def step(self, assistant: dict) -> StepResult:
        self.turns += 1
        found = NUMBER.search(assistant.get("content") or "")
        guess = int(found.group()) if found else None
        if guess == self.secret:
            return StepResult([], reward=1.0, terminated=True, info={"turns": self.turns})
        if self.turns >= self.max_turns:
            return StepResult([], reward=0.0, truncated=True, info={"turns": self.turns, "secret": self.secret})
        reply = "?" if guess is None else ("higher" if guess < self.secret else "lower")
        return StepResult([{"role": "user", "content": reply}])

    def demonstration(self, task: dict, seed: int) -> list[dict]:
        """A warm-start conversation: random guesses that respect the format, not the hints."""
        self.reset(task, seed)
        rng = random.Random(f"demo:{seed}")
        messages = [{"role": "user", "content": f"guess 1-{self.high}"}]
        while True:
            guess = rng.randint(1, self.high)
            messages.append({"role": "assistant", "content": str(guess)})
            result = self.step(messages[-1])
            if result.terminated or result.truncated:
                return messages
            messages += result.messages

"""Existing environment libraries behind flashq's protocol: Gymnasium text envs, GEM-style
five-tuple envs, and textarena games. Each is named in config like any environment, e.g.

    env:
      name: flashq.envs.adapters:GymnasiumTextEnv
      kwargs: {env_id: FrozenLake-v1, actions: [left, down, right, up], make_kwargs: {is_slippery: false}}

Their methods are synchronous, so flashq runs them in threads (see `flashq.envs.base`).
"""

from __future__ import annotations

import re
from typing import Any

from flashq.envs.base import StepResult, load_env_class


class GymnasiumTextEnv:
    """A Gymnasium env with a discrete action space and an "ansi" text rendering. The model names
    an action by word (`actions[i]` is action i); the reply is the new rendering."""

    def __init__(self, env_id: str, actions: list[str], make_kwargs: dict[str, Any] | None = None, max_turns: int = 20,
                 instruction: str = ""):
        import gymnasium

        self.env = gymnasium.make(env_id, render_mode="ansi", **(make_kwargs or {}))
        n = getattr(self.env.action_space, "n", None)
        if n is None or len(actions) != n:
            raise ValueError(f"{env_id}: give one action word per discrete action ({n}), got {len(actions)}")
        self.actions = [a.lower() for a in actions]
        self.pattern = re.compile(r"\b(" + "|".join(map(re.escape, self.actions)) + r")\b", re.I)
        self.max_turns, self.instruction, self.turns = max_turns, instruction, 0

    def _board(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", str(self.env.render())).strip()  # drop ANSI colours

    def reset(self, task: dict, seed: int) -> list[dict]:
        self.env.reset(seed=seed)
        self.turns = 0
        head = self.instruction or f"actions: {', '.join(self.actions)}"
        return [{"role": "user", "content": f"{head}\n{self._board()}"}]

    def step(self, assistant: dict) -> StepResult:
        self.turns += 1
        found = self.pattern.search(assistant.get("content") or "")
        if found is None:
            reward, terminated, truncated, reply = 0.0, False, False, f"? ({', '.join(self.actions)})"
        else:
            _, reward, terminated, truncated, _ = self.env.step(self.actions.index(found.group(1).lower()))
            reply = self._board()
        truncated = bool(truncated) or (not terminated and self.turns >= self.max_turns)
        return StepResult([] if terminated or truncated else [{"role": "user", "content": reply}],
                          reward=float(reward), terminated=bool(terminated), truncated=truncated)

    def close(self) -> None:
        self.env.close()


class FiveTupleEnv:
    """GEM-style: `reset(seed=...) -> (observation, info)`, `step(action: str) -> (observation,
    reward, terminated, truncated, info)` with text observations. `env` names the class."""

    def __init__(self, env: str, **kwargs):
        self.env = load_env_class(env)(**kwargs)

    def reset(self, task: dict, seed: int) -> list[dict]:
        observation, _ = self.env.reset(seed=seed)
        return [{"role": "user", "content": str(observation)}]

    def step(self, assistant: dict) -> StepResult:
        observation, reward, terminated, truncated, info = self.env.step(assistant.get("content") or "")
        done = bool(terminated) or bool(truncated)
        return StepResult([] if done else [{"role": "user", "content": str(observation)}], reward=float(reward),
                          terminated=bool(terminated), truncated=bool(truncated), info=dict(info or {}))

    def close(self) -> None:
        if hasattr(self.env, "close"):
            self.env.close()


class TextArenaEnv:
    """A single-player textarena game (`pip install flashq[games]`). textarena reports rewards
    only when the game closes, so the last step carries the whole reward. Its default
    observation is the whole transcript; the model is sent only what is new."""

    def __init__(self, env_id: str = "GuessTheNumber-v0"):
        import textarena

        self.env = textarena.make(env_id)
        self.seen = 0

    def _new_text(self) -> str:
        _, observation = self.env.get_observation()
        text = observation if isinstance(observation, str) else "\n".join(str(part[1]) for part in observation)
        new, self.seen = text[self.seen:], len(text)
        return new.strip()

    def reset(self, task: dict, seed: int) -> list[dict]:
        self.env.reset(num_players=1, seed=seed)
        self.seen = 0
        return [{"role": "user", "content": self._new_text()}]

    def step(self, assistant: dict) -> StepResult:
        done, info = self.env.step(assistant.get("content") or "")
        if not done:
            return StepResult([{"role": "user", "content": self._new_text()}])
        rewards, game_info = self.env.close()
        return StepResult([], reward=float((rewards or {}).get(0, 0.0)), terminated=True, info={"game": str(game_info)})

"""The rollout worker's side of agent episodes: the user's OpenAI-client function, run once per
episode against the worker's endpoint, and its trajectory sent back as one `Sample` (of several
segments when the agent rewrote its history and `env.on_rewrite` is split).

An agent is `async def agent(task, client) -> float | None` (or a plain function, run in a
thread with a synchronous client): `client` is an `openai.AsyncOpenAI` (`openai.OpenAI`) whose
base URL belongs to this episode alone. It returns the episode's reward, or None to have
`reward.function` score the last assistant message. An agent that raises, runs past
`env.agent_timeout_s`, or returns something else fails its episode; the worker goes on.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
from pathlib import Path

from flashq.agents.endpoint import AgentEndpoint
from flashq.agents.session import EpisodeSession
from flashq.agents.trajectory import Trajectory
from flashq.config import FlashqConfig
from flashq.envs.base import load_env_class
from flashq.episode import ChatRenderer
from flashq.jsonl import cut_torn_tail
from flashq.wire.protocol import EpisodeRequest, Sample


class AgentPlayer:
    def __init__(self, cfg: FlashqConfig, model_path: Path, engine):
        from transformers import AutoTokenizer

        from flashq.trainer.learner import stop_token_ids

        self.cfg, self.engine = cfg, engine
        self.agent = load_env_class(cfg.env.agent)
        self.is_async = inspect.iscoroutinefunction(self.agent)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.stop_ids = set(stop_token_ids(model_path))
        self.model_name = cfg.env.served_model_name
        self.endpoint = AgentEndpoint(self.model_name)
        self.tool_parser = None
        if cfg.env.tool_parser:
            from vllm.tool_parsers import ToolParserManager

            self.tool_parser = ToolParserManager.get_tool_parser(cfg.env.tool_parser)(self.tokenizer)
            # a malformed tool call is the policy's output, not a fault: the reply carries it as
            # text; vLLM's parsers log a traceback for each (302 in a 40-step calculator run)
            logging.getLogger(type(self.tool_parser).__module__).setLevel(logging.CRITICAL)
        self.audit = None
        if cfg.log.token_audit and cfg.log.run_dir is not None:
            path = Path(cfg.log.run_dir) / f"sampled-{engine.worker_index}.jsonl"
            cut_torn_tail(path)  # a worker killed mid-write: append after the last whole record
            self.audit = path.open("a", buffering=1)
        self.score = None
        if cfg.reward.function:
            from flashq.rewards import load_reward_fn

            self.score = load_reward_fn(cfg.reward.function)

    async def start(self) -> None:
        await self.endpoint.start()

    async def stop(self) -> None:
        await self.endpoint.stop()

    async def play(self, req: EpisodeRequest, worker: int) -> Sample:
        ec = self.cfg.env
        renderer = ChatRenderer(self.tokenizer)
        trajectory = Trajectory(renderer, self.cfg.rollout.max_model_len)
        session = EpisodeSession(req.request_id, req.group_id, self.model_name, renderer, trajectory,
                                 self._generate, req.max_tokens, self.tool_parser, ec.on_rewrite, self.stop_ids, ec.max_turns)
        base_url, key = self.endpoint.open(session)
        error, reward = "", None
        try:
            reward = await asyncio.wait_for(self._run({**req.task, "seed": req.seed}, base_url, key), ec.agent_timeout_s)
        except TimeoutError:
            error = f"the agent ran past env.agent_timeout_s ({ec.agent_timeout_s:g} s)"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a user's agent may raise anything; the episode fails, the worker lives
            error = f"the agent raised {type(e).__name__}: {str(e)[:300]}"
        finally:
            self.endpoint.close(key)  # late calls from a thread that outlived its timeout are refused
        trajectory.finish()
        error = error or session.failure
        if not error:
            reward, error = await self._reward(req.task, reward, trajectory)
        if not error and not trajectory.segments:
            error = "the agent made no chat-completion call"
        if not error and ec.on_rewrite == "fail" and len(trajectory.trained_segments()) > 1:
            error = "the agent's conversation restarted after a failed call; with env.on_rewrite fail an episode is one sequence"
        if error:
            return Sample(req.request_id, req.group_id, worker, *Sample.empty_arrays(), "error", error=error[:500])
        finish = "length" if session.truncated or trajectory.cut else "stop"
        arrays = trajectory.sample_arrays()  # several segments when the agent rewrote its history (env.on_rewrite split)
        return Sample(req.request_id, req.group_id, worker, finish_reason=finish, env_reward=reward, turns=trajectory.turns, **arrays)

    async def _run(self, task: dict, base_url: str, key: str):
        """The agent with a client of its own that reaches the endpoint in process
        (`AgentEndpoint.transport`); its base URL also answers over TCP."""
        import httpx
        import openai

        if self.is_async:  # a client per episode: an agent may close its client when it is done
            async with httpx.AsyncClient(transport=self.endpoint.transport(), timeout=self.cfg.env.agent_timeout_s) as http:
                client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=http)
                client._platform = _platform()  # the SDK detects it per client, in a thread, on its first call
                return await self.agent(task, client)
        loop = asyncio.get_running_loop()

        def run():
            with httpx.Client(transport=self.endpoint.transport(loop), timeout=self.cfg.env.agent_timeout_s) as http:
                return self.agent(task, openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=http))

        return await asyncio.to_thread(run)

    async def _reward(self, task: dict, reward, trajectory: Trajectory) -> tuple[float, str]:
        if reward is None:
            if self.score is None:
                return 0.0, "the agent returned None and no reward.function is configured to score it"
            try:
                reward = await asyncio.to_thread(self.score, task, (trajectory.last_reply or {}).get("content") or "")
            except Exception as e:  # noqa: BLE001 - a user's reward function may raise anything
                return 0.0, f"reward.function raised {type(e).__name__}: {str(e)[:300]}"
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            return 0.0, f"the agent returned {type(reward).__name__}, not a reward (a number or None)"
        if not math.isfinite(reward):
            return 0.0, f"the agent returned a non-finite reward: {reward}"
        return reward, ""

    async def _generate(self, req):
        sample = await self.engine.generate(req)
        if self.audit is not None:  # log.token_audit: what the engine sampled, id for id
            self.audit.write(json.dumps({"request_id": req.request_id, "ids": sample.token_ids.tolist()}) + "\n")
        return sample


@functools.cache
def _platform():
    from openai._base_client import get_platform

    return get_platform()

"""Evaluation during training: held-out prompts answered by the rollout engines beside training.

A round is started at the start of the run, whenever the engines begin serving a version that is
a multiple of `eval.every`, and at the end. Each of its prompts gets `eval.samples` sampled
responses (mean reward, pass@k) and, with `eval.greedy`, one at temperature 0 (greedy accuracy).
Its requests share the rollout queue with training's but never pass the staleness gate, never
enter the sample buffer and are never trained; their replies are scored by the reward workers
like any other and counted in the ledger apart (`eval_*`). With an environment, each prompt is an
episode with a seed training never uses (`episode_seed`), scored by the environment itself; an
episode that fails is lost to its round (`requests_lost`), not scored 0. A round is tagged with the version the
engines served when it started and the range of versions its tokens were sampled at (a push may
land while a round runs: the engines keep generating across it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from flashq.config import EvalConfig, SamplingConfig
from flashq.wire.protocol import EpisodeRequest, GenerateRequest, RewardResult, Sample, ScoreRequest

PREFIX = "eval"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of Chen et al. (2021): with c of n samples correct, the chance that
    at least one of k drawn without replacement is, 1 - C(n - c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def episode_seed(task_seed: int, p: int) -> int:
    """The seed of held-out episode p: training's episodes take seeds task_seed * 1_000_003 + i for
    i = 0, 1, ... (mod 2**31); held-out ones count down from i = -1, which training never reaches."""
    return (task_seed * 1_000_003 - 1 - p) % 2**31


def is_eval(request_id: str) -> bool:
    return request_id.startswith(PREFIX)


@dataclass
class EvalRound:
    index: int
    version: int  # the engines' version when the round started
    expected: int  # responses asked
    started: float
    sampled: dict[int, list[float]] = field(default_factory=dict)  # prompt -> rewards of its samples
    greedy: dict[int, float] = field(default_factory=dict)
    tasks: dict[str, dict] = field(default_factory=dict)  # request id -> task, until scored
    token_versions: list[int] = field(default_factory=list)  # min and max seen
    tokens: int = 0
    scored: int = 0
    errors: int = 0
    lost: int = 0  # requests quarantined: never answered


class Evaluator:
    """Rounds of evaluation requests and their results; plain logic, no sockets."""

    def __init__(self, cfg: EvalConfig, sampling: SamplingConfig, tasks: list[dict], prompt_ids: list[np.ndarray] | None,
                 steps: int, seed: int, clock: Callable[[], float] = time.monotonic, episode_seeds: list[int] | None = None):
        """`prompt_ids`: each task's prompt, for single-turn tasks; `episode_seeds` instead: each
        task is an environment episode played with that seed (one training never uses)."""
        if not tasks:
            raise ValueError("eval: no held-out prompts (eval.task gives none, or none of the task source's prompts is held out)")
        self.cfg = cfg
        self.sampling = sampling
        self.tasks = tasks
        self.prompt_ids = prompt_ids
        self.episode_seeds = episode_seeds
        self.steps = steps
        self.seed = seed
        self.clock = clock
        self.rounds: dict[int, EvalRound] = {}  # running
        self.next_round = 0
        self.done_versions: set[int] = set()  # versions a round was started at
        self.unanswered: dict[str, int] = {}  # prompt (group id) -> responses still to come

    def due(self, version: int) -> bool:
        """Whether serving `version` starts a round: the start, every `every` versions, the end."""
        if version in self.done_versions:
            return False
        return version == 0 or version >= self.steps or (self.cfg.every > 0 and version % self.cfg.every == 0)

    def start(self, version: int) -> list[GenerateRequest | EpisodeRequest]:
        r = self.next_round
        self.next_round += 1
        self.done_versions.add(version)
        max_tokens = self.cfg.max_tokens or self.sampling.max_tokens
        requests = []
        for p, (task, ids) in enumerate(zip(self.tasks, self.prompt_ids or [None] * len(self.tasks))):
            gid = f"{PREFIX}{r}/{p}"
            kinds = [(str(k), self.sampling.temperature) for k in range(self.cfg.samples)]
            if self.cfg.greedy:
                kinds.append(("greedy", 0.0))
            for j, (name, temperature) in enumerate(kinds):
                seed = None
                if self.sampling.seed_requests:  # by version (a resumed run draws what it would have), apart from training's
                    seed = (self.seed * 7_919 + 1_000_000_007 + (version * len(self.tasks) + p) * len(kinds) + j) % 2**31
                rid = f"{gid}/{name}"
                if self.episode_seeds is not None:  # an environment episode: the env writes the prompt and scores it
                    s = self.episode_seeds[p]
                    requests.append(EpisodeRequest(request_id=rid, group_id=gid, task={**task, "seed": s}, seed=s,
                                                   max_tokens=max_tokens, temperature=temperature, top_p=self.sampling.top_p))
                    continue
                requests.append(GenerateRequest(request_id=rid, group_id=gid, prompt_ids=ids, max_tokens=max_tokens,
                                                min_tokens=0, temperature=temperature, top_p=self.sampling.top_p, seed=seed))
        self.rounds[r] = EvalRound(r, version, expected=len(requests), started=self.clock())
        self.unanswered.update({f"{PREFIX}{r}/{p}": len(requests) // len(self.tasks) for p in range(len(self.tasks))})
        return requests

    def _round(self, request_id: str) -> EvalRound:
        r = int(request_id[len(PREFIX):].split("/", 1)[0])
        if r not in self.rounds:
            raise KeyError(f"evaluation reply {request_id} for no running round")
        return self.rounds[r]

    def on_sample(self, sample: Sample) -> tuple[ScoreRequest, bool]:
        """The score request for a response, and whether it was its prompt's last."""
        rnd = self._round(sample.request_id)
        if sample.request_id in rnd.tasks or sample.group_id not in self.unanswered:
            raise KeyError(f"evaluation response {sample.request_id} arrived twice")
        p = int(sample.request_id.split("/")[1])
        rnd.tasks[sample.request_id] = self.tasks[p]
        if len(sample.versions):
            lo, hi = int(sample.versions.min()), int(sample.versions.max())
            rnd.token_versions = [min(rnd.token_versions[0], lo), max(rnd.token_versions[1], hi)] if rnd.token_versions else [lo, hi]
        rnd.tokens += len(sample.token_ids)
        self.unanswered[sample.group_id] -= 1
        last = self.unanswered[sample.group_id] == 0
        if last:
            del self.unanswered[sample.group_id]
        return ScoreRequest(sample=sample, task=self.tasks[p]), last

    def on_lost(self, request_id: str) -> tuple[dict | None, bool]:
        """A request given up (quarantined): the round expects one score less. The round's
        record if that was its last, and whether it was its prompt's last."""
        rnd = self._round(request_id)
        gid = request_id.rsplit("/", 1)[0]
        if gid not in self.unanswered:
            raise KeyError(f"evaluation request {request_id} lost, but its prompt expects no more")
        self.unanswered[gid] -= 1
        last = self.unanswered[gid] == 0
        if last:
            del self.unanswered[gid]
        rnd.expected -= 1
        rnd.lost += 1
        if rnd.scored < rnd.expected:
            return None, last
        del self.rounds[rnd.index]
        return self._record(rnd), last

    def on_reward(self, result: RewardResult) -> dict | None:
        """File a score; the round's record once its last score is in."""
        rnd = self._round(result.request_id)
        if rnd.tasks.pop(result.request_id, None) is None:
            raise KeyError(f"evaluation reward for {result.request_id}, which has no sample (or was scored twice)")
        _, p, name = result.request_id.split("/")
        if name == "greedy":
            rnd.greedy[int(p)] = result.reward
        else:
            rnd.sampled.setdefault(int(p), []).append(result.reward)
        rnd.scored += 1
        rnd.errors += bool(result.error)
        if rnd.scored < rnd.expected:
            return None
        del self.rounds[rnd.index]
        return self._record(rnd)

    def _record(self, rnd: EvalRound) -> dict:
        passed = lambda rewards: sum(r >= self.cfg.pass_threshold for r in rewards)  # noqa: E731
        rec = {
            "round": float(rnd.index),
            "version": float(rnd.version),
            "token_version_min": float(rnd.token_versions[0]) if rnd.token_versions else float(rnd.version),
            "token_version_max": float(rnd.token_versions[1]) if rnd.token_versions else float(rnd.version),
            "prompts": float(len(self.tasks)),
            "seconds": self.clock() - rnd.started,
            "tokens": float(rnd.tokens),
            "reward_errors": float(rnd.errors),
            "requests_lost": float(rnd.lost),
        }
        if rnd.sampled:
            rewards = [r for rs in rnd.sampled.values() for r in rs]
            rec["mean_reward"] = float(np.mean(rewards))
            for k in self.cfg.k:  # over the prompts with k samples or more (a lost request leaves one short)
                estimates = [pass_at_k(len(rs), passed(rs), k) for rs in rnd.sampled.values() if len(rs) >= k]
                if estimates:
                    rec[f"pass@{k}"] = float(np.mean(estimates))
        if rnd.greedy:
            rec["greedy_accuracy"] = float(np.mean([r >= self.cfg.pass_threshold for r in rnd.greedy.values()]))
        return rec

    def abandon(self) -> int:
        """Give up the running rounds (no engine will serve their weights again); how many."""
        n = len(self.rounds)
        self.rounds.clear()
        self.unanswered.clear()
        return n

    @property
    def idle(self) -> bool:
        return not self.rounds

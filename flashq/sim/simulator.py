"""A discrete-event simulator of a whole flashq run, for planning what this machine cannot run.

The coordinator is not modelled: the simulator drives flashq's own `Orchestrator` (staleness
gate, prompt replication, queue scheduling, the schedulers, divided rollout) with modelled parts
around it:
- each rollout engine runs continuous batching: every decode step advances each running request
  and takes T = step_s + step_s_per_seq * B + step_s_per_kv_token * K for B running requests
  holding K tokens of context, plus prefill_s_per_token for each prompt token of a request it
  admits that its prefix cache does not hold (a divided response's next chunk on the engine that
  ran the last one prefills nothing);
- an engine's KV cache holds kv_tokens (0: unlimited): it admits a request only when its context
  fits, and when the running requests outgrow the cache it preempts the one admitted last, as
  vLLM does; that request waits at the front and is prefilled again, its tokens so far included;
- speculative decoding (spec_accept > 0): a step verifying g draft tokens per request costs
  T(B) + verify_s_per_token * B * g and advances each request by the expected accepted length
  (1 - p^(g+1)) / (1 - p); each step picks the g <= spec_max_draft that minimises time per token
  (Seer's marginal-benefit rule): drafts pay in the tail, where a step's fixed part dominates, and
  turn off at large batch when a verified token costs about what a request's decode does. With
  grouped drafts (spec_accept_by_refs) a request's p grows with its group's finished responses,
  counted when its engine's batch last changed;
- the trainer takes train_s + train_s_per_token * tokens per step, then the weight sync pauses
  every engine for weight_sync_s; with `rollout.recompute_kv_on_update` each engine then
  prefills its running requests again (prompt and tokens generated so far);
- a dispatched request reaches its engine dispatch_s later; reward takes reward_s per response;
- rollout workers pinned to CPU cores (`placement.rollout`) share them: while k engines are busy
  on c cores, each steps at (c / (k * engine_cores)) ** contention of its speed when that is
  below 1 (contention > 1: oversubscribed cores lose more than their share to switching), and
  with k > c each step also waits switch_s * (k - c) / c for its turn on a core: an engine's step
  is a hand-off between its processes, each of which, when the core is taken, waits out another
  engine's time slice, so short steps (small batches) lose the most.
`Calibration.fit` (flashq/sim/calibration.py) fits those constants to real flashq runs. Output lengths come
from `sampling.forced_lengths` (the length distribution a user plans for).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from flashq.config import ConfigError, FlashqConfig
from flashq.orchestrator.core import Orchestrator
from flashq.sim.calibration import Calibration
from flashq.wire.protocol import GenerateRequest, RewardResult, Sample, ScoreRequest, TrainBatch


class _SharedCores:
    def __init__(self, cores: int, per_engine: float, contention: float, switch_s: float = 0.0):
        self.cores, self.per_engine, self.contention, self.switch_s = cores, per_engine, contention, switch_s
        self.engines: list[_Engine] = []

    def step(self, alone: float) -> float:
        """A step that takes `alone` seconds on cores of its own, as the busy engines share them."""
        busy = sum(1 for e in self.engines if e.running)
        slowdown = max(1.0, busy * self.per_engine / self.cores) ** self.contention
        return alone * slowdown + self.switch_s * max(0, busy - self.cores) / self.cores


class _Engine:
    """Continuous batching in closed form: between events the batch is constant, so progress is
    elapsed time over the step time, taken at the interval's start (the KV part grows a little
    within it). Requests beyond the engine's batch or cache wait inside it, in arrival order."""

    def __init__(self, name: str, cal: Calibration, max_batch: int, shared: _SharedCores | None = None,
                 refs: Callable[[GenerateRequest], int] = lambda req: 0):
        """`refs(req)`: finished responses of the request's group, for grouped drafts."""
        self.name, self.cal, self.max_batch, self.shared, self.refs = name, cal, max_batch, shared, refs
        if shared is not None:
            shared.engines.append(self)
        self.running: dict[str, list] = {}  # request id -> [tokens left, request, length], in admission order
        self.accept = np.zeros(0)  # each running request's draft acceptance, in the same order
        self.waiting: list[list] = []  # [tokens left, request, length]: preempted ones go first
        self.kv_tokens = cal.kv_tokens or float("inf")
        self.kv = 0.0  # tokens of context the running requests hold
        self.preemptions = 0
        self.t = 0.0
        self.paused_until = 0.0  # weight sync, prefill
        self.busy_s = 0.0
        self.load_s = 0.0  # running requests integrated over time: load_s / busy_s is the mean batch
        self.tokens = 0.0
        self.spec_steps = self.spec_tokens = 0.0  # for the mean acceptance length
        self.cached: set[str] = set()  # responses whose prefix this engine holds
        self._next: float | None = None  # next_finish, until the engine's state changes

    def advance(self, now: float) -> None:
        self._next = None
        start = max(self.t, self.paused_until)
        if now > start and self.running:
            step, tokens = self._decode()
            steps = (now - start) / step
            if tokens.max() > 1:
                self.spec_steps += steps
                self.spec_tokens += steps * tokens.mean()
            for item, n in zip(self.running.values(), tokens):
                item[0] -= steps * n
            self.tokens += steps * tokens.sum()
            self.kv += steps * tokens.sum()
        if self.running and now > self.t:
            self.busy_s += now - self.t
            self.load_s += (now - self.t) * len(self.running)
        self.t = max(self.t, now)

    def _decode(self) -> tuple[float, np.ndarray]:
        step, tokens = self.cal.decode(self.accept, self.kv)
        return (self.shared.step(step) if self.shared else step), tokens

    def _batch_changed(self) -> None:
        self._next = None
        if self.cal.spec_accept > 0 or self.cal.spec_accept_by_refs:
            self.accept = np.array([self.cal.accept(self.refs(item[1])) for item in self.running.values()])
        else:
            self.accept = np.zeros(len(self.running))

    def add(self, now: float, req: GenerateRequest, length: int) -> None:
        self.advance(now)
        self.waiting.append([float(length), req, length])
        self.fill()

    @staticmethod
    def _context(item: list) -> float:
        left, req, length = item
        return len(req.prompt_ids) + length - left

    def fill(self) -> None:
        """Admit waiting requests while the batch and the KV cache have room (room for the
        context and one more step of every running request, so an admission is not undone at once)."""
        while self.waiting and len(self.running) < self.max_batch:
            context = self._context(self.waiting[0])
            if self.running and self.kv + context + len(self.running) + 1 > self.kv_tokens:
                break
            item = self.waiting.pop(0)
            req = item[1]
            self.running[req.request_id] = item
            self.kv += context
            uncached = context - (req.generated if req.request_id in self.cached else 0)
            self.paused_until = max(self.paused_until, self.t) + self.cal.prefill_s_per_token * uncached
            self.cached.add(req.request_id)
        self._batch_changed()

    def _preempt(self) -> None:
        """The KV cache is full: like vLLM, evict the request admitted last; it waits at the front
        and is prefilled again (prompt and tokens so far) when it is readmitted."""
        while len(self.running) > 1 and self.kv >= self.kv_tokens - 1e-6:
            rid = next(reversed(self.running))
            item = self.running.pop(rid)
            self.waiting.insert(0, item)
            self.kv -= self._context(item)
            self.cached.discard(rid)
            self.preemptions += 1
        self._batch_changed()

    def update_weights(self, now: float, pause_s: float, recompute_kv: bool) -> None:
        """A weight update: the engine pauses, and drops its KV cache if told to, so every running
        request is prefilled again, the tokens it has generated included."""
        self.advance(now)
        self.paused_until = max(self.paused_until, now) + pause_s
        if recompute_kv:
            self.cached.clear()
            self.paused_until += self.cal.prefill_s_per_token * self.kv
        self._next = None

    def next_finish(self) -> float:
        """When the engine next changes: a request finishes or its KV cache fills up. Kept until
        the engine's state changes, since most events leave most engines alone."""
        if self._next is None:
            self._next = self._compute_next_finish()
        return self._next

    def _compute_next_finish(self) -> float:
        if not self.running:
            return float("inf")
        step, tokens = self._decode()
        steps = max(0.0, min(item[0] / n for item, n in zip(self.running.values(), tokens)))
        if len(self.running) > 1:
            steps = min(steps, max(0.0, (self.kv_tokens - self.kv) / tokens.sum()))
        return max(self.t, self.paused_until) + steps * step

    def pop_finished(self, now: float) -> list[tuple[GenerateRequest, int]]:
        self.advance(now)
        done = [rid for rid, item in self.running.items() if item[0] <= 1e-6]
        out = [(self.running[rid][1], self.running[rid][2]) for rid in done]
        for rid in done:
            self.kv -= self._context(self.running.pop(rid))
        self._preempt()
        self.fill()
        return out


class Simulation:
    def __init__(self, cfg: FlashqConfig, cal: Calibration, prompt_tokens: int = 32, distinct_prompts: int | None = None,
                 rollout_cores: int | None = None):
        """`rollout_cores`: CPU cores the rollout engines share (default: as many as
        `placement.rollout` lists); none listed: each engine has its own device."""
        if cfg.sampling.forced_lengths is None:
            raise ConfigError("the simulator needs sampling.forced_lengths: the output-length distribution to plan for")
        self.cfg, self.cal = cfg, cal
        workers = [f"rollout-{i}" for i in range(cfg.rollout.num_workers)]
        size = distinct_prompts or 10**9

        class Prompts:
            def task(self, i):
                return {"id": str(i % size), "prompt": str(i % size)}

        self.now = 0.0
        self.orch = Orchestrator(cfg, Prompts(), lambda t: np.full(prompt_tokens, int(t["id"]) % 30000 + 1, np.int32) + np.arange(prompt_tokens, dtype=np.int32),
                                 workers, ["reward-0"], clock=lambda: self.now)
        cores = rollout_cores or len(cfg.placement.rollout)
        shared = _SharedCores(cores, cal.engine_cores, cal.contention, cal.switch_s) if cores else None
        batch = min(cfg.rollout.max_num_seqs, cfg.rollout.max_inflight_per_worker)
        self.engines = {w: _Engine(w, cal, batch, shared, self._finished_siblings) for w in workers}
        self.events: list = []
        self.seq = itertools.count()
        self.sent: dict[str, float] = {}  # request id -> first dispatch
        self.finished: dict[str, float] = {}

    def _finished_siblings(self, req: GenerateRequest) -> int:
        """Whole responses of the request's group so far (a divided response's chunks are not)."""
        group = self.orch.buffer.groups.get(req.group_id)
        return len(group.samples) if group is not None else 0

    def _length(self, req: GenerateRequest) -> int:
        return min(req.max_tokens, self.orch.replayed_length(req) - req.generated)

    def _sync_shared(self, name: str, now: float) -> None:
        """Bring every engine sharing cores with `name` up to `now` before its batch changes
        (their speed changes with it)."""
        shared = self.engines[name].shared
        for e in shared.engines if shared else ():
            e.advance(now)

    def _push(self, t: float, kind: str, payload=None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def run(self) -> dict:
        orch, now = self.orch, self.now
        trainer_free_at, batches, step_ends = 0.0, [], []
        orch.on_batch_request(2)
        while not orch.done:
            orch.pump()
            outbox, orch.outbox = orch.outbox, []
            for peer, msg in outbox:
                if isinstance(msg, GenerateRequest):
                    self.sent.setdefault(msg.request_id, now)
                    self._push(now + self.cal.dispatch_s, "arrive", (peer, msg))
                elif isinstance(msg, ScoreRequest):
                    self.finished[msg.sample.request_id] = now
                    self._push(now + self.cal.reward_s, "reward", msg.sample.request_id)
                elif isinstance(msg, TrainBatch):
                    batches.append(msg)
            if batches and trainer_free_at <= now:
                batch = batches.pop(0)
                trainer_free_at = now + self.cal.train_s + self.cal.train_s_per_token * float(np.diff(batch.response_offsets).sum())
                self._push(trainer_free_at, "trained", batch.batch_index)
            t_engine = min((e.next_finish(), w) for w, e in self.engines.items())
            t_event = self.events[0][0] if self.events else float("inf")
            if min(t_engine[0], t_event) == float("inf"):
                raise RuntimeError("simulation stalled: nothing running and nothing scheduled")
            if t_engine[0] <= t_event:
                now = self.now = t_engine[0]
                engine = self.engines[t_engine[1]]
                self._sync_shared(engine.name, now)
                for req, n in engine.pop_finished(now):
                    reason = "length" if n == req.max_tokens else "stop"
                    orch.on_sample(engine.name, Sample(req.request_id, req.group_id, 0, np.zeros(n, np.int32),
                                                       np.zeros(n, np.float32), np.full(n, orch.engine_version, np.int32), reason))
                continue
            now, _, kind, payload = heapq.heappop(self.events)
            self.now = now
            if kind == "arrive":
                peer, msg = payload
                self._sync_shared(peer, now)
                self.engines[peer].add(now, msg, self._length(msg))
            elif kind == "reward":
                orch.on_reward("reward-0", RewardResult(payload, 0.0))
            elif kind == "trained":
                version = payload + 1
                trainer_free_at = now + self.cal.weight_sync_s  # the trainer pushes the weights itself
                orch.on_step_trained(version)
                orch.on_batch_request(1)
                for e in self.engines.values():
                    e.update_weights(now, self.cal.weight_sync_s, self.cfg.rollout.recompute_kv_on_update)
                self._push(now + self.cal.weight_sync_s, "served", version)
                step_ends.append(now + self.cal.weight_sync_s)
            elif kind == "served":
                orch.on_weights_served(payload)
        for e in self.engines.values():
            e.advance(now)
        spec_tokens = sum(e.spec_tokens for e in self.engines.values())
        spec_steps = sum(e.spec_steps for e in self.engines.values())
        steps = np.diff([0.0, *step_ends])
        tokens = orch.ledger.tokens_received
        return {
            "steps": len(step_ends),
            "seconds": step_ends[-1],
            "step_s_mean": float(steps.mean()),
            "step_s_per_step": [float(x) for x in steps],
            "tokens_per_s": tokens / step_ends[-1],
            "engine_idle_share": float(np.mean([1 - e.busy_s / step_ends[-1] for e in self.engines.values()])),
            "engines": {w: {"busy_s": e.busy_s, "load_s": e.load_s, "tokens": e.tokens, "preemptions": e.preemptions}
                        for w, e in self.engines.items()},
            **self._rollout_phases(),
            "mean_acceptance_length": spec_tokens / spec_steps if spec_steps else 1.0,
        }

    def _rollout_phases(self) -> dict:
        """Per trainer step's batch of groups: rollout time (first dispatch to last response) and
        tail time (the last 10% of its responses), averaged over steps."""
        per_step: dict[int, list[tuple[float, float]]] = {}
        for rid, end in self.finished.items():
            step = int(rid.split("/")[0][1:]) // self.cfg.trainer.batch_groups
            per_step.setdefault(step, []).append((self.sent[rid], end))
        size = self.cfg.trainer.batch_groups * self.cfg.sampling.group_size
        full = [per_step[k] for k in sorted(per_step) if len(per_step[k]) == size]
        rollout, tail = [], []
        for items in full:
            ends = np.sort([e for _, e in items])
            start = min(s for s, _ in items)
            rollout.append(ends[-1] - start)
            tail.append(ends[-1] - ends[int(np.ceil(0.9 * len(ends))) - 1])
        return {"rollout_s_mean": float(np.mean(rollout)) if rollout else float("nan"),
                "tail_s_mean": float(np.mean(tail)) if tail else float("nan"),
                "rollout_s_per_step": [float(x) for x in rollout], "tail_s_per_step": [float(x) for x in tail]}


def sweep(config: Path, overrides: list[str], grid: list[str], cal: Calibration) -> list[dict]:
    """Simulate every combination of the grid's values (`key=v1,v2`), on top of the overrides."""
    from flashq.config import load_config

    axes = []
    for item in grid:
        key, sep, values = item.partition("=")
        if not sep or not values:
            raise ConfigError(f"--grid {item!r} is not of the form key=v1,v2")
        axes.append([f"{key}={v}" for v in values.split(",")])
    rows = []
    for combo in itertools.product(*axes) if axes else [()]:
        cfg = load_config(config, [*overrides, *combo])
        result = Simulation(cfg, cal).run()
        rows.append({"settings": dict(c.split("=", 1) for c in combo) or {"config": str(config)}, **result})
    return rows

"""The coordinator's logic, without sockets: prompts in, requests out, samples to groups to batches.

The path of one sample through here:
  1. `pump` admits a task when the `StalenessGate` has capacity and a rollout worker has room;
     the task becomes one group of n `GenerateRequest`s (prompt replication), each queued on
     the rollout `LeastLoadedQueue` (queue scheduling).
  2. `on_sample` takes a finished response and queues it at once for a reward worker.
  3. `on_reward` files the score with its group; a group with all n scores is complete.
  4. `pump` hands the trainer a batch of complete groups when it has asked for one and the gate
     allows (earliest deadline first). With dynamic sampling, a complete group whose rewards are
     all equal is dropped instead, and its admission goes to a new prompt.
Every method returns nothing; messages to send accumulate in `outbox` as (peer, message).
The `Ledger` counts every sample at every stage, so none is lost or trained twice unseen.
Environment episodes take another path (`episodes`), failed requests and poison batches
`failures`'s; checkpoints are `snapshot`'s.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Callable

import numpy as np

from flashq.buffer import Group, GroupBuffer
from flashq.config import FlashqConfig
from flashq.drafting.drafter import HISTORY_PROMPTS
from flashq.evaluation import Evaluator, episode_seed, is_eval
from flashq.ledger import Ledger
from flashq.orchestrator.episodes import EpisodeEvents
from flashq.orchestrator.failures import FailureEvents
from flashq.orchestrator.snapshot import Snapshots
from flashq.redundancy import RedundantGroups
from flashq.scheduling.dispatch import LeastLoadedQueue
from flashq.scheduling.divided import DividedRollout
from flashq.scheduling.lengths import LengthEstimates, forced_length, prompt_key
from flashq.scheduling.order import ContextAwareOrder, FifoOrder, OracleOrder
from flashq.staleness import StalenessGate
from flashq.wire.protocol import EpisodeRequest, GenerateRequest, Message, RewardResult, Sample, ScoreRequest

log = logging.getLogger("flashq.orchestrator")


class Orchestrator(EpisodeEvents, FailureEvents, Snapshots):
    def __init__(
        self,
        cfg: FlashqConfig,
        task_source,
        encode_prompt: Callable[[dict], np.ndarray],
        rollout_workers: list[str],
        reward_workers: list[str],
        trainer: str = "trainer",
        clock: Callable[[], float] = time.monotonic,
        eval_tasks: list[dict] = (),
    ):
        """`eval_tasks`: held-out tasks evaluated in rounds (with `cfg.eval`)."""
        self.cfg = cfg
        self.clock = clock  # the simulator passes simulated time
        self.tasks = task_source
        self.encode_prompt = encode_prompt
        self.trainer = trainer
        self.gate = StalenessGate(cfg.async_ratio, cfg.trainer.batch_groups, cfg.total_groups)
        self.lengths = LengthEstimates(cfg.rollout.history_epochs)
        self.divided = DividedRollout(cfg.rollout.chunk_tokens)
        self.gen_queue: LeastLoadedQueue[GenerateRequest] = LeastLoadedQueue(
            rollout_workers, cfg.rollout.max_inflight_per_worker, self._waiting_order(),
            affinity=self._affinity(),
            max_homes=HISTORY_PROMPTS * len(rollout_workers),  # beyond that no engine holds a prompt's history
            prefer=lambda req: self.chunk_worker.get(req.request_id),
        )
        self.score_queue: LeastLoadedQueue[ScoreRequest] = LeastLoadedQueue(
            reward_workers, cfg.reward.max_inflight_per_worker
        )
        self.buffer = GroupBuffer()
        self.ledger = Ledger()
        ec = cfg.env
        self.episodes = RedundantGroups(ec.redundancy, ec.max_failures_per_group) if ec is not None else None
        self.cancelled: set[str] = set()  # episodes told to stop, not yet answered
        self.engine_version = 0  # every engine serves it
        self.version_pushed = 0  # the newest version the trainer has begun to push: no token may be newer
        self.trained_version = 0
        self.trainer_credits = 0
        self.next_task = 0
        self.next_group = 0
        self.prompt_numbers: dict[str, int] = {}  # prompt key -> the group that first asked it (forced lengths only)
        self.request_worker: dict[str, str] = {}  # request id -> rollout worker
        self.request_sent: dict[str, GenerateRequest] = {}  # in flight, as sent (its latest chunk)
        self.request_sent_at: dict[str, float] = {}  # first chunk sent
        self.chunk_worker: dict[str, str] = {}  # divided response waiting for its next chunk -> its last worker
        self.finished_requests: list[dict] = []  # timings of finished responses, for the request trace
        self.worker_tokens: Counter = Counter()  # tokens each rollout worker generated
        self.score_worker: dict[str, str] = {}  # request id -> reward worker
        self.score_sent: dict[str, ScoreRequest] = {}  # in flight on a reward worker
        self.batch_groups: dict[int, list[Group]] = {}  # sent to the trainer, not yet confirmed
        self.outbox: list[tuple[str, Message]] = []
        # until the engines serve the trainer's weights: after a resume, and with LoRA (engines
        # start from the base; the trainer's first push brings them its adapter)
        self.generation_paused = cfg.trainer.lora is not None
        self.dropped_in_row = 0  # complete groups dropped since one was kept
        self.score_retries: dict[str, int] = {}  # request id -> failed scores so far (reward.on_error drop)
        self.request_failures: dict[str, list[str]] = {}  # request id -> why each failed attempt failed
        self.evaluator: Evaluator | None = None
        self.eval_records: list[tuple[int, dict]] = []  # finished rounds (version, record), for the coordinator to log
        if cfg.eval is not None and cfg.env is not None:  # episodes: the environment writes each prompt in the rollout worker
            seeds = [episode_seed(cfg.task.seed, p) for p in range(len(eval_tasks))]
            self.evaluator = Evaluator(cfg.eval, cfg.sampling, list(eval_tasks), None, cfg.trainer.steps, cfg.seed, clock, seeds)
        elif cfg.eval is not None:
            room = cfg.rollout.max_model_len - (cfg.eval.max_tokens or cfg.sampling.max_tokens)
            kept = [(t, ids) for t in eval_tasks if len(ids := encode_prompt(t)) <= room]
            self.evaluator = Evaluator(cfg.eval, cfg.sampling, [t for t, _ in kept], [ids for _, ids in kept], cfg.trainer.steps, cfg.seed, clock)

    # ------------------------------------------------------------ events

    def on_sample(self, peer: str, sample: Sample) -> None:
        worker = _sent_to(self.request_worker, "sample", sample.request_id, peer)
        self._check_sample(sample, self.request_sent[sample.request_id])  # before anything changes: a refused sample is still owed
        del self.request_worker[sample.request_id]
        self.gen_queue.done(worker)
        request = self.request_sent.pop(sample.request_id)
        self.worker_tokens[worker] += len(sample.token_ids)
        if isinstance(request, EpisodeRequest):
            self._on_eval_episode(sample) if is_eval(sample.request_id) else self._on_episode(worker, sample)
            return
        if sample.finish_reason in ("error", "abort"):  # generation raised, or was overdue and aborted
            self._on_failed_request(worker, request, sample.error or sample.finish_reason)
            return
        self.request_failures.pop(sample.request_id, None)
        done = self.divided.on_chunk(request, sample)
        generated = request.generated + len(sample.token_ids)
        self.lengths.observe(sample.group_id, generated, finished=isinstance(done, Sample))
        if isinstance(done, GenerateRequest):  # divided rollout: back to the scheduler for the next chunk
            self.chunk_worker[done.request_id] = worker  # its prefix is cached there: the tie-break
            self.gen_queue.submit(done)
            return
        sample = done
        if is_eval(sample.request_id):
            self.ledger.eval_samples_received += 1
            self.request_sent_at.pop(sample.request_id, None)
            score, prompt_done = self.evaluator.on_sample(sample)
            if prompt_done:
                self._generation_done(sample.group_id)
            self.score_queue.submit(score)
            return
        group = self.buffer.add_sample(sample)
        self.ledger.samples_received += 1
        self.ledger.tokens_received += len(sample.token_ids)
        self.finished_requests.append({
            "request_id": sample.request_id, "admitted_version": group.admission.version, "worker": worker,
            "sent": self.request_sent_at.pop(sample.request_id, None), "finished": self.clock(),
            "tokens": len(sample.token_ids),
        })
        if group.generated:
            self._generation_done(sample.group_id)
        self.score_queue.submit(ScoreRequest(sample=sample, task=group.task))

    def _generation_done(self, group_id: str) -> None:
        """A group (or an evaluation prompt) needs no more generation: its lengths become
        history, and the queue forgets its worker affinity."""
        self.lengths.close_group(group_id)
        self.gen_queue.forget(group_id)

    def _file_eval(self, record: dict | None) -> None:
        """An evaluation round's record, once it is finished, for the coordinator to log."""
        if record is not None:
            self.eval_records.append((int(record["version"]), record))

    def _check_sample(self, sample: Sample, request: GenerateRequest | EpisodeRequest) -> None:
        """A well-formed sample that contradicts what was asked, or what the books hold, is
        refused whole, so the request stays in flight on its worker and is answered again (or
        re-queued if the worker dies)."""
        rid = sample.request_id
        if sample.group_id != request.group_id:
            raise KeyError(f"sample {rid} names group {sample.group_id}, but was requested for group {request.group_id}")
        newest = max(self.engine_version, self.version_pushed)
        if len(sample.versions) and (sample.versions.min() < 0 or sample.versions.max() > newest):
            raise ValueError(f"sample {rid} has tokens of versions {sample.versions.min()}..{sample.versions.max()}; "
                             f"no engine has been sent a version past {newest}")
        if is_eval(rid) or isinstance(request, EpisodeRequest):
            return  # evaluation has no buffer group; an episode's verdict decides (it may be discarded)
        group = self.buffer.groups.get(request.group_id)
        if group is None:
            raise KeyError(f"sample {rid}: group {request.group_id} is not waiting for samples")
        if rid in group.samples:
            raise KeyError(f"sample {rid}: its group already holds it")
        if isinstance(request, GenerateRequest) and len(sample.token_ids) > request.max_tokens:
            raise ValueError(f"sample {rid} has {len(sample.token_ids)} tokens; at most {request.max_tokens} were asked")

    def on_reward(self, peer: str, result: RewardResult) -> None:
        worker = _sent_to(self.score_worker, "reward for", result.request_id, peer)
        rid = result.request_id
        group = None
        if not is_eval(rid):  # checked before anything changes: a refused reward is still owed
            group = self.buffer.groups.get(rid.rsplit("/", 1)[0])
            if group is None or rid not in group.samples or rid in group.rewards:
                raise KeyError(f"reward for {rid}: its group is not waiting for it")
        del self.score_worker[rid]
        request = self.score_sent.pop(rid)
        self.score_queue.done(worker)
        if is_eval(result.request_id):
            self.ledger.eval_rewards_received += 1
            self._file_eval(self.evaluator.on_reward(result))
            return
        if result.error:
            self.ledger.reward_errors += 1
            if self.cfg.reward.on_error == "drop":
                tries = self.score_retries[rid] = self.score_retries.get(rid, 0) + 1
                if tries <= self.cfg.reward.retries:
                    self.ledger.scores_retried += 1
                    self.score_queue.submit(request)
                    return
                group.fail("reward failed", f"reward failed: {result.error}")
        self.score_retries.pop(rid, None)
        self.buffer.add_reward(group.admission.group_id, result)
        self.ledger.rewards_received += 1
        self.ledger.reward_sum += result.reward
        if group.complete:
            self._on_group_complete(group)

    def _on_group_complete(self, group: Group) -> None:
        """A complete group is trained, or dropped: when a reward kept failing (reward.on_error
        drop: an error is not a real 0), when one of its requests was quarantined, or with dynamic sampling (DAPO) when its rewards are all
        equal (zero advantage for every sample: it would only spend a batch slot). A dropped
        group gives its admission back to the gate, which admits a new prompt on the next pump.
        A run that keeps dropping (a task solved or out of reach, a broken reward) stops and says why."""
        tc = self.cfg.trainer
        rewards = [r.reward for r in group.rewards.values()]
        reason = group.failed
        if not reason and tc.dynamic_sampling and max(rewards) == min(rewards):
            reason = "equal rewards"
        if not reason:
            self.dropped_in_row = 0
            return
        gid = group.admission.group_id
        self.buffer.drop(gid)
        self.gate.withdraw(gid)
        self.ledger.groups_dropped += 1
        self.ledger.groups_dropped_by_reason[group.failed_kind or reason] += 1
        self.ledger.dropped_groups.append(gid)
        self.ledger.samples_dropped += len(group.samples)
        self.dropped_in_row += 1
        if self.dropped_in_row >= tc.max_dropped_in_row:
            why = (f"every sample of each scoring the same (the last: {rewards[0]:g}); the task is solved or out of reach for "
                   "this policy. Change the task, or turn trainer.dynamic_sampling off" if reason == "equal rewards" else
                   f"the last: {reason}. Fix the reward function (or set reward.on_error: zero), or the prompts")
            raise RuntimeError(f"{self.dropped_in_row} groups dropped in a row, {why} (trainer.max_dropped_in_row)")

    def on_worker_lost(self, worker: str) -> None:
        """A rollout or reward worker died: dispatch nothing more to it and send what it held to
        the others, first in line. Anything the dead worker still sends is rejected as unrequested."""
        self.ledger.workers_lost[worker] += 1
        if worker in self.gen_queue.load:
            held = [rid for rid, w in self.request_worker.items() if w == worker]
            self.gen_queue.remove_worker(worker)
            for rid in held:
                del self.request_worker[rid]
                req = self.request_sent.pop(rid)
                if rid in self.cancelled:  # an episode told to stop: as if it had answered
                    self.cancelled.discard(rid)
                    self.episodes.on_result(req.group_id, rid, failed=False)
                    self.ledger.episodes_discarded += 1
                    if self.episodes.finished(req.group_id):
                        self.gen_queue.forget(req.group_id)
                    continue
                self.gen_queue.submit_front(req)
                self.ledger.requests_requeued += 1
        if worker in self.score_queue.load:
            held = [rid for rid, w in self.score_worker.items() if w == worker]
            self.score_queue.remove_worker(worker)
            for rid in held:
                del self.score_worker[rid]
                self.score_queue.submit_front(self.score_sent.pop(rid))
                self.ledger.scores_requeued += 1

    def on_worker_joined(self, worker: str) -> None:
        """A (restarted) worker is ready: a rollout worker once it serves the current weights."""
        queue = self.gen_queue if worker.startswith("rollout-") else self.score_queue
        queue.add_worker(worker)

    def on_batch_request(self, credits: int) -> None:
        self.trainer_credits += credits

    def on_push_started(self, version: int) -> None:
        self.version_pushed = max(self.version_pushed, version)

    def on_weights_served(self, version: int) -> None:
        """Every rollout engine now serves `version` (again, after a regroup: a no-op)."""
        if self.generation_paused and version == self.engine_version:
            self.generation_paused = False  # the restored weights reached the engines
            return
        if version < self.engine_version:
            raise ValueError(f"weight version went from {self.engine_version} back to {version}")
        self.engine_version = version
        self._evaluate_if_due()

    def _evaluate_if_due(self) -> None:
        """Start an evaluation round if the engines' version calls for one (see `evaluation`)."""
        if self.evaluator is None or self.generation_paused or not self.evaluator.due(self.engine_version):
            return
        for req in self.evaluator.start(self.engine_version):
            if isinstance(req, EpisodeRequest):
                self.gen_queue.submit(req)
                continue
            self.lengths.add_group(req.group_id, req.prompt_ids)
            self.gen_queue.submit(self.divided.first(req))

    def on_step_trained(self, version: int, skipped: str = "") -> list[Group]:
        """The trainer finished the batch with index version - 1 (and broadcast the result);
        `skipped`: why it learned nothing from it (e.g. a non-finite gradient)."""
        if version != self.trained_version + 1:
            raise KeyError(f"trainer reported step {version}; the next step is {self.trained_version + 1}")
        groups = self.batch_groups.pop(version - 1, None)
        if groups is None:
            raise KeyError(f"trainer reported step {version}, but batch {version - 1} was never sent")
        if skipped:
            self.ledger.batches_skipped[skipped] += 1
        self.trained_version = version
        self.ledger.samples_trained += sum(g.size for g in groups)
        return groups

    @property
    def done(self) -> bool:
        """Every step trained and the last evaluation round (at the final weights) scored."""
        return self.trained_version >= self.cfg.trainer.steps and (self.evaluator is None or self.evaluator.idle)

    # ------------------------------------------------------------ scheduling

    def pump(self) -> None:
        if not self.generation_paused:
            self._evaluate_if_due()
            self._admit()
        for worker, req in ([] if self.generation_paused else self.gen_queue.assignments()):
            self.request_worker[req.request_id] = worker
            self.request_sent[req.request_id] = req
            self.chunk_worker.pop(req.request_id, None)
            if req.request_id not in self.request_sent_at:  # first chunk, not a re-queued request
                self.request_sent_at[req.request_id] = self.clock()
                if is_eval(req.request_id):
                    self.ledger.eval_requests_sent += 1
                else:
                    self.ledger.requests_sent += 1
            self.outbox.append((worker, req))
        for worker, req in self.score_queue.assignments():
            self.score_worker[req.sample.request_id] = worker
            self.score_sent[req.sample.request_id] = req
            self.outbox.append((worker, req))
        self._send_batches()

    def _waiting_order(self):
        rc, s = self.cfg.rollout, self.cfg.sampling
        if rc.scheduler == "context_aware":
            return ContextAwareOrder(self.lengths, s.max_tokens, rc.starvation_s, self.clock)
        if rc.scheduler == "oracle":
            return OracleOrder(lambda req: self.replayed_length(req) - req.generated)
        return FifoOrder()

    def _admit(self) -> None:
        # FIFO admits only what workers have room for (fresh prompts, fresh weights); the
        # length-aware orders see everything the gate allows, or they would have nothing to order
        lookahead = self.cfg.rollout.scheduler != "fifo"
        while self.gate.capacity(self.engine_version) > 0 and (lookahead or self.gen_queue.free_slots() > 0):
            task = self.tasks.task(self.next_task)
            self.next_task += 1
            if self.episodes is not None:  # the environment writes the prompt, in the rollout worker
                self._admit_episodes(task)
                continue
            prompt_ids = self.encode_prompt(task)
            room = self.cfg.rollout.max_model_len - self.cfg.sampling.max_tokens
            if len(prompt_ids) > room:
                self.ledger.tasks_skipped["prompt longer than max_model_len - max_tokens"] += 1
                continue
            gid = f"g{self.next_group}"
            if self.cfg.sampling.forced_lengths is not None:
                self.prompt_numbers.setdefault(prompt_key(prompt_ids), self.next_group)
            self.next_group += 1
            admission = self.gate.admit(gid, self.engine_version)
            n = self.cfg.sampling.group_size
            self.buffer.add_group(Group(task=task, prompt_ids=prompt_ids, size=n, admission=admission))
            self.lengths.add_group(gid, prompt_ids)
            self.ledger.groups_admitted += 1
            for k in range(n):
                self.gen_queue.submit(self._request(gid, k, prompt_ids))

    def _affinity(self):
        """What keeps requests on one worker: nothing, the group, or (grouped speculation) the
        prompt, whose home then outlives its groups so the next epoch finds its history there."""
        rc = self.cfg.rollout
        if rc.group_affinity is False or (rc.group_affinity is None and rc.speculation != "grouped"):
            return None
        if rc.speculation != "grouped":
            return lambda req: req.group_id

        def prompt_of(req: GenerateRequest | EpisodeRequest) -> str:
            if isinstance(req, EpisodeRequest):  # the environment renders its prompt from the task and seed
                return f"task:{hash(json.dumps(req.task, sort_keys=True, default=str))}"
            group = self.buffer.groups.get(req.group_id)
            ids = group.prompt_ids if group is not None and len(group.prompt_ids) else req.prompt_ids
            return f"prompt:{hash(ids.tobytes())}"

        return prompt_of

    def _request(self, gid: str, k: int, prompt_ids: np.ndarray) -> GenerateRequest:
        s = self.cfg.sampling
        index = int(gid[1:]) * s.group_size + k
        req = GenerateRequest(request_id=f"{gid}/{k}", group_id=gid, prompt_ids=prompt_ids, max_tokens=s.max_tokens,
                              min_tokens=0, temperature=s.temperature, top_p=s.top_p,
                              seed=(self.cfg.seed * 1_000_003 + index) % (2**31) if s.seed_requests else None)
        if s.forced_lengths is not None:
            req.max_tokens = req.min_tokens = self.replayed_length(req)
        return self.divided.first(req)

    def replayed_length(self, req: GenerateRequest) -> int:
        """Benchmark replay (`sampling.forced_lengths`): the whole length of the response `req`
        is for. A prompt asked again (the same token ids: a later epoch, or another task with the
        same text) keeps its share of the length, as the scheduler's history assumes; which group
        first asked each prompt is not checkpointed, so after a resume a prompt draws it anew."""
        s = self.cfg.sampling
        gid, k = req.group_id, int(req.request_id.rsplit("/", 1)[1])
        number = int(gid[1:])
        prompt = self.prompt_numbers.get(prompt_key(req.prompt_ids), number)
        return forced_length(s.forced_lengths, number * s.group_size + k, s.group_size, prompt)

    def _send_batches(self) -> None:
        while self.trainer_credits > 0:
            chosen = self.gate.select_batch(self.buffer.complete)
            if chosen is None:
                return
            index = self.gate.next_batch - 1
            batch, groups = self.buffer.take(chosen, index)
            self.batch_groups[index] = groups
            self.trainer_credits -= 1
            self.ledger.batches_sent += 1
            self.ledger.samples_batched += sum(len(g.samples) for g in groups)  # not sequences: a split episode is several
            self.outbox.append((self.trainer, batch))

    # ------------------------------------------------------------ observability

    def queue_depths(self) -> dict[str, float]:
        return {
            "queue/generate_waiting": len(self.gen_queue.waiting),
            "queue/generate_in_flight": self.gen_queue.in_flight,
            "queue/score_waiting": len(self.score_queue.waiting),
            "queue/score_in_flight": self.score_queue.in_flight,
            "queue/groups_in_buffer": len(self.buffer),
            "queue/groups_complete": len(self.buffer.complete),
            "queue/batches_at_trainer": len(self.batch_groups),
            "queue/chunks_sent": self.divided.chunks_sent,
            "queue/responses_divided_in_flight": len(self.divided.partial),
        }


def _sent_to(sent: dict[str, str], what: str, request_id: str, peer: str) -> str:
    """The worker `request_id` was sent to, which must be the `peer` answering it; anything else
    is refused before any state changes."""
    worker = sent.get(request_id)
    if worker is None:
        raise KeyError(f"{what} {request_id} from {peer} was not requested (or arrived twice)")
    if worker != peer:
        raise KeyError(f"{what} {request_id} came from {peer}, but was sent to {worker}")
    return worker

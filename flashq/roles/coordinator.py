"""Coordinator process: the hub every other role connects to.

It owns the `Orchestrator` (prompt source, staleness gate, dispatch, sample buffer) and does the
process-facing work around it: the startup handshake, relaying weight-sync calls to every
rollout worker (`WeightSyncRelay`), liveness, per-step metrics (`coordinator_metrics`), and the
final books (`ledger.json`).

Workers may die and come back (`fault.restart_workers`): a dead one's work is re-queued to the
others at once; a restarted one says hello again and takes work once it serves the current
weights. Changing the set of rollout workers means a new weight-transfer group, so the trainer
is told to rebuild it (`Regroup`). Every loss and rejoin is appended, timed, to `faults.jsonl`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from pathlib import Path

import numpy as np

from flashq import checkpoint
from flashq.config import ROLE_SECTIONS, FlashqConfig
from flashq.credentials import RunCredentials
from flashq.data import chat_messages, evaluation_tasks, training_tasks
from flashq.data.chat_encoder import ChatEncoder
from flashq.failed_batches import suspects
from flashq.jsonl import keep_records
from flashq.orchestrator.core import Orchestrator
from flashq.reporting.metrics import MetricsLog
from flashq.reporting.trackers import make_trackers
from flashq.roles.common import resolve_model
from flashq.roles.coordinator_metrics import StepMetrics, progress_window
from flashq.roles.weight_sync_relay import PendingSync, WeightSyncRelay
from flashq.wire.protocol import (
    BatchRequest,
    Fatal,
    Heartbeat,
    Hello,
    Message,
    Regroup,
    RewardResult,
    Sample,
    Shutdown,
    Start,
    StepStats,
    WeightSyncCall,
    WeightSyncReply,
    WorkerStats,
)
from flashq.wire.transport import Hub, PeerLost

log = logging.getLogger("flashq.coordinator")
REASON_DETAIL = re.compile(r"[\w./-]*\d[\w./-]*")  # an id or a number in a reason
MAX_REJECTION_KINDS = 256
MAX_MESSAGES_PER_PUMP = 4096  # handled before the pump runs, so a flood cannot hold back sends


def rejection_kind(peer: str, msg: Message, error: Exception) -> str:
    """What the books count a refused message under: its type, the sender's kind of role and the
    reason with ids and numbers left out, so a million wrong messages make a handful of keys."""
    kind = peer.split("-")[0]
    sender = kind if kind in ROLE_SECTIONS else "an unknown peer"  # identities are the peer's choice
    return f"{type(msg).__name__} from {sender}: {REASON_DETAIL.sub('#', str(error).strip(chr(39)))}"[:120]


class RoleFailed(RuntimeError):
    pass


class Coordinator(StepMetrics):
    def __init__(self, cfg: FlashqConfig, address: str, run_dir: Path):
        self.cfg = cfg
        self.address = address
        self.run_dir = run_dir
        self.rollouts = [r for r in cfg.role_names() if r.startswith("rollout-")]
        self.rewards = [r for r in cfg.role_names() if r.startswith("reward-")]
        self.peers = self.rollouts + self.rewards + ["trainer"]
        self.relay = WeightSyncRelay()  # the trainer's weight-sync calls, out to the workers and back
        self.worker_stats: dict[str, dict[str, float]] = {}
        self.prev_clock: dict[str, tuple[float, float]] = {}
        self.prev_tokens = 0
        self.prev_dropped = 0  # dynamic sampling: groups dropped by the last logged step
        self.prev_scored = (0, 0.0)  # rewards received and their sum by the last logged step
        self.prev_spec: dict[str, dict[str, float]] = {}  # rollout worker -> its last speculation counters
        self.started = time.monotonic()
        self.last_step_at = self.started
        self.window = progress_window(cfg)  # the steps the progress line's rates are averaged over
        self.tolerant = cfg.fault.restart_workers  # a lost worker is survivable, not fatal
        self.alive: set[str] = set()  # started and not lost
        self.engine_ranks: dict[str, int] = {}
        self.group: list[str] = []  # rollout workers in the trainer's current weight-transfer group
        self.announced: list[str] = []  # rollout workers the trainer was last told to build a group for
        self.awaiting_weights: set[str] = set()  # restarted rollout workers that do not serve the weights yet
        self.none_alive_since: float | None = None
        self.told_to_restart: set[str] = set()

    async def run(self) -> None:
        t = self.cfg.transport
        credentials = RunCredentials.ensure(self.run_dir) if t.authenticate else None  # a role is heard once it proves its name
        self.hub = Hub(self.address, hwm=t.hwm, max_message_bytes=self.cfg.message_limit_bytes, curve_keys=t.curve_keys,
                       credentials=credentials)
        if not t.authenticate:
            log.warning("transport.authenticate is false: any peer that reaches %s is heard under the name it claims", self.hub.address)
        try:
            await self._run_on_hub()
        finally:
            self.hub.close()  # its socket and authenticator (one per process: the next hub binds it)

    async def _run_on_hub(self) -> None:
        self._prepare()
        self.metrics = MetricsLog(self.run_dir, tensorboard=self.cfg.log.tensorboard)
        ok = False
        try:
            lc = self.cfg.log
            self.metrics.trackers = make_trackers(lc.trackers, lc.project, self.run_dir, self.cfg.model_dump(mode="json"))
            await self._startup()
            async with asyncio.TaskGroup() as tg:
                ticker = tg.create_task(self._tick())
                await self._serve()
                ticker.cancel()
            await self._broadcast(Shutdown(reason="training finished"))
            ok = True
        except BaseException as e:
            reason = e.exceptions[0] if isinstance(e, BaseExceptionGroup) else e
            await self._broadcast(Shutdown(reason=f"coordinator stopping: {reason}"))
            raise
        finally:
            try:
                self._write_ledger()
                self.metrics.close(ok)
            finally:
                await asyncio.sleep(0.2)  # the shutdown messages leave before the socket closes

    def _prepare(self) -> None:
        """What the run needs before the roles connect: the hub's rules, the orchestrator, a resume's state."""
        t = self.cfg.transport
        # a name moves to a newer connection during start-up, and later for workers that restart
        self.hub.takeover = lambda name: not self.alive or (self.tolerant and name in self.rollouts + self.rewards)
        log.info("coordinator listening on %s", self.hub.address)
        if t.curve_keys is None and t.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("the coordinator listens on %s without CurveZMQ: messages and role credentials cross the network "
                        "unencrypted; set transport.curve_keys (`flashq keys DIR`)", t.host)
        encoder = ChatEncoder(resolve_model(self.cfg), self.cfg.model.cache_dir)
        system_prompt = self.cfg.task.system_prompt

        def encode(task: dict) -> np.ndarray:
            return np.asarray(encoder.encode(chat_messages(task, system_prompt)), dtype=np.int32)

        self.orch = Orchestrator(self.cfg, training_tasks(self.cfg), encode, self.rollouts, self.rewards, eval_tasks=evaluation_tasks(self.cfg))
        if self.cfg.resume_from:
            state = checkpoint.decode_state((self.cfg.resume_from / "coordinator.msgpack").read_bytes())
            self.orch.restore(state)
            held = {gid: list(g.samples) for gid, g in self.orch.buffer.groups.items()}
            self.orch.quarantine_groups(suspects(self.run_dir, held, self.cfg.trainer.max_batch_failures))
            truncate_metrics(self.run_dir / "metrics.jsonl", state.version)
            log.info("resuming at version %d: %d groups restored, next task %d", state.version, len(state.groups), state.next_task)
            books = self.orch.ledger  # per-step rates count from the restored books, not from zero
            self.prev_tokens, self.prev_dropped = books.tokens_received, books.groups_dropped
            self.prev_scored = (books.rewards_received, books.reward_sum)

    # ------------------------------------------------------------ startup

    async def _startup(self) -> None:
        hellos: dict[str, Hello] = {}
        deadline = time.monotonic() + self.cfg.transport.startup_timeout_s
        while len(hellos) < len(self.peers):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(self.peers) - set(hellos))
                raise PeerLost(f"roles never connected within {self.cfg.transport.startup_timeout_s:.0f}s: {', '.join(missing)}")
            try:
                peer, msg = await asyncio.wait_for(self.hub.recv(), left)
            except asyncio.TimeoutError:
                continue
            if isinstance(msg, Fatal):
                if peer not in self.peers:
                    log.warning("ignoring Fatal from unexpected peer %r", peer)
                    continue
                raise RoleFailed(f"{peer} failed during startup: {msg.reason}")
            if isinstance(msg, Hello):
                if peer not in self.peers:
                    log.warning("ignoring hello from unexpected peer %r (expected %s)", peer, ", ".join(self.peers))
                    continue
                hellos[peer] = msg
                log.info("%s connected (pid %d on %s)", peer, msg.pid, msg.host)
        self.engine_ranks = {r: hellos[r].engine_ranks for r in self.rollouts}
        self.announced = list(self.rollouts)
        self.rank_offsets = self._offsets(self.announced)
        world = sum(self.engine_ranks.values())
        died = []  # workers that said hello and died before their start message: lost, restarted, rejoining
        for peer in self.peers:
            try:
                await self.hub.send(peer, Start(run_id=self.run_dir.name, inference_world_size=world, rank_offset=self.rank_offsets.get(peer, 0)))
            except PeerLost:
                if not (self.tolerant and peer in self.rollouts + self.rewards):
                    raise
                died.append(peer)
        self.alive = set(self.peers)
        now = time.monotonic()  # roles send no heartbeats while they wait for Start: count silence from here
        self.hub.last_seen.update({p: now for p in self.peers})
        for peer in died:
            self._lose(peer, "it died before its start message")
        (self.run_dir / "started.json").write_text(json.dumps({"time": time.time(), "roles": self.peers}))
        self._fault({"peer": "coordinator", "event": "started", "version": self.orch.trained_version})
        log.info("all %d roles connected; %d inference rank(s); async_ratio=%g", len(self.peers), world, self.cfg.async_ratio)

    # ------------------------------------------------------------ main loop

    async def _serve(self) -> None:
        self.generation_started = time.monotonic()
        for queue in (self.orch.gen_queue, self.orch.score_queue):
            for clock in queue.clocks.values():
                clock.reset()
        await self._pump()
        while not self.orch.done:
            await self._receive(*await self.hub.recv())
            # what else has arrived (a worker's bundle holds about a hundred answers) is handled
            # before one pump, so what they release leaves as one bundle per peer, not one
            # ZeroMQ send per answer
            for _ in range(MAX_MESSAGES_PER_PUMP):
                if self.orch.done or (ready := await self.hub.recv_ready()) is None:
                    break
                await self._receive(*ready)
            await self._pump()
        log.info("trained %d steps; books: %s", self.cfg.trainer.steps, json.dumps(self.orch.ledger.summary(self.orch.buffer)))

    async def _receive(self, peer: str, msg: Message) -> None:
        try:
            if peer not in self.peers:  # identities are the peer's choice: only the run's own roles are heard
                raise ValueError("a peer that is none of this run's roles")
            if isinstance(msg, Hello):
                await self._rejoin(peer, msg)
            elif peer not in self.alive and not isinstance(msg, Fatal):
                await self._stop_stale(peer, msg)
            else:
                self._handle(peer, msg)
        except (KeyError, ValueError) as e:
            self._reject(peer, msg, e)

    def _reject(self, peer: str, msg: Message, error: Exception) -> None:
        """Count a refused message by its kind of reason, and log the first of each kind."""
        reason = rejection_kind(peer, msg, error)
        if reason not in self.orch.ledger.rejected and len(self.orch.ledger.rejected) >= MAX_REJECTION_KINDS:
            reason = "other"  # a peer inventing reasons (a free-form method name, say) cannot grow the books
        self.orch.ledger.rejected[reason] += 1
        count = self.orch.ledger.rejected[reason]
        if count <= 3 or count % 1000 == 0:
            log.warning("rejected %s from %s (%d of this kind): %s", type(msg).__name__, peer, count, error)

    def _handle(self, peer: str, msg: Message) -> None:
        orch = self.orch
        if isinstance(msg, Sample):
            orch.on_sample(peer, msg)
        elif isinstance(msg, RewardResult):
            orch.on_reward(peer, msg)
        elif isinstance(msg, BatchRequest):
            self._from_trainer(peer, msg)
            orch.on_batch_request(msg.credits)
        elif isinstance(msg, WeightSyncCall):
            self._fan_out(peer, msg)
        elif isinstance(msg, WeightSyncReply):
            if (finished := self.relay.reply(peer, msg)) is not None:
                self._finish_sync(finished)
        elif isinstance(msg, StepStats):
            self._from_trainer(peer, msg)
            orch.on_step_trained(msg.step, skipped="non-finite gradient norm" if msg.metrics.get("train/skipped_nonfinite") else "")
            if msg.metrics.get("checkpoint"):
                path = checkpoint.complete(self.run_dir, msg.step, orch.snapshot(msg.step), self.cfg.trainer.keep_checkpoints)
                log.info("checkpoint %s", path)
            self._log_step(msg)
        elif isinstance(msg, WorkerStats):
            self.worker_stats[peer] = msg.metrics
        elif isinstance(msg, Fatal):
            if not (self.tolerant and peer in self.rollouts + self.rewards):
                raise RoleFailed(f"{peer} failed: {msg.reason}")
            self._lose(peer, f"failed: {msg.reason[:200]}")
        elif not isinstance(msg, Heartbeat):
            raise ValueError(f"unexpected {type(msg).__name__}")

    @staticmethod
    def _from_trainer(peer: str, msg: Message) -> None:
        if peer != "trainer":
            raise ValueError(f"{type(msg).__name__} from {peer}; only the trainer sends it")

    async def _pump(self) -> None:
        self.orch.pump()
        if self.orch.finished_requests:
            self._trace(self.orch.finished_requests)
            self.orch.finished_requests = []
        for version, record in self.orch.eval_records:
            self.metrics.write(version, record, kind="eval")
            log.info("eval at version %d: %s", version,
                     "  ".join(f"{k} {v:.3f}" for k, v in record.items() if k in ("mean_reward", "greedy_accuracy") or k.startswith("pass@")))
        self.orch.eval_records = []
        outbox, self.orch.outbox = self.orch.outbox, []
        by_peer: dict[str, list[Message]] = {}
        for peer, msg in outbox:
            by_peer.setdefault(peer, []).append(msg)
        lost = False
        for peer, msgs in by_peer.items():
            if peer != "trainer" and peer not in self.alive:
                continue  # re-queued when the peer was lost
            try:
                await self.hub.send_all(peer, msgs)  # one bundle: a send and a wake-up, not one per message
            except PeerLost:
                if not self.tolerant or peer == "trainer":
                    raise
                self._lose(peer, "its connection is gone")
                lost = True
        if lost:  # what it held is queued again: send it elsewhere now
            await self._pump()

    def _trace(self, records: list[dict]) -> None:
        """log.request_trace: one line per finished response, times in seconds since generation began."""
        if not self.cfg.log.request_trace:
            return
        if getattr(self, "trace_file", None) is None:
            self.trace_file = (self.run_dir / "requests.jsonl").open("a", buffering=1)
        t0 = self.generation_started
        for r in records:
            sent = r["sent"] - t0 if r["sent"] is not None else None
            self.trace_file.write(json.dumps({**r, "sent": sent, "finished": r["finished"] - t0}) + "\n")

    def _fan_out(self, peer: str, call: WeightSyncCall) -> None:
        if peer != "trainer":
            raise ValueError(f"weight sync call from {peer}; only the trainer may start one")
        # a new transfer group is built for the workers last announced; every other call goes to the group
        group = list(self.announced) if call.method == "init_weight_transfer_engine" else self.group
        recipients = [r for r in group if r in self.alive]
        finished = self.relay.open(call, recipients)  # no recipients (every rollout worker gone): finished at once
        self.group = group
        if call.method == "push_weights":
            self.orch.on_push_started(call.version)
        for r in recipients:
            payload = call.payload
            if call.method == "init_weight_transfer_engine":
                payload = {**payload, "rank_offset": self.rank_offsets[r]}
            self.orch.outbox.append((r, WeightSyncCall(call.call_id, call.method, payload, call.version)))
        if finished is not None:
            self._finish_sync(finished)

    def _finish_sync(self, sync: PendingSync) -> None:
        if sync.ok and sync.call.method == "push_weights":
            self.orch.on_weights_served(sync.call.version)
            for worker in sorted(self.awaiting_weights & sync.recipients):  # restarted workers now serve them
                self.awaiting_weights.discard(worker)
                self.orch.on_worker_joined(worker)
                self._fault({"peer": worker, "event": "serving", "version": sync.call.version})
                log.info("%s serves version %d again and takes requests", worker, sync.call.version)
        self.orch.outbox.append(("trainer", sync.answer()))

    # ------------------------------------------------------------ faults

    def _fault(self, event: dict) -> None:
        with (self.run_dir / "faults.jsonl").open("a") as f:
            f.write(json.dumps({"time": time.time(), **event}) + "\n")

    def _offsets(self, members: list[str]) -> dict[str, int]:
        offsets, world = {}, 0
        for r in members:
            offsets[r] = 1 + world
            world += self.engine_ranks[r]
        return offsets

    def _lose(self, peer: str, reason: str) -> None:
        """A worker is gone: re-queue its work, fail any weight sync waiting on it, and if it
        was in the weight-transfer group, have the trainer rebuild the group without it."""
        if peer not in self.alive:
            return
        self.alive.discard(peer)
        log.warning("%s lost (%s); its work goes to the others", peer, reason)
        self._fault({"peer": peer, "event": "lost", "reason": reason})
        self.orch.on_worker_lost(peer)
        self.awaiting_weights.discard(peer)
        for sync in self.relay.lose(peer):
            self._finish_sync(sync)
        if peer in self.group or peer in self.announced:
            self._regroup(f"{peer} lost")
        serving = [r for r in self.rollouts if r in self.alive and r not in self.awaiting_weights]
        evaluator = self.orch.evaluator
        if self.orch.trained_version >= self.cfg.trainer.steps and evaluator is not None and not evaluator.idle and not serving:
            # training is over, so no push will bring a restarted engine the final weights
            log.warning("%s lost during the final evaluation round, and no engine serves the final weights: round abandoned", peer)
            self._fault({"peer": peer, "event": "eval_abandoned", "rounds": evaluator.abandon()})
        # what was queued for it is void (its work was re-queued above): were it to say hello again
        # before the next pump, the restarted worker must not get its old self's messages
        self.orch.outbox = [(p, m) for p, m in self.orch.outbox if p != peer]

    async def _rejoin(self, peer: str, hello: Hello) -> None:
        """A restarted worker said hello: start it; a rollout worker joins the next weight group."""
        if not self.tolerant or peer not in self.rollouts + self.rewards:
            raise KeyError(f"hello from {peer} after startup")
        self._lose(peer, "it restarted")  # if its death went unnoticed
        self.told_to_restart.discard(peer)
        self.engine_ranks[peer] = hello.engine_ranks
        await self.hub.send(peer, Start(run_id=self.run_dir.name, inference_world_size=0, rank_offset=0))
        self.alive.add(peer)
        self._fault({"peer": peer, "event": "rejoined", "pid": hello.pid})
        log.info("%s rejoined (pid %d)", peer, hello.pid)
        if peer in self.rewards:
            self.orch.on_worker_joined(peer)
        else:
            self.awaiting_weights.add(peer)
            self._regroup(f"{peer} rejoined")

    async def _stop_stale(self, peer: str, msg: Message) -> None:
        """A worker declared lost is still talking: its results were re-queued elsewhere, so
        reject them and tell it (once) to exit for a restart."""
        if peer not in self.told_to_restart:
            self.told_to_restart.add(peer)
            try:
                await self.hub.send(peer, Shutdown(reason=f"{peer} was declared lost; its work went to other workers", restart=True))
            except PeerLost:
                pass
        if not isinstance(msg, (Heartbeat, WorkerStats)):
            self.orch.ledger.rejected[f"{type(msg).__name__} from a worker declared lost"] += 1

    def _regroup(self, reason: str) -> None:
        self.announced = [r for r in self.rollouts if r in self.alive]
        self.rank_offsets = self._offsets(self.announced)
        world = sum(self.engine_ranks[r] for r in self.announced)
        self.orch.outbox.append(("trainer", Regroup(inference_world_size=world, members=list(self.announced), reason=reason)))

    async def _tick(self) -> None:
        t = self.cfg.transport
        while True:
            await asyncio.sleep(t.heartbeat_s)
            for peer in self.peers:
                if peer not in self.alive:
                    continue
                try:
                    await self.hub.send(peer, Heartbeat(sent_at=time.time()))
                except PeerLost:
                    if not self.tolerant or peer == "trainer":
                        raise
                    self._lose(peer, "its connection is gone")
            if self.tolerant:  # what a lost worker held is dispatched by the next _pump
                workers = [p for p in self.rollouts + self.rewards if p in self.alive]
                for peer in self.hub.silent_peers(workers, self.cfg.fault.worker_timeout_s):
                    self._lose(peer, f"silent for {self.cfg.fault.worker_timeout_s:.0f}s")
                self._check_some_alive()
                silent = self.hub.silent_peers(["trainer"], t.liveness_timeout_s)
            else:
                silent = self.hub.silent_peers(self.peers, t.liveness_timeout_s)
            if silent:
                raise PeerLost(f"no message for {t.liveness_timeout_s:.0f}s from: {', '.join(silent)}")

    def _check_some_alive(self) -> None:
        """With every rollout (or reward) worker gone, wait for a restart at most startup_timeout_s."""
        gone = not any(p in self.alive for p in self.rollouts) or not any(p in self.alive for p in self.rewards)
        if not gone:
            self.none_alive_since = None
            return
        now = time.monotonic()
        self.none_alive_since = self.none_alive_since or now
        if now - self.none_alive_since > self.cfg.transport.startup_timeout_s:
            raise PeerLost(f"no rollout or no reward worker for {self.cfg.transport.startup_timeout_s:.0f}s")

    async def _broadcast(self, msg: Message) -> None:
        for peer in self.peers:
            try:
                await asyncio.wait_for(self.hub.send(peer, msg), 1.0)
            except (PeerLost, asyncio.TimeoutError):
                pass

    # ------------------------------------------------------------ observability

    def _write_ledger(self) -> None:
        if not hasattr(self, "orch"):
            return
        books = self.orch.ledger.summary(self.orch.buffer)
        books["rejected_frames"] = dict(self.hub.rejected)
        books["handshakes_refused"] = self.hub.handshakes_refused
        books["trained_steps"] = self.orch.trained_version
        books["finished"] = self.orch.done
        books["groups_untrained_at_finish"] = self._untrained()
        (self.run_dir / "ledger.json").write_text(json.dumps(books, indent=2))

    def _untrained(self) -> list[str]:
        """Groups admitted but not trained when the run stopped: for the exactly-once audit."""
        groups = list(self.orch.buffer.groups.values()) + [g for gs in self.orch.batch_groups.values() for g in gs]
        return sorted(g.admission.group_id for g in groups)


def truncate_metrics(path: Path, version: int) -> None:
    """Drop the records about to be redone: steps after the checkpoint being resumed, and
    evaluation rounds from its version on (the round at that version runs again, same seeds)."""
    def kept(rec: dict) -> bool:
        step = rec.get("step", 0)
        return step < version if rec.get("kind") == "eval" else step <= version

    keep_records(path, kept)

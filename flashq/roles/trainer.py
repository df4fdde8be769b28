"""Trainer process: ask for a batch, take one optimizer step, broadcast the new weights, repeat.

Torch work runs on one executor thread so the event loop keeps answering the socket (heartbeats,
weight-sync replies) while a step computes. With `weight_sync.overlap` (one-rank trainer) the
push of version v runs on a second thread while step v+1 computes its gradients (which only read
the parameters); step v+1 waits for it just before its optimizer changes them, so a push costs the
step only what is left of it by then (`trainer/push_wait_s`). The weight broadcast is vLLM's
trainer engine, whose calls to the inference side come back into this loop as `WeightSyncCall`
round trips.
When the set of rollout workers changes (`Regroup`: one died or a restarted one joined), the
transfer group is rebuilt for the new set before the next push; a push that fails because a
worker died mid-way is retried on the rebuilt group, and one that fails with no worker lost (a
peer stalled past `weight_sync.timeout_s`: on NCCL the group was aborted) on a group rebuilt for
the same workers.
With trainer.world_size > 1 only rank 0 runs this loop; the other ranks follow it
(`_follow`): rank 0 names each collective step (train a batch, push, save, stop) before it
runs it (`trainer.parallel.broadcast_command`), so a push for a regrouped set of engines while
rank 0 waits for data, or a push retried after a worker died, is joined by every rank in order.
"""

from __future__ import annotations

import asyncio
import errno
import importlib
import itertools
import json
import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import numpy as np

from flashq.checkpoint import DiskFull, disk_full, is_disk_full, step_dir
from flashq.config import FlashqConfig
from flashq.failed_batches import record_failure
from flashq.jsonl import keep_records
from flashq.roles.common import connect, free_port, handshake, heartbeat, hello, resolve_model, serve_until_done
from flashq.roles.heap import freeze_startup_heap
from flashq.trainer.offload import OptimizerOffload, give_back_device_memory
from flashq.trainer.parallel import broadcast_command, leave
from flashq.wire.protocol import (
    BatchRequest,
    Heartbeat,
    Regroup,
    Shutdown,
    StepStats,
    TrainBatch,
    WeightSyncCall,
    WeightSyncReply,
)
from flashq.wire.transport import Link

log = logging.getLogger("flashq.trainer")


class TrainerRole:
    def __init__(self, cfg: FlashqConfig, role: str, address: str, run_dir: Path):
        self.cfg = cfg
        self.role = role
        self.address = address
        self.run_dir = run_dir
        self.link: Link | None = None
        self.batches: asyncio.Queue[TrainBatch] = asyncio.Queue()
        self.replies: dict[int, asyncio.Future] = {}
        self.call_ids = itertools.count()
        self.shutdown = asyncio.Event()
        self.regroup: Regroup | None = None  # the newest membership not yet built
        self.membership: Regroup | None = None  # the one the transfer group was last built for
        self.regrouped = asyncio.Event()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
        self.push_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="push")
        self.pending_push: asyncio.Task | None = None  # the last push, perhaps still running
        self.push_wait_s = 0.0  # how long the last step's optimizer waited for it

    async def run(self) -> None:
        from flashq.trainer.learner import Learner

        loop = asyncio.get_running_loop()
        self.loop = loop
        self.base_model = resolve_model(self.cfg)
        resume = self.cfg.resume_from
        weights = resume / "trainer" if resume else self.base_model
        learner = await loop.run_in_executor(self.pool, Learner, self.cfg, weights, self.base_model)
        if resume:
            await loop.run_in_executor(self.pool, learner.load_state, resume / "trainer")
            log.info("resuming from %s at version %d", resume, learner.version)
        if not learner.ranks.is_leader:
            freeze_startup_heap()
            await loop.run_in_executor(self.pool, self._follow, learner)
            return
        # vLLM's weight-transfer modules (seconds of imports) load while the engines start, not
        # after they are ready, when the first push waits on them
        await loop.run_in_executor(self.pool, importlib.import_module, "flashq.engine.weights")
        log.info("%s start-up objects frozen out of garbage collection", f"{freeze_startup_heap():,}")
        ws = self.cfg.weight_sync
        self.port = ws.port or free_port(ws.host)
        self.link = connect(self.cfg, self.address, self.role)
        start = await handshake(self.link, self.cfg, hello(self.role, rendezvous=f"{ws.host}:{self.port}"))
        log.info("trainer ready on %s (%d rank(s)); %d inference rank(s) to feed", learner.device, learner.ranks.world_size, start.inference_world_size)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        record = open_trained_record(self.run_dir / "trained.jsonl", learner.version)
        try:
            await serve_until_done(lambda tg: self._train(learner, start, record), self._read(), heartbeat(self.link, self.cfg))
        finally:
            record.close()

    async def _train(self, learner, start, record) -> None:
        loop = self.loop
        self.pusher = await self._open_pusher(learner, start.inference_world_size)
        self.membership = Regroup(inference_world_size=start.inference_world_size, members=["every rollout worker"], reason="start")
        log.info("weight transfer group ready (%s)", self.pusher.backend)
        if learner.version > 0 or self.cfg.trainer.lora is not None:
            # resumed: the engines start from the base model; give them ours. With LoRA they
            # start without the adapter, which they must serve from the first token
            sync_s = await self._push(learner, learner.version)
            log.info("engines now serve the trainer's weights (version %d, %.2fs)", learner.version, sync_s)
        await self.link.send(BatchRequest(credits=2))  # one batch in hand, one being assembled
        sync_s = 0.0
        offload = OptimizerOffload(learner.optimizer) if self.cfg.trainer.offload_optimizer else None  # colocated
        for step in range(learner.version, self.cfg.trainer.steps):
            t_wait = time.monotonic()
            batch = await self._next_batch(learner)
            wait_s = time.monotonic() - t_wait
            if step + 1 < self.cfg.trainer.steps:
                await self.link.send(BatchRequest(credits=1))
            self.push_wait_s = 0.0
            turn_s = await self._take_turn(offload) if self.cfg.placement.colocate else 0.0
            try:
                metrics = await loop.run_in_executor(self.pool, self._lead, learner, "train", batch)
            except Exception as e:  # this batch may crash every resume: leave word for the coordinator
                record_failure(self.run_dir, learner.version, batch.batch_index, batch.request_ids, e)
                raise
            if self.cfg.placement.colocate:  # before the push: it wakes the engine, whose KV cache takes the memory
                metrics["trainer/offloaded_bytes"] = float(await loop.run_in_executor(self.pool, give_back_device_memory, offload))
                metrics["trainer/turn_s"] = turn_s  # the engines releasing the devices, the optimizer state returning
            if self.pending_push is not None and self.pending_push.done():
                sync_s = self.pending_push.result()  # the previous version's push, overlapped with this step
            self.pending_push = asyncio.ensure_future(self._push(learner, learner.version))
            # a sharded push is every rank's collective: no overlap; the last step's push ends
            # before its stats tell the coordinator that training is done
            overlap = self.cfg.weight_sync.overlap and not learner.ranks.sharded
            if not overlap or learner.version == self.cfg.trainer.steps:
                sync_s = await self._settle_push()
            metrics.update({f"trainer/push_{k}": v for k, v in self.pusher.phases().items()})  # the last finished push's
            metrics.update({"trainer/wait_s": wait_s, "trainer/weight_sync_s": sync_s, "trainer/push_wait_s": self.push_wait_s})
            record.write(json.dumps(trained_record(batch, learner.version, skipped=bool(metrics["train/skipped_nonfinite"]),
                                                  tokens=self.cfg.log.token_audit)) + "\n")
            if self._checkpoint_due(learner.version):
                t0 = time.monotonic()
                await loop.run_in_executor(self.pool, self._lead, learner, "save", learner.version)
                metrics.update({"checkpoint": 1.0, "trainer/checkpoint_s": time.monotonic() - t0})
            await self.link.send(StepStats(step=learner.version, metrics=_scalars(metrics)))
            log.debug("step %d: reward %.3f, staleness max %d, sync %.2fs", learner.version, metrics["reward/mean"], metrics["staleness/max"], sync_s)
        await self._settle_push()
        if learner.ranks.sharded:
            await loop.run_in_executor(self.pool, self._lead, learner, "stop", None)
        # the coordinator may still be evaluating the final weights; the heartbeat loop beside
        # this one raises if it goes silent
        await self.shutdown.wait()
        await loop.run_in_executor(self.pool, self.pusher.close)
        self.push_pool.shutdown(wait=False)

    async def _next_batch(self, learner) -> TrainBatch:
        """The next batch. If the rollout workers change while waiting, push the current
        weights to the new group now: a restarted worker serves nothing until it has them."""
        while True:
            get = asyncio.ensure_future(self.batches.get())
            regrouped = asyncio.ensure_future(self.regrouped.wait())
            waits = {get, regrouped}
            pushing = self.pending_push is not None and not self.pending_push.done()
            if pushing:  # a push that fails while we wait fails the run now, not at the next step
                waits.add(self.pending_push)
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if get in done:
                regrouped.cancel()
                return get.result()
            get.cancel()
            regrouped.cancel()
            if pushing and self.pending_push.done():
                self.pending_push.result()  # raises if it failed
                continue
            if self.regroup is None:
                self.regrouped.clear()
                continue
            await self._settle_push()  # it retries on the new group itself
            sync_s = await self._push(learner, learner.version)
            log.info("version %d pushed to the new group while waiting for a batch (%.2fs)", learner.version, sync_s)

    async def _take_turn(self, offload) -> float:
        """Colocated: the engines give the devices up (the last push done, so nothing is being
        received), and the optimizer's state comes back to the device; seconds taken. A release
        that fails (a worker lost meanwhile) costs only the turn, so training goes on."""
        t0 = time.monotonic()
        await self._settle_push()
        reply = await self._call("release_devices", None, -1)
        if not reply.ok:
            log.warning("the rollout workers did not all release the devices (%s); training beside them", reply.error)
        if offload is not None:
            await self.loop.run_in_executor(self.pool, offload.restore)
        return time.monotonic() - t0

    async def _settle_push(self) -> float:
        """Wait for the last push, if any; its seconds."""
        push, self.pending_push = self.pending_push, None
        return await push if push is not None else 0.0

    def _await_push(self) -> None:
        """On the torch thread, before the optimizer changes the parameters the last push reads."""
        push = self.pending_push
        if push is None:
            return
        t0 = time.monotonic()

        async def settled():
            await asyncio.wait({push})

        asyncio.run_coroutine_threadsafe(settled(), self.loop).result()
        self.push_wait_s = time.monotonic() - t0
        push.result()  # a push that failed for good stops the step before the parameters change

    async def _push(self, learner, version: int) -> float:
        """Push the weights of `version` (the current parameters), first rebuilding the transfer
        group if the rollout workers changed. If a push fails (a worker died mid-push, or a peer
        stalled past the deadline and the group was aborted), wait for the coordinator's
        Regroup; if none comes (no worker was lost), rebuild the group on the same workers. Then
        push again, five tries in all."""
        loop, tries = self.loop, 0
        pool = self._pushing_thread(learner)
        while True:
            try:
                if self.regroup is not None:
                    await self._rebuild(learner)
                return await loop.run_in_executor(pool, self._lead, learner, "push", version)
            except Exception as e:  # noqa: BLE001 - retried on a rebuilt group, five times at most
                tries += 1
                if not self.cfg.fault.restart_workers or tries > 5:
                    raise
                log.warning("weight push %d failed (%s); waiting for the rollout workers to regroup", learner.version, e)
                try:
                    await asyncio.wait_for(self.regrouped.wait(), self.cfg.fault.worker_timeout_s + self.cfg.transport.heartbeat_s * 2)
                except asyncio.TimeoutError:
                    if self.regroup is None:  # no worker was lost: the same workers, on a fresh group
                        self.regroup = msgspec.structs.replace(self.membership, reason=f"push {version} failed: {e}")

    def _pushing_thread(self, learner) -> ThreadPoolExecutor:
        """Where pushes and transfer-group rebuilds run: the torch thread on a sharded trainer (a
        push is a collective of every rank, between steps); else a thread of their own, so a
        push retried on a rebuilt group never waits for a step that waits for the push."""
        return self.pool if learner.ranks.sharded else self.push_pool

    async def _open_pusher(self, learner, inference_world_size: int):
        """The trainer's end of a weight-transfer group with the engines, hosted on self.port."""
        from flashq.engine.weights import WeightPusher

        ws = self.cfg.weight_sync
        return await self.loop.run_in_executor(
            self._pushing_thread(learner),
            lambda: WeightPusher(ws, learner.model, self._rpc, inference_world_size, self.port, learner.device,
                                 wire_dtype=engine_dtype(self.cfg), adapter=self.cfg.trainer.lora is not None,
                                 colocate=self.cfg.placement.colocate),
        )

    async def _rebuild(self, learner) -> None:
        regroup, self.regroup = self.regroup, None
        self.regrouped.clear()
        ws = self.cfg.weight_sync
        await self.loop.run_in_executor(self._pushing_thread(learner), self.pusher.close)
        self.port = ws.port or free_port(ws.host)  # a fresh rendezvous: the old store may linger
        try:
            self.pusher = await self._open_pusher(learner, regroup.inference_world_size)
        except Exception:
            if self.regroup is None:  # nothing newer arrived: build this membership again on the retry
                self.regroup = regroup
                self.regrouped.set()
            raise
        self.membership = regroup
        log.info("weight transfer group rebuilt for %s (%s)", ", ".join(regroup.members) or "no rollout worker", regroup.reason)

    def _lead(self, learner, kind: str, payload):
        """Rank 0, on the torch thread: name the step to the other ranks, then run it."""
        broadcast_command(learner.ranks, kind, payload)
        return self._run(learner, self.pusher, kind, payload)

    def _run(self, learner, pusher, kind: str, payload):
        if kind == "train":
            return learner.train_step(payload, self._await_push if learner.ranks.is_leader else None)
        if kind == "push":
            learner.updated.wait()  # on a GPU the optimizer's kernels may still be queued
            return pusher.push(payload)
        if kind == "save":
            return save_checkpoint(learner, step_dir(self.run_dir, payload, tmp=True), self.base_model)
        if kind == "stop":
            return leave(learner.ranks)
        raise ValueError(f"unknown trainer step {kind!r}")

    def _follow(self, learner) -> None:
        """Ranks other than 0: run each step rank 0 names (every one is a collective); no socket
        of their own. A push rank 0 could not finish is retried by rank 0, so it is not fatal here."""
        from flashq.engine.weights import WeightPusher

        ws = self.cfg.weight_sync
        pusher = WeightPusher(ws, learner.model, None, 0, 0, learner.device, rank=learner.ranks.rank, wire_dtype=engine_dtype(self.cfg))
        while (step := broadcast_command(learner.ranks))[0] != "stop":
            kind, payload = step
            try:
                self._run(learner, pusher, kind, payload)
            except Exception as e:  # noqa: BLE001 - only a push; anything else ends the rank
                if kind != "push":
                    raise
                log.warning("rank %d: push %s broke off (%s); rank 0 retries it", learner.ranks.rank, payload, e)
        log.info("rank %d: done at version %d", learner.ranks.rank, learner.version)
        pusher.close()
        leave(learner.ranks)

    def _checkpoint_due(self, version: int) -> bool:
        every = self.cfg.trainer.checkpoint_every
        return version == self.cfg.trainer.steps or (every > 0 and version % every == 0)

    def _rpc(self, method: str, payload, version: int) -> None:
        """Called from the torch thread: one weight-sync round trip through the coordinator."""
        future = asyncio.run_coroutine_threadsafe(self._call(method, payload, version), self.loop)
        reply = future.result(timeout=self.cfg.weight_sync.timeout_s)
        if not reply.ok:
            raise RuntimeError(f"weight sync {method} failed: {reply.error}")

    async def _call(self, method: str, payload, version: int) -> WeightSyncReply:
        call_id = next(self.call_ids)
        fut = self.loop.create_future()
        self.replies[call_id] = fut
        await self.link.send(WeightSyncCall(call_id=call_id, method=method, payload=payload, version=version))
        return await fut

    async def _read(self) -> None:
        while True:
            msg = await self.link.recv()
            if isinstance(msg, TrainBatch):
                self.batches.put_nowait(msg)
            elif isinstance(msg, WeightSyncReply):
                fut = self.replies.pop(msg.call_id, None)
                if fut is None:
                    log.warning("weight sync reply for unknown call %d", msg.call_id)
                else:
                    fut.set_result(msg)
            elif isinstance(msg, Regroup):
                self.regroup = msg
                self.regrouped.set()
            elif isinstance(msg, Shutdown):
                self.shutdown.set()
            elif not isinstance(msg, Heartbeat):
                log.warning("trainer: ignoring unexpected %s", type(msg).__name__)


def engine_dtype(cfg: FlashqConfig):
    from flashq.trainer.learner import DTYPES

    return DTYPES[cfg.model.dtype]


def save_checkpoint(learner, tmp: Path, base_model) -> None:
    """The trainer's half of a checkpoint into `tmp`. A disk without room for it stops the run
    (`DiskFull`, naming the path) before anything is written; a write that fails for space
    anyway removes the half-written folder, which may be what fills the disk."""
    need = checkpoint_bytes(learner.model)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(tmp.parent).free
    if free < need:
        raise DiskFull(errno.ENOSPC, f"no space for checkpoint {tmp}: it needs about {need / 2**20:,.0f} MiB, "
                                     f"{free / 2**20:,.0f} MiB are free (free space, or lower trainer.keep_checkpoints)")
    try:
        learner.save(tmp / "trainer", base_model)
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise disk_full(tmp, e) from e


def checkpoint_bytes(model) -> int:
    """An upper bound on the trainer's half: float32 weights and AdamW's two moments per parameter."""
    return 3 * 4 * sum(p.numel() for p in model.parameters())


def open_trained_record(path: Path, version: int):
    """Append to the record of trained samples, first dropping what was trained after the
    checkpoint being resumed (those updates were lost with the trainer that made them)."""
    keep_records(path, lambda rec: rec["trainer_version"] < version)
    return path.open("a", buffering=1)


def trained_record(batch: TrainBatch, version_after: int, skipped: bool = False, tokens: bool = False) -> dict:
    """What the trainer trained at version `version_after - 1`: request ids and their token
    version range, for auditing staleness and exactly-once afterwards. A batch skipped for a
    non-finite gradient is recorded with the reason (its samples were consumed, not learned).
    `tokens` (log.token_audit): each request's trained token ids too (loss mask 1). A request
    split into segments (several sequences) is one entry over all of them, its ids in segment
    order, and `segments` maps it to its number of sequences."""
    versions = np.asarray(batch.versions)
    offsets = batch.response_offsets
    of = batch.sample_index()
    first = batch.sample_starts()
    ends = [*first[1:].tolist(), len(of)]
    per_request, segments = [], {}
    for start, end in zip(first.tolist(), ends):
        rid, lo, hi = batch.request_ids[start], offsets[start], offsets[end]  # a sample's sequences are consecutive
        v = versions[lo:hi]
        per_request.append([rid, int(v.min()) if len(v) else -1, int(v.max()) if len(v) else -1, int(len(v))])
        if end - start > 1:
            segments[rid] = end - start
        if tokens:
            ids = np.asarray(batch.response_ids[lo:hi])
            mask = batch.loss_mask[lo:hi] if len(batch.loss_mask) else np.ones(len(ids), np.uint8)
            per_request[-1].append(ids[mask == 1].tolist())
    record = {"trainer_version": version_after - 1, "batch_index": batch.batch_index, "requests": per_request}
    if segments:
        record["segments"] = segments
    if skipped:
        record["skipped"] = "non-finite gradient norm"
    return record


def _scalars(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, list):
            for i, c in enumerate(v):
                out[f"{k}/{i}"] = float(c)
        else:
            out[k] = float(v)
    return out

"""Which CPU cores and CUDA devices each role gets, checked before anything starts.

A GPU can hold one role of a split run: NCCL refuses two ranks of one group on one device, and a
vLLM engine sized by `gpu_memory_utilization` leaves no room for a trainer beside it. So roles
that would share a device are refused by name, at load for the devices placement names and at
launch for the ones it leaves out: with GPUs visible and no `placement.*_gpus`, rollout workers
take the first devices (tensor_parallel_size each) and the trainer the next ones, or the launch
stops and says how many are needed.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from flashq.config import ConfigError, FlashqConfig

log = logging.getLogger(__name__)


def gpu_roles(cfg: FlashqConfig) -> dict[str, list[int]]:
    """Role -> the CUDA devices placement names for it (only roles it names)."""
    pl, tp = cfg.placement, cfg.rollout.tensor_parallel_size
    out = {}
    if pl.rollout_gpus:
        for i in range(cfg.rollout.num_workers):
            out[f"rollout-{i}"] = pl.rollout_gpus[i * tp:(i + 1) * tp]
    if pl.trainer_gpus:
        out["trainer"] = list(pl.trainer_gpus)
    return out


def check_gpu_placement(cfg: FlashqConfig) -> None:
    """The devices placement names: enough for each role, and none named for two ranks (with
    placement.colocate, the one device the trainer and the engine share)."""
    pl, tp, workers = cfg.placement, cfg.rollout.tensor_parallel_size, cfg.rollout.num_workers
    if pl.rollout_gpus and len(pl.rollout_gpus) != workers * tp:
        raise ValueError(f"placement.rollout_gpus names {len(pl.rollout_gpus)} device(s); {workers} rollout worker(s) "
                         f"x tensor_parallel_size {tp} need {workers * tp}")
    if pl.trainer_gpus and len(pl.trainer_gpus) != cfg.trainer.world_size:
        raise ValueError(f"placement.trainer_gpus names {len(pl.trainer_gpus)} device(s) for trainer.world_size "
                         f"{cfg.trainer.world_size} (one per rank)")
    if pl.colocate:
        if pl.rollout_gpus and pl.trainer_gpus and pl.rollout_gpus != pl.trainer_gpus:
            raise ValueError(f"placement.colocate: the trainer and the rollout worker take turns on one device, but "
                             f"placement names cuda:{pl.rollout_gpus[0]} and cuda:{pl.trainer_gpus[0]}")
        return
    holder: dict[int, str] = {}
    for role, devices in gpu_roles(cfg).items():
        for d in devices:
            if d in holder:
                who = f"{holder[d]} and {role}" if holder[d] != role else f"two ranks of {role}"
                raise ValueError(f"placement: {who} would share cuda:{d}; a device holds one rank of one role "
                                 f"(NCCL refuses two ranks of a group on one device)")
            holder[d] = role


def visible_gpus() -> int:
    """CUDA devices this launch can give out, without importing torch: CUDA_VISIBLE_DEVICES if
    set, else the NVIDIA driver's list."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def place_gpus(cfg: FlashqConfig, available: int) -> FlashqConfig:
    """At launch: with `available` GPUs and a trainer that would use one, give every role its own
    devices when placement names none (with placement.colocate, cuda:0 to both), or refuse;
    devices placement names must exist."""
    if available == 0 or cfg.trainer.device == "cpu":
        return cfg
    pl = cfg.placement
    rollout_need = cfg.rollout.num_workers * cfg.rollout.tensor_parallel_size
    need = 1 if pl.colocate else rollout_need + cfg.trainer.world_size
    named = [*pl.rollout_gpus, *pl.trainer_gpus]
    if missing := sorted(d for d in named if d >= available):
        raise ConfigError(f"placement names cuda:{', cuda:'.join(map(str, missing))}; {available} device(s) are visible")
    if pl.rollout_gpus and pl.trainer_gpus:
        return cfg
    if pl.rollout_gpus or pl.trainer_gpus:
        unset = "trainer_gpus" if pl.rollout_gpus else "rollout_gpus"
        raise ConfigError(f"placement names some GPUs but not placement.{unset}: those roles would default to cuda:0 "
                          f"beside the others; name both")
    if need > available:
        raise ConfigError(f"{rollout_need} rollout device(s) and {cfg.trainer.world_size} trainer device(s) need {need} GPUs; "
                          f"{available} visible. Lower rollout.num_workers or trainer.world_size, or set trainer.device: cpu")
    cfg = cfg.model_copy(deep=True)
    cfg.placement.rollout_gpus = list(range(rollout_need))
    cfg.placement.trainer_gpus = [0] if pl.colocate else list(range(rollout_need, need))
    return cfg


def cuda_devices(cfg: FlashqConfig, role: str) -> str | None:
    """CUDA_VISIBLE_DEVICES for a role under placement.*_gpus (None: leave the environment's)."""
    devices = gpu_roles(cfg).get(role)
    return ",".join(map(str, devices)) if devices else None


def check_cpus(cfg: FlashqConfig) -> None:
    available = os.sched_getaffinity(0)
    for kind in ("coordinator", "rollout", "reward", "trainer", "rollout_frontend"):
        cpus = getattr(cfg.placement, kind)
        missing = set(cpus) - available
        if missing:
            raise ConfigError(f"placement.{kind} names CPU(s) {sorted(missing)}; this machine offers {sorted(available)}")


def pin(cpus: list[int]):
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def each_thread(apply) -> None:
    """`apply(tid)` to every thread of this process, passing over them again until none is new
    (a thread may start while they are walked); a thread that ended meanwhile is passed over."""
    done: set[int] = set()
    while threads := {int(tid) for tid in os.listdir("/proc/self/task")} - done:
        for tid in threads:
            try:
                apply(tid)
            except ProcessLookupError:
                pass
        done |= threads


def pin_process(cores: list[int]) -> None:
    """Move every thread of this process to `cores` (threads started later inherit it); the
    engine processes started before keep theirs. With the rollout worker's frontend on its own
    core, the engine has one to itself: the calculator agent's episodes/s rose from 28.6 to 61.8,
    the environment class's from 47.2 to 82.4 (40-step runs, same SFT start)."""
    try:
        each_thread(lambda tid: os.sched_setaffinity(tid, cores))
    except OSError as e:  # a thread that ended is passed over by each_thread
        raise RuntimeError(f"placement.rollout_frontend {cores}: this host cannot run there ({e})") from None


def lower_priority(nice: int) -> None:
    """Set every thread of this process to niceness `nice` (Linux keeps it per thread; threads and
    processes started later inherit their creator's), and this process's autogroup too: with
    autogroups on (most desktop and many server kernels), the scheduler first shares the CPU
    fairly between sessions, and every role is its own session, so a thread's niceness alone
    would change nothing against the trainer. The autogroup only when this process leads its
    session (the launcher starts each role so). Never raised (that needs privileges). Before the
    engine starts, so it inherits it."""
    if nice <= 0:
        return

    def lower(tid: int) -> None:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)

    each_thread(lower)
    autogroup = Path("/proc/self/autogroup")
    if os.getsid(0) != os.getpid():  # a session shared with others (a test runner, a Ray worker): theirs too
        return
    try:
        current = int(autogroup.read_text().split("nice")[1])
    except (FileNotFoundError, IndexError, ValueError):  # a kernel without autogroups: niceness alone is enough
        return
    for _ in range(20):
        if current >= nice:
            return
        try:
            autogroup.write_text(str(nice))
            return
        except BlockingIOError:  # the kernel takes one autogroup change every 100 ms, machine-wide
            time.sleep(0.15)
        except OSError as e:  # a read-only /proc (a container): the threads' niceness is what is left
            log.warning("placement.rollout_nice: cannot lower this session's autogroup (%s); under autogroups the "
                        "trainer keeps no priority over generation", e)
            return
    log.warning("placement.rollout_nice: the kernel kept refusing to lower this session's autogroup")

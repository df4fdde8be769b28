"""`flashq launch`: start every role of a run as its own process on this machine, watch them,
and stop them together.

Each role runs exactly as it would on its own host (`flashq role NAME --config FILE --connect
ADDR`), from the resolved config written into the run directory, so any role can be restarted
or debugged by hand with the command shown in `--dry-run`. Output lines are prefixed with the
role name, shown on the terminal and kept in `<run_dir>/logs/<role>.log`.

Faults (`fault.*`): a rollout or reward worker that exits is started again (the coordinator has
already given its work to the others); if the trainer or the coordinator dies, every role is
stopped and the run resumes from its newest checkpoint. Each restart is said on the terminal and
recorded in `<run_dir>/restarts.jsonl`. Without a restart left, the launcher says which role
failed, with its exit status and the end of its log, and stops the rest; Ctrl-C stops everything.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from flashq.checkpoint import EXIT_DISK_FULL
from flashq.config import ConfigError, FlashqConfig, dump_config, role_view
from flashq.credentials import TOKEN_ENV, RunCredentials
from flashq.placement import check_cpus, cuda_devices, pin, place_gpus, visible_gpus

RESUME = -1  # _run_roles: the trainer or coordinator died; resume from the newest checkpoint
COLORS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_green", "bright_blue"]
GRACE_S = 15.0


LINE_LIMIT = 1 << 20  # longest line of a role's output read whole


class LocalProcess:
    """A role as a child of the launcher, in its own process group (so its vLLM engine
    processes are signalled with it)."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc

    @classmethod
    async def start(cls, cmd: list[str], env: dict[str, str], cpus: list[int]) -> LocalProcess:
        return cls(await asyncio.create_subprocess_exec(
            *cmd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            preexec_fn=pin(cpus), limit=LINE_LIMIT,
        ))

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def readline(self) -> bytes:
        """The next line, or a `LINE_LIMIT` piece of a longer one. (asyncio's own readline raises
        on a longer line: the output would stop being read, and the role would block on its next
        write, silent to every other role.)"""
        try:
            return await self.proc.stdout.readuntil(b"\n")
        except asyncio.IncompleteReadError as e:  # the end of the output
            return e.partial
        except asyncio.LimitOverrunError as e:
            return await self.proc.stdout.read(e.consumed)

    def signal(self, sig: int) -> None:
        _signal_group(self.proc.pid, sig)


@dataclass
class RoleProcess:
    name: str
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    color: str
    cpus: list[int] = field(default_factory=list)
    proc: LocalProcess | None = None  # or a `ray_backend.RayProcess`: the same four members
    tail: deque = field(default_factory=lambda: deque(maxlen=30))


def resolve_run(cfg: FlashqConfig) -> FlashqConfig:
    """Fill in what a launch decides: the run directory and the coordinator port."""
    from flashq.roles.common import free_port

    cfg = cfg.model_copy(deep=True)
    if cfg.log.run_dir is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        cfg.log.run_dir = cfg.log.root / f"{cfg.name}-{stamp}"
    if cfg.transport.port == 0:
        cfg.transport.port = free_port(cfg.transport.host)
    return cfg


def refuse_used_run_dir(cfg: FlashqConfig) -> None:
    """A new run in a directory that holds another's metrics or checkpoints would append to its
    metrics and, at the end, fail to write over its final checkpoint: refuse at the start."""
    run_dir = cfg.log.run_dir
    if run_dir is None:
        return
    used = [name for name in ("metrics.jsonl", "checkpoints") if (run_dir / name).exists()]
    if used:
        raise ConfigError(f"log.run_dir {run_dir} already holds a run ({', '.join(used)}): continue it with "
                          f"`flashq launch CONFIG --resume {run_dir}`, or give this run another log.run_dir")


def address_of(cfg: FlashqConfig) -> str:
    return f"tcp://{cfg.transport.host}:{cfg.transport.port}"


def role_specs(cfg: FlashqConfig, config_file: Path, credentials: RunCredentials | None = None) -> list[RoleProcess]:
    """Each role's command and environment; with `credentials`, each role's own token in it."""
    run_dir = cfg.log.run_dir
    specs = []
    for i, role in enumerate(cfg.role_names()):
        env = dict(os.environ)
        env.pop(TOKEN_ENV, None)
        env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_LOGGING_LEVEL=cfg.log.vllm_level)
        if credentials is not None and role != "coordinator":
            env[TOKEN_ENV] = credentials.token(role)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if role.startswith("rollout-"):
            env.setdefault("OMP_NUM_THREADS", str(cfg.rollout.omp_threads))
        else:
            env.setdefault("OMP_NUM_THREADS", str(cfg.trainer.threads if role == "trainer" else 1))
        cmd = [sys.executable, "-m", "flashq.cli", "role", role, "--config", str(config_file), "--connect", address_of(cfg)]
        if role == "trainer" and cfg.trainer.world_size > 1:  # torchrun starts the ranks and stops them all if one fails
            cmd[1:2] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.trainer.world_size}", "-m"]
        cpus = getattr(cfg.placement, role.split("-")[0])
        gpus = cuda_devices(cfg, role)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        specs.append(RoleProcess(role, cmd, env, run_dir / "logs" / f"{role}.log", COLORS[i % len(COLORS)], cpus))
    return specs


def dry_run(cfg: FlashqConfig) -> str:
    config_file = cfg.log.run_dir / "config.yaml"
    out = []
    for spec in role_specs(cfg, config_file):
        line = " ".join(spec.cmd[1:])
        line = line.replace("-m torch.distributed.run", "torchrun", 1) if "torch.distributed.run" in line else line.replace("-m flashq.cli", "flashq")
        gpus = cuda_devices(cfg, spec.name)
        out.append(f"# --- {spec.name}\n# {f'CUDA_VISIBLE_DEVICES={gpus} ' if gpus is not None else ''}{line}")
        out.append(yaml.safe_dump(role_view(cfg, spec.name), sort_keys=False))
    return "\n".join(out)


class Launcher:
    def __init__(self, cfg: FlashqConfig, show_progress: bool | None = None, backend: str = "local", external=()):
        """backend "ray": every role runs in a Ray actor wherever Ray places it (`ray_backend`).
        `external`: worker roles someone else starts (and restarts); the run waits for them."""
        from rich.console import Console

        self.cfg = cfg
        self.run_dir: Path = cfg.log.run_dir
        self.console = Console(highlight=False)
        self.show_progress = self.console.is_terminal if show_progress is None else show_progress
        self.roles: list[RoleProcess] = []
        self.stopping = False
        self.restarts = 0
        self.report_job: asyncio.Future | None = None  # report.png and summary.json, once the coordinator is done
        self.backend = backend
        self.ray = None
        self.external = set(external)

    def run(self) -> int:
        if self.backend == "local":
            check_cpus(self.cfg)
            self.cfg = place_gpus(self.cfg, visible_gpus())
        if self.cfg.env is not None:  # a wrong env name fails here, not in every rollout worker
            from flashq.envs.base import load_env_class

            field = "agent" if self.cfg.env.agent is not None else "name"
            try:
                load_env_class(getattr(self.cfg.env, field))
            except ValueError as e:
                raise ConfigError(f"env.{field}: {e}") from None
        return asyncio.run(self._main())

    async def _main(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.say(f"[bold]flashq[/] run {self.run_dir}  (async_ratio={self.cfg.async_ratio:g}, {len(self.cfg.role_names())} processes)")
        self._fetch_model()
        if self.cfg.sft.warm_start:
            code = await self._warm_start()
            if code:
                return code
        try:
            while True:
                code = await self._run_roles()
                if code != RESUME:
                    return code
                from flashq.resume import resume_config

                self.cfg = resolve_run(resume_config(self.cfg, str(self.run_dir), []))
                self.say(f"[bold yellow]resuming from {self.cfg.resume_from}[/]")
        finally:
            if self.ray is not None:
                self.ray.close()

    def _fetch_model(self) -> None:
        """Fetch, build or convert the model once, here, before any role starts: the roles run
        offline and resolve the same name to the same folder (`flashq/models/sources.py`)."""
        from flashq.models.sources import describe, model_path

        if about := describe(self.cfg.model):
            self.say(f"model {about}")
        self.say(f"model {self.cfg.model.name}: {model_path(self.cfg.model, fetch=True)}")

    def _can_restart(self, role: RoleProcess, status: int) -> bool:
        """A role that exits with an error before every role of this start connected (a bad
        config, a missing package) would fail again, so it is reported instead; one killed by a
        signal is a fault at any time."""
        f = self.cfg.fault
        if self.restarts >= f.max_restarts or self._coordinator_done() or self.stopping:
            return False
        if status > 0 and not self._run_started():
            return False
        if role.name.startswith(("rollout-", "reward-")):
            return f.restart_workers
        from flashq import checkpoint

        latest = checkpoint.latest(self.run_dir)
        return f.resume_run and latest is not None and checkpoint.version_of(latest) < self.cfg.trainer.steps

    def _run_started(self) -> bool:
        """The coordinator writes `started.json` once every role has connected."""
        started = self.run_dir / "started.json"
        return started.exists() and started.stat().st_mtime >= self.roles_started_at

    def _record_restart(self, role: RoleProcess, status: int, action: str) -> None:
        self.restarts += 1
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        self.say(f"[bold yellow]{role.name} {how}; {action} (restart {self.restarts} of {self.cfg.fault.max_restarts})[/]")
        with (self.run_dir / "restarts.jsonl").open("a") as f:
            f.write(json.dumps({"time": time.time(), "role": role.name, "status": status, "action": action}) + "\n")

    async def _start(self, role: RoleProcess) -> None:
        if self.ray is not None:
            role.proc = await self.ray.start(role)
        else:
            role.proc = await LocalProcess.start(role.cmd, role.env, role.cpus)

    async def _run_roles(self) -> int:
        """Start every role and watch them until the run finishes (0), fails (1), is interrupted
        (130), or lost its trainer or coordinator and should resume from a checkpoint (RESUME)."""
        from flashq.roles.common import resolve_model

        config_file = self.run_dir / "config.yaml"
        if self.backend == "ray":
            from flashq.ray_backend import RayRoles

            self.ray = self.ray or RayRoles(self.cfg)
            self.cfg = self.ray.place(self.cfg)  # each role's actor; the addresses of the nodes they landed on
            self.say(f"ray: {self.ray.describe()}")
        dump_config(self.cfg, config_file)
        resolve_model(self.cfg)  # fetched before the first start; a model gone since fails here, before the roles
        specs = role_specs(self.cfg, config_file, RunCredentials.ensure(self.run_dir))
        self.roles = [r for r in specs if r.name not in self.external]
        for r in specs:
            if r.name in self.external:
                token = f"{TOKEN_ENV}=$({sys.executable} -m flashq.cli token {r.name} --run-dir {self.run_dir})"
                self.say(f"start {r.name} yourself: {token} {' '.join(r.cmd)}")
        loop = asyncio.get_running_loop()
        interrupted = asyncio.Event()
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
        loop.add_signal_handler(signal.SIGTERM, interrupted.set)
        self.stopping = False
        self.roles_started_at = time.time()
        for r in self.roles:
            await self._start(r)
        pumps = [asyncio.create_task(self._pump_output(r)) for r in self.roles]
        exits = {asyncio.create_task(_exit_status(r.proc)): r for r in self.roles}
        interrupt = asyncio.create_task(interrupted.wait())
        live = self._live()
        code = 0
        try:
            if live:
                live.start()
            pending = set(exits)
            early_exit: tuple[RoleProcess, float] | None = None  # a role that ended with 0 first
            while pending:
                timeout = None if early_exit is None else max(0.0, early_exit[1] - time.monotonic())
                done, _ = await asyncio.wait(pending | {interrupt}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if interrupt in done:
                    self.say("[bold yellow]interrupted: stopping every role[/]")
                    code = 130
                    break
                if not done:  # the coordinator did not follow the early exit: it was a failure
                    code = 1
                    self._report_failure(early_exit[0], 0)
                    break
                failed = []
                if any(task.result() == EXIT_DISK_FULL for task in done):
                    self.stopping = True  # no restart or resume: it would meet the same full disk
                for task in done:
                    pending.discard(task)
                    role, status = exits[task], task.result()
                    if status != 0 and self._can_restart(role, status):
                        if role.name in ("trainer", "coordinator"):
                            self._record_restart(role, status, "resuming the run from its newest checkpoint")
                            code = RESUME
                            break
                        self._record_restart(role, status, "starting it again")
                        role.proc.signal(signal.SIGKILL)  # its engine may outlive it
                        await self._start(role)
                        pumps.append(asyncio.create_task(self._pump_output(role)))
                        restarted = asyncio.create_task(_exit_status(role.proc))
                        exits[restarted] = role
                        pending.add(restarted)
                        continue
                    if status != 0:
                        failed.append((role, status))
                    elif role.name == "coordinator":
                        self._start_report()  # its metrics are final: plot while the others shut down
                        await self._await_clean_exit(pending, exits)
                        pending.clear()
                    elif early_exit is None:
                        early_exit = (role, time.monotonic() + GRACE_S)
                if code == RESUME:
                    break
                if failed and not self._coordinator_done():  # after a clean finish, exits are only warnings
                    code = 1
                    # one failure brings others down (the coordinator notices the dead peer): gather
                    # what else exits in the next moment and name the likely root cause first
                    more, _ = await asyncio.wait(pending, timeout=2.0)
                    failed += [(exits[t], t.result()) for t in more if t.result() != 0]
                    failed.sort(key=lambda rs: (rs[0].name == "coordinator", rs[1] > 0))
                    for role, status in failed:
                        self._report_failure(role, status)
                    break
        finally:
            await self._stop_all()
            await asyncio.gather(*pumps, return_exceptions=True)
            if live:
                live.stop()
        if code == 0 and self.restarts:
            self.say(f"[yellow]{self.restarts} restart(s) during the run: {self.run_dir / 'restarts.jsonl'}[/]")
        if code == 0:
            await self._report()
            self.say(f"[bold green]done[/]: metrics in {self.run_dir / 'metrics.jsonl'}, logs in {self.run_dir / 'logs'}")
        return code

    async def _warm_start(self) -> int:
        """Run `flashq sft` first (its output prefixed "sft"); RL then starts from its checkpoint."""
        from rich.markup import escape

        sft_config = self.run_dir / "sft-config.yaml"
        dump_config(self.cfg, sft_config)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flashq.cli", "sft", str(sft_config),
            env=dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, preexec_fn=pin(self.cfg.placement.trainer),
        )
        lines = []
        with (self.run_dir / "logs" / "sft.log").open("a") as log_file:
            while raw := await proc.stdout.readline():
                line = raw.decode(errors="replace").rstrip()
                lines.append(line)
                log_file.write(line + "\n")
                self.say(f"[white]{'sft':>11}[/] | {escape(line)}")
        if await proc.wait() != 0:
            self.say("[bold red]SFT warm start failed[/]; see the lines above")
            return 1
        path = Path(lines[-1].strip())
        summary = path / "flashq_sft.json"
        if summary.exists():
            (self.run_dir / "sft.json").write_text(summary.read_text())
        self.cfg = self.cfg.model_copy(deep=True)
        self.cfg.model.name = str(path)
        self.cfg.sft.warm_start = False  # the written config must not warm-start again on resume
        return 0

    def _start_report(self) -> None:
        """Write report.png and summary.json on a thread, from the coordinator's final metrics,
        while the other roles end (plotting took about a second after they had all ended)."""
        from flashq.reporting.report import write_report

        self.report_job = asyncio.get_running_loop().run_in_executor(None, write_report, self.run_dir)

    async def _report(self) -> None:
        from rich.panel import Panel

        if self.report_job is None:
            self._start_report()
        try:
            png, text = await self.report_job
        except Exception as e:  # noqa: BLE001 - a report problem must not fail a finished run
            self.say(f"[yellow]could not write the report: {e}[/]")
            return
        self.console.print(Panel(text + f"\nplot: {png}", title="summary"))

    def _coordinator_done(self) -> bool:
        coord = self.roles[0]
        return coord.proc is not None and coord.proc.returncode == 0

    async def _await_clean_exit(self, pending: set, exits: dict) -> None:
        if not pending:
            return
        done, still = await asyncio.wait(pending, timeout=GRACE_S)
        for task in done:
            role = exits[task]
            if task.result() != 0:
                self.say(f"[yellow]{role.name} exited with status {task.result()} after the run finished[/]")
        for task in still:
            self.say(f"[yellow]{exits[task].name} did not exit after shutdown; stopping it[/]")

    def _report_failure(self, role: RoleProcess, status: int) -> None:
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        if status == 0:
            how = "exited before the run finished"
        elif status == EXIT_DISK_FULL:
            how = "ran out of disk space writing a checkpoint"
        self.say(f"[bold red]role {role.name} {how}[/]; stopping the run. Last lines of {role.log_path}:")
        for line in role.tail:
            self.say(f"  [dim]{role.name}>[/] {_escape(line)}")

    async def _stop_all(self) -> None:
        self.stopping = True
        alive = [r for r in self.roles if r.proc is not None and r.proc.returncode is None]
        for r in alive:
            r.proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for r in alive:
            try:
                await asyncio.wait_for(_exit_status(r.proc), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                r.proc.signal(signal.SIGKILL)
                await _exit_status(r.proc)
        for r in self.roles:  # engine subprocesses outlive their role if it was killed hard
            if r.proc is not None:
                r.proc.signal(signal.SIGKILL)

    async def _pump_output(self, role: RoleProcess) -> None:
        with role.log_path.open("a") as log_file:
            while True:
                raw = await role.proc.readline()
                if not raw:
                    return
                line = raw.decode(errors="replace").rstrip()
                log_file.write(line + "\n")
                log_file.flush()
                role.tail.append(line)
                self.say(f"[{role.color}]{role.name:>11}[/] | {_escape(line)}")

    def _live(self):
        if not self.show_progress:
            return None
        from rich.live import Live

        from flashq.reporting.progress import ProgressView

        view = ProgressView(self.run_dir / "metrics.jsonl", self.cfg.trainer.steps, self.cfg.name)
        return Live(view, console=self.console, refresh_per_second=2, transient=False)

    def say(self, text: str) -> None:
        self.console.print(text, soft_wrap=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


async def _exit_status(proc: LocalProcess) -> int:
    """The role's exit status as soon as it exits. (`Process.wait()` also waits for the output
    pipe to close, which a surviving child of the role, e.g. a vLLM engine, can hold open.)"""
    while proc.returncode is None:
        await asyncio.sleep(0.1)
    return proc.returncode


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

"""`flashq launch --backend ray`: the same roles, placed by Ray across the nodes of a cluster.

Each role gets a `RoleHost` actor, reserved with the CPUs, GPUs and custom resources that
`ray.<kind>` names, so Ray decides which node runs it. The actor runs the very command local mode
runs (`flashq role NAME --config FILE --connect ADDR`) as a subprocess on its node; the launcher
drives it through `RayProcess`, which looks to the launcher like a local child process (exit
status, output lines, signals), so watching, restarts and resume are the launcher's own.

Addresses come from where the actors landed: the coordinator binds on its node's IP (a free port
found there) and every role connects to it; the trainer hosts the weight-transfer group on its
node's IP. Traffic between nodes is then off loopback: use `transport.curve_keys` (CurveZMQ) and
keep the weight broadcast on a private network. The run directory must be on a filesystem every
node sees, as it is under Slurm.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque

import ray

from flashq.config import FlashqConfig

POLL_S = 0.25


@ray.remote
class RoleHost:
    """Lives on the node Ray chose; runs one role there as a subprocess in its own process group."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lines: deque[str] = deque()
        self.reader: threading.Thread | None = None

    def node(self) -> dict:
        return {"ip": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ray.util.get_node_ip_address(), 0))
            return s.getsockname()[1]

    def start(self, args: list[str], env: dict[str, str]) -> int:
        """`args` after the interpreter (this node's own Python runs them); `env` on top of this
        actor's environment, which carries the devices Ray assigned it."""
        self.lines.clear()
        self.proc = subprocess.Popen(
            [sys.executable, *args], env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, text=True, errors="replace",
        )
        self.reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self.reader.start()
        return self.proc.pid

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append(line)

    def read(self, pid: int) -> list[str] | None:
        """New output lines of process `pid`; None once it has exited and everything was read
        (or a restart replaced it)."""
        if self.proc is None or self.proc.pid != pid:
            return None
        out = [self.lines.popleft() for _ in range(len(self.lines))]
        if not out and self.proc.poll() is not None and not self.reader.is_alive():
            return None
        return out

    def poll(self, pid: int) -> int | None:
        if self.proc is None or self.proc.pid != pid:
            return -signal.SIGKILL  # replaced by a restart: it is gone
        return self.proc.poll()

    def signal(self, pid: int, sig: int) -> None:
        if self.proc is not None and self.proc.pid == pid:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


class RayProcess:
    """The launcher's view of a role in a `RoleHost`: the members of `launch.LocalProcess`. A
    lost actor (its node died) reads as a process killed by SIGKILL."""

    def __init__(self, host, pid: int):
        self.host = host
        self.pid = pid
        self.returncode: int | None = None
        self.buffer: deque[str] = deque()
        self.watch = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while self.returncode is None:
            await asyncio.sleep(POLL_S)
            try:
                self.returncode = await self.host.poll.remote(self.pid)
            except ray.exceptions.RayError:
                self.returncode = -signal.SIGKILL

    async def readline(self) -> bytes:
        while not self.buffer:
            try:
                lines = await self.host.read.remote(self.pid)
            except ray.exceptions.RayError:
                return b""
            if lines is None:
                return b""
            if not lines:
                await asyncio.sleep(POLL_S)
            self.buffer.extend(lines)
        return self.buffer.popleft().encode()

    def signal(self, sig: int) -> None:
        self.host.signal.remote(self.pid, sig)


class RayRoles:
    """One `RoleHost` per role, placed by Ray with the resources `cfg.ray` gives its kind."""

    def __init__(self, cfg: FlashqConfig):
        if not ray.is_initialized():
            ray.init(address=cfg.ray.address, log_to_driver=False)
        self.hosts: dict[str, object] = {}
        self.nodes: dict[str, dict] = {}

    def place(self, cfg: FlashqConfig) -> FlashqConfig:
        """Create the actors (once) and point the config at the nodes they landed on."""
        for role in cfg.role_names():
            if role not in self.hosts:
                res = getattr(cfg.ray, role.split("-")[0])
                self.hosts[role] = RoleHost.options(
                    name=f"flashq-{cfg.log.run_dir.name}-{role}", num_cpus=res.num_cpus, num_gpus=res.num_gpus, resources=res.resources,
                ).remote()
        self.nodes = dict(zip(self.hosts, ray.get([h.node.remote() for h in self.hosts.values()])))
        cfg = cfg.model_copy(deep=True)
        cfg.transport.host = self.nodes["coordinator"]["ip"]
        cfg.transport.port = ray.get(self.hosts["coordinator"].free_port.remote())
        cfg.weight_sync.host = self.nodes["trainer"]["ip"]
        return cfg

    def describe(self) -> str:
        ids = sorted({n["node_id"] for n in self.nodes.values()})
        where = {role: f"node {ids.index(n['node_id'])} ({n['ip']})" for role, n in self.nodes.items()}
        return f"{len(ids)} node(s): " + ", ".join(f"{role} on {w}" for role, w in where.items())

    async def start(self, role) -> RayProcess:
        """Start `role` (a `launch.RoleProcess`) in its actor: its command minus the driver's
        interpreter, its environment minus what the driver's own environment already says."""
        env = {k: v for k, v in role.env.items() if os.environ.get(k) != v and k != "CUDA_VISIBLE_DEVICES"}
        host = self.hosts[role.name]
        pid = await host.start.remote(role.cmd[1:], env)
        return RayProcess(host, pid)

    def close(self) -> None:
        for host in self.hosts.values():
            ray.kill(host)
        self.hosts.clear()

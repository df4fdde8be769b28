"""A flood of hostile frames through a live coordinator's socket, for bench/chaos.py.

Sixteen connections pass the handshake with one role's token (a role whose credential leaked)
but never prove a name, under made-up names and random binary identities; they send
`flashq.wire.fuzz.hostile` frames: random and mutated messages, lists nested up to 100,000 deep,
multi-part messages just over the coordinator's size limit, a flood of schema versions. A
stranger with no credential sends beside them (its handshake fails: nothing of it gets in). The
coordinator must refuse every frame with a counted reason and carry on with its run.

    python bench/flood.py ADDRESS ROLE TOKEN FRAMES MAX_MESSAGE_BYTES OUT.json

`flood(run, ...)` is bench/chaos.py's side: it starts this script against a launched run and watches
the coordinator's memory through the flood and after it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import zmq
import zmq.asyncio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flashq.config import load_config  # noqa: E402
from flashq.credentials import RunCredentials  # noqa: E402
from flashq.wire import fuzz  # noqa: E402

CONNECTIONS = 16
STRANGER_FRAMES = 1000


async def main(address: str, role: str, token: str, n: int, max_message_bytes: int, out: Path) -> None:
    names = [f"{secrets.token_hex(3)}-{i}#{secrets.token_hex(4)}".encode() if i % 2 else b"\x01" + secrets.token_bytes(7)
             for i in range(CONNECTIONS)]
    socks = [fuzz.raw_peer(address, name, user=role, token=token, hwm=1000) for name in names]
    stranger = fuzz.raw_peer(address, b"stranger#0", hwm=1000)
    report = {"frames_sent": 0, "bytes_sent": 0, "stranger_frames_queued": 0, "started": time.time()}
    for i in range(STRANGER_FRAMES):  # queued for a connection whose handshake fails; dropped, never delivered
        try:
            await stranger.send_multipart(fuzz.huge_multipart(1, 1024), flags=zmq.NOBLOCK)
            report["stranger_frames_queued"] += 1
        except zmq.Again:
            break
    for i, frames in enumerate(fuzz.hostile(n, seed=11, max_message_bytes=max_message_bytes)):
        await socks[i % CONNECTIONS].send_multipart(frames, copy=len(frames) < 8)
        report["frames_sent"] += 1
        report["bytes_sent"] += sum(len(f) for f in frames)
        if i % 20_000 == 0:
            out.write_text(json.dumps(report))
    stranger.close(linger=0)
    for sock in socks:  # what is still queued goes out before the process ends
        sock.close(linger=120_000)
    zmq.asyncio.Context.instance().term()
    report["finished"] = time.time()
    out.write_text(json.dumps(report))


# When the coordinator's memory after a flood is read. A calibration probe at ddb1a16 (RSS from /proc
# each second) saw it hold the flood's buffers flat for 7-8 s after the sender exited, then give them
# back in one step; a fixed 10 s wait read before or after that step by chance (+4.8 MB, +315 MB).
# So: first every frame sent has its verdict in the books, then the memory must stay within
# SETTLED_MB for SETTLED_S (four times the hold seen), and no wait lasts past SETTLE_LIMIT_S.
SETTLED_MB, SETTLED_S, SETTLE_LIMIT_S = 5.0, 30.0, 240.0


class MetricTail:
    """The last value of one key in a run's metrics.jsonl, read on from where it was last read."""

    def __init__(self, path: Path, key: str):
        self.path, self.key, self.offset, self.value, self.partial = path, key, 0, 0.0, b""

    def __call__(self) -> float:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = self.partial + f.read()
                self.offset = f.tell()
            *lines, self.partial = chunk.split(b"\n")
            for line in lines:
                if line.strip() and self.key in (rec := json.loads(line)):
                    self.value = rec[self.key]
        return self.value


def flood(run, frames: int, out: Path) -> dict:
    """Once the run (bench/chaos.py's LaunchedRun) trains, flood its coordinator from connections
    holding reward-1's credential (this script) while its memory is sampled; then wait for the hub's verdict on every frame
    sent and for the memory to settle (above), and read it."""
    import psutil

    while run.proc.poll() is None and run.steps() < 2:
        time.sleep(0.5)
    coord = run.coordinator()
    limit = load_config(run.run_dir / "config.yaml", []).message_limit_bytes
    token = RunCredentials.load(run.run_dir).token("reward-1")
    base = peak = coord.memory_info().rss
    started = time.time()
    series: list[tuple[float, float]] = []  # (seconds since the flood began, RSS MB), one a second
    sender = subprocess.Popen([sys.executable, "bench/flood.py", run.address(), "reward-1", token, str(frames), str(limit), str(out)],
                              cwd=ROOT)

    def sample(until) -> bool:
        """Track the peak and the series until `until()`; False when the coordinator is gone (died, or the run resumed)."""
        nonlocal peak
        while not until():
            try:
                rss = coord.memory_info().rss
            except psutil.NoSuchProcess:
                return False
            peak = max(peak, rss)
            if not series or time.time() - started - series[-1][0] >= 1:
                series.append((round(time.time() - started, 1), round(rss / 2**20, 1)))
            time.sleep(0.2)
        return True

    ended = lambda: run.proc.poll() is not None  # noqa: E731
    alive = sample(lambda: sender.poll() is not None or ended())
    sent_s = time.time() - started
    if sender.poll() is None:  # the run ended first: the flood is cut short
        sender.kill()
        sender.wait()
    report = json.loads(out.read_text()) if out.exists() else {"frames_sent": 0}
    verdicts = MetricTail(run.run_dir / "metrics.jsonl", "rejected_frames")
    alive = alive and sample(lambda: ended() or verdicts() >= report["frames_sent"])
    judged_s, settling = time.time() - started - sent_s, time.time()

    def steady() -> bool:
        """The last SETTLED_S seconds of samples span at most SETTLED_MB."""
        window = [rss for t, rss in series if t >= time.time() - started - SETTLED_S]
        return time.time() - settling >= SETTLED_S and max(window, default=0) - min(window, default=0) <= SETTLED_MB

    alive = alive and sample(lambda: ended() or steady() or time.time() - settling > SETTLE_LIMIT_S)
    settled = alive and not ended() and steady()
    try:
        after = coord.memory_info().rss if alive and not ended() else None
    except psutil.NoSuchProcess:
        after = None
    mb = 1 / 2**20
    return {**report, "seconds": sent_s, "frames_per_s": report["frames_sent"] / sent_s, "message_limit_bytes": limit,
            "flood_status": sender.returncode, "run_ended_first": ended(),
            "verdicts_after_sender_s": judged_s, "read_after_sender_s": time.time() - started - sent_s, "memory_settled": settled,
            "coordinator_rss_mb_before": base * mb, "coordinator_rss_mb_after": after * mb if after is not None else None,
            "coordinator_rss_mb_peak": peak * mb, "coordinator_rss_mb_by_second": series, "coordinator_pid": coord.pid}


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], int(a[3]), int(a[4]), Path(a[5])))

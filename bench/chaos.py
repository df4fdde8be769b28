"""Chaos: kill rollout and reward workers at random (and the trainer once) during a real run,
then check the books. Side by side in one invocation: the same run without kills.

Each kill is a SIGKILL to the role's whole process group (the role and its vLLM engine), as
when a machine disappears. The launcher restarts workers in place and resumes the run from its
newest checkpoint when the trainer dies; the coordinator re-queues what a dead worker held.
Afterwards every admitted group must be trained whole exactly once or be listed untrained when
the run ended. Also runs the decoder fuzz of `bench/fuzz.py` (a live hub, hostile frames).

Both chaos runs have a rogue third reward worker (`bench/rogue.py`: it answers honestly and then
sends well-formed but wrong messages after each answer); the second has a two-rank trainer, one
of whose ranks is killed once (torchrun stops the other; the run resumes from its checkpoint).

    python bench/chaos.py                      # writes bench/results/chaos.json
    python bench/chaos.py --steps 60 --kills 6 --fuzz-frames 20000   # a quicker look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from bench.fuzz import blast  # noqa: E402
from flashq.credentials import RunCredentials  # noqa: E402

RUN = [
    "async_ratio=2", "model.name=tiny", "sft.warm_start=false", "placement={}",
    "sampling.group_size=4", "sampling.max_tokens=8", "trainer.batch_groups=4", "trainer.lr=1e-5",
    "rollout.num_workers=2", "reward.num_workers=2", "rollout.max_inflight_per_worker=64",
    "trainer.checkpoint_every=10", "fault.worker_timeout_s=15", "weight_sync.timeout_s=60",
    "transport.startup_timeout_s=300",
]
PID_LINE = re.compile(r"(rollout-\d+|reward-\d+|trainer) (?:connected|rejoined) \(pid (\d+)")


class LaunchedRun:
    """`flashq launch` in a subprocess; remembers the newest pid the coordinator reported per role.
    With `rogue`, a third reward worker is bench/rogue.py, started here."""

    def __init__(self, run_dir: Path, overrides: list[str], rogue: bool = False):
        self.run_dir = run_dir
        extra = ["reward.num_workers=3", "--external", "reward-2"] if rogue else []
        cmd = [sys.executable, "-m", "flashq.cli", "launch", "configs/quickstart.yaml", "--no-progress",
               f"log.run_dir={run_dir}", *RUN, *overrides, *extra]
        self.rogues: list[subprocess.Popen] = []  # a new one for each start of the run (a resume starts a new coordinator)
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"), start_new_session=True)
        self.pids: dict[str, int] = {}
        self.tail: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with (self.run_dir.parent / f"{self.run_dir.name}.out").open("w") as out:
            for line in self.proc.stdout:
                out.write(line)
                self.tail = (self.tail + [line])[-80:]
                if "start reward-2 yourself:" in line:
                    for old in self.rogues:
                        old.kill()
                    address = line.split("--connect ")[1].split()[0]
                    n = len(self.rogues)
                    self.rogues.append(subprocess.Popen(
                        [sys.executable, "bench/rogue.py", str(self.run_dir / "config.yaml"), address, "reward-2",
                         str(self.run_dir.parent / f"{self.run_dir.name}.rogue{n}.json")],
                        cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                                           FLASHQ_ROLE_TOKEN=RunCredentials.load(self.run_dir).token("reward-2")),
                        stdout=(self.run_dir.parent / f"{self.run_dir.name}.rogue{n}.out").open("w"), stderr=subprocess.STDOUT))
                if m := PID_LINE.search(line):
                    self.pids[m.group(1)] = int(m.group(2))

    def steps(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return 0
        steps = [json.loads(x).get("step", 0) for x in path.read_text().splitlines() if x.strip()]
        return max(steps, default=0)

    def alive(self, role: str) -> bool:
        import psutil

        pid = self.pids.get(role)
        try:
            return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def chaos(run: LaunchedRun, steps: int, kills: int, trainer_at: float, seed: int, sharded: bool = False) -> list[dict]:
    """Kill a random live worker every few seconds until `kills` are done (the trainer once, when
    the run is `trainer_at` of the way through; `sharded`: one of its two ranks)."""
    rng = random.Random(seed)
    done: list[dict] = []
    trainer_killed = False
    while run.proc.poll() is None and len(done) < kills:
        time.sleep(rng.uniform(4, 10))
        step = run.steps()
        if step < 2:
            continue
        if not trainer_killed and step >= trainer_at * steps and run.alive("trainer"):
            victim = "trainer"
            trainer_killed = True
            if sharded:  # one rank, as when one GPU's process dies: torchrun stops the other
                import psutil

                rank0 = psutil.Process(run.pids["trainer"])
                ranks = [p for p in rank0.parent().children() if p.environ().get("RANK") in ("0", "1")]
                rank = rng.choice(ranks)
                victim = f"trainer rank {rank.environ()['RANK']}"
                rank.kill()
                done.append({"time": time.time(), "role": victim, "pid": rank.pid, "step": step})
                print(f"  killed {victim} (pid {rank.pid}) at step {step}", flush=True)
                while run.proc.poll() is None and run.pids.get("trainer") == rank0.pid:
                    time.sleep(1)
                continue
        else:
            live = [r for r in ("rollout-0", "rollout-1", "reward-0", "reward-1") if run.alive(r)]
            # never the last live worker of its kind: the run must keep going to be measured
            spare = [r for r in live if sum(x.split("-")[0] == r.split("-")[0] for x in live) > 1]
            if not spare:
                continue
            victim = rng.choices(spare, weights=[1 if r.startswith("rollout") else 2 for r in spare])[0]
        pid = run.pids[victim]
        kill_group(pid)
        done.append({"time": time.time(), "role": victim, "pid": pid, "step": step})
        print(f"  killed {victim} (pid {pid}) at step {step}", flush=True)
        if victim == "trainer":
            while run.proc.poll() is None and run.pids.get("trainer") == pid:
                time.sleep(1)  # wait for the resumed run to start a new trainer
    return done


def audit(run_dir: Path, group_size: int) -> dict:
    """Lost: admitted groups neither trained nor listed untrained at the end. Duplicated: samples
    trained more than once. Partial: groups trained with a sample count other than the group size."""
    ledger = json.loads((run_dir / "ledger.json").read_text())
    ids = []
    for line in (run_dir / "trained.jsonl").read_text().splitlines():
        if line.strip():
            ids += [r[0] for r in json.loads(line)["requests"]]
    counts: dict[str, int] = {}
    for rid in ids:
        counts[rid.rsplit("/", 1)[0]] = counts.get(rid.rsplit("/", 1)[0], 0) + 1
    admitted = {f"g{i}" for i in range(ledger["groups_admitted"])}
    untrained = set(ledger["groups_untrained_at_finish"])
    lost_groups = admitted - set(counts) - untrained - set(ledger["groups_dropped_ids"])  # dropped: listed with a reason
    return {
        "samples_trained": len(ids),
        "samples_duplicated": len(ids) - len(set(ids)),
        "samples_lost": len(lost_groups) * group_size,
        "groups_partial": sum(1 for n in counts.values() if n != group_size),
        "groups_trained_and_untrained": len(set(counts) & untrained),
        "ledger": ledger,
    }


def recovery(kills: list[dict], events: list[dict], restarts: list[dict]) -> list[dict]:
    """Per kill: seconds until the coordinator noticed, until the role was back, and (rollout)
    until it served the current weights again; the trainer's is until the launcher resumed."""
    out = []
    for k in kills:
        row = {"role": k["role"], "step": k["step"]}
        after = [e for e in events if e["peer"] == k["role"] and e["time"] >= k["time"] - 0.5]
        lost = next((e for e in after if e["event"] == "lost"), None)
        back = next((e for e in after if e["event"] == "rejoined"), None)
        serving = next((e for e in after if e["event"] == "serving"), None)
        row["detected_s"] = lost["time"] - k["time"] if lost else None
        row["rejoined_s"] = back["time"] - k["time"] if back else None
        row["serving_s"] = serving["time"] - k["time"] if serving else (row["rejoined_s"] if k["role"].startswith("reward") else None)
        if k["role"].startswith("trainer"):  # back: every role of the resumed run connected again
            started = next((e for e in events if e["event"] == "started" and e["time"] >= k["time"]), None)
            row["rejoined_s"] = started["time"] - k["time"] if started else None
        out.append(row)
    return out


# Poison: replayed response lengths (heavy-tailed, fixed per request, so a retry is as long as the
# first try) and a request deadline set beforehand at 2 s, which a 400-token response on this
# host's loaded engine misses and a median 10-token one meets by far: the longest requests miss
# it every time and are quarantined; everything else must be trained or listed.
POISON = ["sampling.forced_lengths={median: 10, sigma: 1.5, min: 1, max: 400}", "sampling.max_tokens=400",
          "rollout.max_model_len=512", "rollout.request_timeout_s=2", "rollout.max_request_failures=2"]


def run_once(root: Path, name: str, steps: int, kills: int, seed: int, rogue: bool = False, ranks: int = 1,
             extra: list[str] = ()) -> dict:
    run_dir = root / name
    run = LaunchedRun(run_dir, [f"trainer.steps={steps}", f"seed={seed}", f"trainer.world_size={ranks}", *extra], rogue=rogue)
    killed = chaos(run, steps, kills, trainer_at=0.4, seed=seed, sharded=ranks > 1) if kills else []
    rc = run.proc.wait()
    wall = time.time() - run.started
    for rogue in run.rogues:
        try:
            rogue.wait(timeout=60)  # it leaves when the coordinator says the run is over
        except subprocess.TimeoutExpired:
            rogue.kill()
    sent = Counter()
    for counts in run_dir.parent.glob(f"{run_dir.name}.rogue*.json"):
        sent.update(json.loads(counts.read_text()))
    if rc != 0:
        print("".join(run.tail), file=sys.stderr)
        raise SystemExit(f"{name} run failed with status {rc}; output in {run_dir.parent / (run_dir.name + '.out')}")
    books = audit(run_dir, group_size=4)
    restarts, faults = read_jsonl(run_dir / "restarts.jsonl"), read_jsonl(run_dir / "faults.jsonl")
    ledger = books.pop("ledger")
    return {
        "run": name, "steps": steps, "kills": len(killed), "restarts": len(restarts), "wall_s": wall,
        "steps_per_s": steps / wall, "tokens": ledger["tokens_received"], **books,
        "requests_requeued": ledger["requests_requeued"], "scores_requeued": ledger["scores_requeued"],
        "rejected_from_lost_workers": sum(v for k, v in ledger["rejected"].items() if "declared lost" in k),
        "rejected_from_live_peers": sum(v for k, v in ledger["rejected"].items() if "declared lost" not in k),
        "rejected_by_reason": ledger["rejected"], "ranks": ranks,
        "requests_failed": ledger.get("requests_failed", 0), "requests_quarantined": ledger.get("requests_quarantined", 0),
        "groups_dropped_by_reason": ledger["groups_dropped_by_reason"],
        "rogue_sent": dict(sent),
        "recovery": recovery(killed, faults, restarts), "killed": killed,
    }


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--kills", type=int, default=24)
    ap.add_argument("--kills-sharded", type=int, default=12, help="kills in the run with a two-rank trainer")
    ap.add_argument("--poison-steps", type=int, default=100, help="steps of the run with poison requests")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fuzz-frames", type=int, default=130_000)
    ap.add_argument("--keep", type=Path, help="keep the run directories here")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="flashq-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    calm = run_once(root, "calm", args.steps, 0, args.seed)
    storm = run_once(root, "chaos", args.steps, args.kills, args.seed, rogue=True)
    sharded = run_once(root, "chaos-2-ranks", args.steps, args.kills_sharded, args.seed + 1, rogue=True, ranks=2)
    from flashq import fuzz

    poisoned = run_once(root, "poison", args.poison_steps, 0, args.seed + 2, extra=POISON)
    fuzzed = asyncio.run(blast(list(fuzz.frames(args.fuzz_frames, seed=7))))
    rows = [calm, storm, sharded, poisoned]
    print_table("chaos: random kills during a real run vs the same run left alone", rows,
                [("run", "run", ""), ("kills", "kills", "d"), ("restarts", "restarts", "d"), ("wall_s", "wall s", ".0f"),
                 ("steps_per_s", "steps/s", ".2f"), ("samples_trained", "trained", ",d"), ("samples_lost", "lost", "d"),
                 ("samples_duplicated", "duplicated", "d"), ("requests_requeued", "requeued", "d"),
                 ("rejected_from_live_peers", "rejected (rogue)", ",d"), ("requests_quarantined", "quarantined", "d")])
    rec = storm["recovery"]
    by_kind = {}
    for kind in ("rollout", "reward", "trainer"):
        rs = [r for r in rec if r["role"].startswith(kind)]
        by_kind[kind] = {"kills": len(rs), "detected_s": mean(r["detected_s"] for r in rs),
                         "rejoined_s": mean(r["rejoined_s"] for r in rs), "serving_s": mean(r["serving_s"] for r in rs)}
    print_table("time to recover after a kill (mean seconds)", [{"role": k, **v} for k, v in by_kind.items()],
                [("role", "role", ""), ("kills", "kills", "d"), ("detected_s", "noticed", ".1f"),
                 ("rejoined_s", "back", ".1f"), ("serving_s", "serving", ".1f")])
    whole = lambda r: r["samples_lost"] == 0 and r["groups_partial"] == 0 and r["groups_trained_and_untrained"] == 0  # noqa: E731
    figures = {
        "kills_survived": storm["kills"] if whole(storm) else 0,
        "kills_survived_sharded": sharded["kills"] if whole(sharded) else 0,
        "hostile_messages_sent": sum(sum(r["rogue_sent"].values()) for r in (storm, sharded)),
        "hostile_messages_rejected": sum(r["rejected_from_live_peers"] for r in (storm, sharded)),
        "poison_requests_quarantined": poisoned["requests_quarantined"] if whole(poisoned) else 0,
        "poison_run_samples_lost": poisoned["samples_lost"],
        "samples_lost": storm["samples_lost"] + sharded["samples_lost"],
        "samples_duplicated": storm["samples_duplicated"] + sharded["samples_duplicated"],
        "fuzz_frames_rejected_without_crash": fuzzed["rejected"],
        "throughput_vs_no_kills": storm["steps_per_s"] / calm["steps_per_s"],
        "recovery_s_by_role": by_kind,
    }
    path = write_result("chaos", {"runs": rows, "fuzz": fuzzed}, figures, notes=(
        "Every run: the tiny model, 2 rollout + 2 reward workers, async_ratio 2, checkpoints every 10 steps, on this "
        "machine's 2 cores. chaos and chaos-2-ranks add a rogue third reward worker (bench/rogue.py: honest answers, then ten "
        "kinds of well-formed but wrong messages after each); chaos-2-ranks trains on two gloo ranks and kills one of them "
        "once. poison: replayed heavy-tailed lengths and a 2 s request deadline set beforehand; requests that miss it twice "
        "are quarantined and their groups dropped (listed). Kills are SIGKILL to a role's process group every 4-10 s (a worker only while another of its kind "
        "is up; the trainer once, 40% of the way). noticed: kill -> the coordinator declares the worker lost; back: -> it "
        "says hello again (trainer: -> every role of the resumed run connected); serving: -> a restarted rollout worker serves the "
        "current weights. throughput_vs_no_kills: training steps per second, chaos run / calm run."))
    print(f"figures: {json.dumps(figures)}\nwrote {path}")


if __name__ == "__main__":
    main()

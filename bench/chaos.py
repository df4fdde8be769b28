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

Three more runs, left alone otherwise: `impostors` (the rogue also speaks under every other
role's name, on connections that passed the handshake with its own credential, and tries the
handshake under those names), `flood` (a million hostile frames through the coordinator's socket
from connections holding a leaked credential, `bench/flood.py`, with the coordinator's memory
watched), `torn` (the whole run killed at once and damaged before each resume, `bench/torn.py`).

    python bench/chaos.py                      # writes bench/results/chaos.json
    python bench/chaos.py --steps 60 --kills 6 --fuzz-frames 20000   # a quicker look
    python bench/chaos.py --runs impostors flood --flood-frames 50000 --name chaos_quick
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
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, git_commit, print_table, write_result  # noqa: E402
from bench.flood import flood  # noqa: E402
from bench.fuzz import blast  # noqa: E402
from bench.torn import mount_small_disk, torn_resumes  # noqa: E402
from flashq.config import load_config  # noqa: E402
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

    def __init__(self, run_dir: Path, overrides: list[str], rogue: bool = False, impostor_answers: int = 0,
                 resume: bool = False):
        self.run_dir = run_dir
        self.impostor_answers = impostor_answers
        extra = ["reward.num_workers=3", "--external", "reward-2"] if rogue else []
        if resume:
            cmd = [sys.executable, "-m", "flashq.cli", "launch", str(run_dir / "config.yaml"), "--no-progress", "--resume", str(run_dir)]
        else:
            cmd = [sys.executable, "-m", "flashq.cli", "launch", "configs/quickstart.yaml", "--no-progress",
                   f"log.run_dir={run_dir}", *RUN, *overrides, *extra]
        self.out_mode = "a" if resume else "w"
        self.rogues: list[subprocess.Popen] = []  # a new one for each start of the run (a resume starts a new coordinator)
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"), start_new_session=True)
        self.pids: dict[str, int] = {}
        self.tail: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with (self.run_dir.parent / f"{self.run_dir.name}.out").open(self.out_mode) as out:
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
                         str(self.run_dir.parent / f"{self.run_dir.name}.rogue{n}.json"), str(self.impostor_answers)],
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


    def coordinator(self):
        import psutil

        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if "coordinator" in p.cmdline() and "role" in p.cmdline():
                    return p
            except psutil.Error:  # a child gone since it was listed
                continue
        raise RuntimeError("no coordinator process under the launcher")

    def address(self) -> str:
        cfg = load_config(self.run_dir / "config.yaml", [])
        return f"tcp://{cfg.transport.host}:{cfg.transport.port}"


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def chaos(run: LaunchedRun, kills: int, trainer_at: float, seed: int, sharded: bool = False) -> list[dict]:
    """Kill a random live worker every few seconds until `kills` are done (the trainer once, when
    `trainer_at` of the kills are done; `sharded`: one of its two ranks). Counted in kills, not
    steps: a run's pace moves with the code and the host, and the two-rank run once spent its 12
    kills before 40% of its steps, so its rank was never killed (1378258, a7649f0)."""
    rng = random.Random(seed)
    done: list[dict] = []
    trainer_killed = False
    while run.proc.poll() is None and len(done) < kills:
        time.sleep(rng.uniform(4, 10))
        step = run.steps()
        if step < 2:
            continue
        if not trainer_killed and len(done) >= trainer_at * kills and run.alive("trainer"):
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
    until it served the current weights again; the trainer's is until the launcher resumed.

    A kill's events end where the next kill of that role begins, or where the trainer's kill
    resumes the whole run: a worker still restarting then comes back as part of the resumed run
    (the trainer's figure), and its row says so (`overtaken_by`) instead of reading the next
    kill's return as its own (a 105 s "restart" at 2d1e293 was that)."""
    out = []
    for k in kills:
        row = {"role": k["role"], "step": k["step"]}
        ends_it = [j for j in kills if j["time"] > k["time"] and (j["role"] == k["role"] or
                                                                   (j["role"].startswith("trainer") and not k["role"].startswith("trainer")))]
        first = min(ends_it, key=lambda j: j["time"], default=None)
        end = first["time"] if first else float("inf")
        after = [e for e in events if e["peer"] == k["role"] and k["time"] - 0.5 <= e["time"] < end]
        lost = next((e for e in after if e["event"] == "lost"), None)
        back = next((e for e in after if e["event"] == "rejoined"), None)
        serving = next((e for e in after if e["event"] == "serving"), None)
        row["detected_s"] = lost["time"] - k["time"] if lost else None
        row["rejoined_s"] = back["time"] - k["time"] if back else None
        row["serving_s"] = serving["time"] - k["time"] if serving else (row["rejoined_s"] if k["role"].startswith("reward") else None)
        if k["role"].startswith("trainer"):  # back: every role of the resumed run connected again
            started = next((e for e in events if e["event"] == "started" and e["time"] >= k["time"]), None)
            row["rejoined_s"] = started["time"] - k["time"] if started else None
        elif back is None and first and first["role"].startswith("trainer"):
            row["overtaken_by"] = f"{first['role']} killed at step {first['step']} (the whole run resumed)"
        out.append(row)
    return out


# Poison: replayed response lengths (heavy-tailed, fixed per request, so a retry is as long as the
# first try) and a request deadline set beforehand at 2 s, which a 400-token response on this
# host's loaded engine misses and a median 10-token one meets by far: the longest requests miss
# it every time and are quarantined; everything else must be trained or listed.
POISON = ["sampling.forced_lengths={median: 10, sigma: 1.5, min: 1, max: 400}", "sampling.max_tokens=400",
          "rollout.max_model_len=512", "rollout.request_timeout_s=2", "rollout.max_request_failures=2"]


# the hub's reasons for refusing what comes under a name its connection has not proven
IMPOSTOR_REASONS = ("hello with a wrong credential", "from a connection that has not proven its name",
                    "hello on a connection whose handshake proved another name")


def run_once(root: Path, name: str, steps: int, kills: int, seed: int, rogue: bool = False, ranks: int = 1,
             extra: list[str] = (), impostor_answers: int = 0, flood_frames: int = 0, resumes: int = 0) -> dict:
    run_dir = root / name
    overrides = [f"trainer.steps={steps}", f"seed={seed}", f"trainer.world_size={ranks}", *extra]
    killed, flooded, torn = [], {}, []
    if resumes:
        launches = []

        def launch(resume: bool):
            launches.append(LaunchedRun(run_dir, overrides, resume=resume))
            return launches[-1].proc

        small_disk = mount_small_disk(run_dir)
        torn = torn_resumes(launch, run_dir, resumes, seed, full_disk=small_disk)
        run, rc = launches[0], 0
    else:
        run = LaunchedRun(run_dir, overrides, rogue=rogue, impostor_answers=impostor_answers)
        killed = chaos(run, kills, trainer_at=0.4, seed=seed, sharded=ranks > 1) if kills else []
        flooded = flood(run, flood_frames, root / f"{name}.flood.json") if flood_frames else {}
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
    if resumes:
        output = (run_dir.parent / f"{name}.out").read_text()
        torn.append({"disk_full_stops_named": output.count("ran out of disk space"), "small_disk": small_disk})
        if small_disk:
            subprocess.run(["umount", str(run_dir)], check=False)
    impostors_sent = sum(v for k, v in sent.items() if k.startswith("impostor:"))
    impostors_refused = sum(ledger["rejected_frames"].get(k, 0) for k in IMPOSTOR_REASONS)
    return {
        "run": name, "steps": steps, "kills": len(killed), "restarts": len(restarts), "wall_s": wall,
        "steps_per_s": steps / wall, "tokens": ledger["tokens_received"], **books,
        "requests_requeued": ledger["requests_requeued"], "scores_requeued": ledger["scores_requeued"],
        "rejected_from_lost_workers": sum(v for k, v in ledger["rejected"].items() if "declared lost" in k),
        "rejected_from_live_peers": sum(v for k, v in ledger["rejected"].items() if "declared lost" not in k),
        "rejected_by_reason": ledger["rejected"], "ranks": ranks,
        "requests_failed": ledger.get("requests_failed", 0), "requests_quarantined": ledger.get("requests_quarantined", 0),
        "groups_dropped_by_reason": ledger["groups_dropped_by_reason"],
        "rogue_sent": dict(sent), "rejected_frames": ledger["rejected_frames"],
        "handshakes_refused": ledger.get("handshakes_refused", 0),
        "impostor_messages_sent": impostors_sent, "impostor_messages_refused": impostors_refused,
        "flood": flooded, "torn": torn,
        "recovery": recovery(killed, faults, restarts), "killed": killed,
    }


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


RUNS = ("calm", "chaos", "chaos-2-ranks", "poison", "impostors", "flood", "torn")
BOUNDS = {"kills_survived": ">= 20", "kills_survived_sharded": ">= 10", "impersonation_attempts_refused": ">= 1000",
          "impersonation_attempts_accepted": "== 0", "hostile_frames_without_crash": ">= 1000000",
          "coordinator_rss_growth_mb": "<= 50", "torn_resumes": ">= 10", "samples_lost": "== 0", "samples_duplicated": "== 0"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS), help="which runs (figures of the others are left out)")
    ap.add_argument("--steps", type=int, default=2500, help="steps of the calm and chaos runs: enough for the kills asked")
    ap.add_argument("--kills", type=int, default=24)
    ap.add_argument("--kills-sharded", type=int, default=12, help="kills in the run with a two-rank trainer")
    ap.add_argument("--poison-steps", type=int, default=100, help="steps of the run with poison requests")
    ap.add_argument("--impostor-answers", type=int, default=100, help="rogue answers followed by a burst under others' names")
    ap.add_argument("--flood-frames", type=int, default=1_000_000)
    ap.add_argument("--flood-steps", type=int, default=3000,
                    help="steps of the flood run: it must outlast the flood, the verdicts and the memory settling "
                         "(1000 until the settling wait: 35 s were left after the flood at ddd7a45)")
    ap.add_argument("--resumes", type=int, default=12, help="kills, damages and resumes in the torn run")
    ap.add_argument("--torn-steps", type=int, default=1000,
                    help="steps of the torn run: each resume waits for a new checkpoint and up to 2 s more, so a faster "
                         "run needs more steps for the same resumes (at df252e2, 300 ran out before the 10th of 12)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fuzz-frames", type=int, default=130_000)
    ap.add_argument("--keep", type=Path, help="keep the run directories here")
    ap.add_argument("--name", default="chaos", help="the result file's name")
    ap.add_argument("--merge", action="store_true", help="keep the runs of the result file that --runs does not redo "
                    "(each row names its commit) and its fuzz blast; figures from the union")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="flashq-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    from flashq.wire import fuzz

    plan = {
        "calm": lambda: run_once(root, "calm", args.steps, 0, args.seed),
        "chaos": lambda: run_once(root, "chaos", args.steps, args.kills, args.seed, rogue=True),
        "chaos-2-ranks": lambda: run_once(root, "chaos-2-ranks", args.steps, args.kills_sharded, args.seed + 1, rogue=True, ranks=2),
        "poison": lambda: run_once(root, "poison", args.poison_steps, 0, args.seed + 2, extra=POISON),
        "impostors": lambda: run_once(root, "impostors", 400, 0, args.seed + 3, rogue=True, impostor_answers=args.impostor_answers),
        "flood": lambda: run_once(root, "flood", args.flood_steps, 0, args.seed + 4, flood_frames=args.flood_frames),
        "torn": lambda: run_once(root, "torn", args.torn_steps, 0, args.seed + 5, extra=["trainer.checkpoint_every=5"], resumes=args.resumes),
    }
    runs = {name: {**plan[name](), "git_commit": git_commit()} for name in RUNS if name in args.runs}
    kept = json.loads((RESULTS / f"{args.name}.json").read_text()) if args.merge else {}
    for row in (kept.get("results") or {}).get("runs", []):
        if row["run"] not in runs:
            runs[row["run"]] = {"git_commit": kept.get("git_commit"), **row}
    runs = {name: runs[name] for name in RUNS if name in runs}
    fuzzed = kept["results"]["fuzz"] if kept else asyncio.run(blast(list(fuzz.frames(args.fuzz_frames, seed=7))))
    rows = list(runs.values())
    print_table("chaos: random kills, hostile peers and torn resumes during real runs", rows,
                [("run", "run", ""), ("kills", "kills", "d"), ("restarts", "restarts", "d"), ("wall_s", "wall s", ".0f"),
                 ("steps_per_s", "steps/s", ".2f"), ("samples_trained", "trained", ",d"), ("samples_lost", "lost", "d"),
                 ("samples_duplicated", "duplicated", "d"), ("requests_requeued", "requeued", "d"),
                 ("rejected_from_live_peers", "rejected (rogue)", ",d"), ("impostor_messages_refused", "impostors refused", ",d"),
                 ("requests_quarantined", "quarantined", "d")])
    figures = summarize(runs, fuzzed)
    path = write_result(args.name, {"runs": rows, "fuzz": fuzzed}, figures, notes=(
        "Every run: the tiny model, 2 rollout + 2 reward workers, async_ratio 2, checkpoints every 10 steps, on this "
        "machine's 2 cores. chaos and chaos-2-ranks add a rogue third reward worker (bench/rogue.py: honest answers, then ten "
        "kinds of well-formed but wrong messages after each); chaos-2-ranks trains on two gloo ranks and kills one of them "
        "once. poison: replayed heavy-tailed lengths and a 2 s request deadline set beforehand; requests that miss it twice "
        "are quarantined and their groups dropped (listed). Kills are SIGKILL to a role's process group every 4-10 s (a worker only while another of its kind "
        "is up; the trainer once, after 40% of the kills). noticed: kill -> the coordinator declares the worker lost; back: -> it "
        "says hello again (trainer: -> every role of the resumed run connected); serving: -> a restarted rollout worker serves the "
        "current weights. throughput_vs_no_kills: training steps per second, chaos run / calm run. impostors: the rogue's "
        "first answers are each followed by six messages under each of five other roles' names (hellos with its token and "
        "with forged ones, Fatal, a weight-sync call to another rendezvous, a reward for a real request, a batch request) on "
        "connections that passed the handshake with its own credential; accepted = sent - refused at the hub. flood: "
        "bench/flood.py from 16 connections holding reward-1's credential; coordinator_rss_growth_mb: its resident memory "
        "once the hub has a verdict on every frame sent and the memory has stayed within 5 MB for 30 s (at most 240 s; "
        "memory_settled says which), minus when the flood began (peak and a per-second series beside it; until the "
        "wait on books and settling, 10 s after the flood's last frame: chaos.md). torn: checkpoints every 5 steps; "
        "the launcher and every role SIGKILLed at once 0-2 s after a new checkpoint, then the damage, then --resume; the "
        "run directory is a 1 GiB tmpfs of its own, filled (full disk) every fourth time instead: the run must stop by itself."))
    print(f"figures: {json.dumps(figures)}\nwrote {path}")


def summarize(runs: dict[str, dict], fuzzed: dict) -> dict:
    """The figures of the runs that ran; each counted only when that run's books are exact."""
    def whole(r: dict) -> bool:
        return (r["samples_lost"] == 0 and r["samples_duplicated"] == 0 and r["groups_partial"] == 0
                and r["groups_trained_and_untrained"] == 0)

    figures: dict = {"fuzz_frames_rejected_without_crash": fuzzed["rejected"]}
    storm, sharded, calm = runs.get("chaos"), runs.get("chaos-2-ranks"), runs.get("calm")
    if storm:
        figures["kills_survived"] = storm["kills"] if whole(storm) else 0
        by_kind = {}
        for kind in ("rollout", "reward", "trainer"):
            rs = [r for r in storm["recovery"] if r["role"].startswith(kind)]
            by_kind[kind] = {"kills": len(rs), "detected_s": mean(r["detected_s"] for r in rs),
                             "rejoined_s": mean(r["rejoined_s"] for r in rs), "serving_s": mean(r["serving_s"] for r in rs)}
        figures["recovery_s_by_role"] = by_kind
        if calm:
            figures["throughput_vs_no_kills"] = storm["steps_per_s"] / calm["steps_per_s"]
    if sharded:
        figures["kills_survived_sharded"] = sharded["kills"] if whole(sharded) else 0
    stormy = [r for r in (storm, sharded) if r]
    if stormy:
        figures["hostile_messages_sent"] = sum(sum(r["rogue_sent"].values()) for r in stormy)
        figures["hostile_messages_rejected"] = sum(r["rejected_from_live_peers"] for r in stormy)
    if poisoned := runs.get("poison"):
        figures["poison_requests_quarantined"] = poisoned["requests_quarantined"] if whole(poisoned) else 0
        figures["poison_run_samples_lost"] = poisoned["samples_lost"]
    if imp := runs.get("impostors"):
        figures["impersonation_attempts_refused"] = imp["impostor_messages_refused"] if whole(imp) else 0
        figures["impersonation_attempts_accepted"] = imp["impostor_messages_sent"] - imp["impostor_messages_refused"]
        figures["impostor_handshakes_refused"] = imp["handshakes_refused"]
    if fl := runs.get("flood"):
        f = fl["flood"]
        verdicts = sum(fl["rejected_frames"].values())
        done = whole(fl) and verdicts >= f["frames_sent"] and not f["run_ended_first"] and f["flood_status"] == 0
        figures["hostile_frames_without_crash"] = f["frames_sent"] if done else 0
        figures["hostile_frames_refused_at_hub"] = verdicts
        if f["coordinator_rss_mb_after"] is not None:
            figures["coordinator_rss_growth_mb"] = f["coordinator_rss_mb_after"] - f["coordinator_rss_mb_before"]
        figures["coordinator_rss_peak_over_start_mb"] = f["coordinator_rss_mb_peak"] - f["coordinator_rss_mb_before"]
    if torn := runs.get("torn"):
        cycles = [t for t in torn["torn"] if "resume" in t]
        figures["torn_resumes"] = len(cycles) if whole(torn) else 0
        figures["torn_resumes_by_damage"] = dict(Counter(t["damage"] for t in cycles))
    lost = [r["samples_lost"] for r in runs.values() if r["run"] != "poison"]
    figures["samples_lost"] = sum(lost)
    figures["samples_duplicated"] = sum(r["samples_duplicated"] for r in runs.values())
    figures["bounds"] = {k: v for k, v in BOUNDS.items() if k in figures}
    return figures


if __name__ == "__main__":
    main()

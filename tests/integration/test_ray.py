"""`flashq launch --backend ray` on a local Ray cluster of three nodes on this machine: the
coordinator, rollout workers and trainer each pinned by a custom resource to their own node; once
with full weights and once with LoRA and grouped speculation."""

import importlib.util
import subprocess
import sys

import pytest

from tests.integration.helpers import ROOT, launch_cmd, read_jsonl, trained_requests

pytestmark = pytest.mark.slow
if importlib.util.find_spec("ray") is None:  # found, not imported: Ray's native parts stay out of pytest's process
    pytest.skip("ray is not installed", allow_module_level=True)


@pytest.fixture
def cluster():
    """The cluster's address; the cluster runs in a process of its own (see ray_cluster.py)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.ray_cluster"], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = next((line for line in proc.stdout if line.startswith("address ")), "")
        assert line, f"the Ray cluster did not start (exit code {proc.wait(timeout=60)})"
        yield line.split()[1]
    finally:
        proc.stdin.close()  # the cluster shuts down when its stdin closes
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


@pytest.mark.parametrize("variant", [[], ["trainer.lora.rank=8", "trainer.lr=1e-3", "rollout.speculation=grouped"]],
                         ids=["full", "lora-grouped-speculation"])
def test_quickstart_runs_on_a_multi_node_ray_cluster(tmp_path, cluster, variant):
    overrides = [*variant,
        f"ray.address={cluster}", "trainer.steps=6", "async_ratio=1",
        "ray.coordinator.resources={head_node: 0.5}", "ray.reward.resources={head_node: 0.5}",
        "ray.rollout.resources={inference_node: 0.5}", "ray.trainer.resources={train_node: 1}",
    ]
    proc = subprocess.run([*launch_cmd(tmp_path, overrides), "--backend", "ray"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    placed = next(line for line in proc.stdout.splitlines() if line.startswith("ray: "))
    assert "3 node(s)" in placed
    where = dict(part.split(" on ") for part in placed.split(": ", 2)[2].split(", "))
    assert where["rollout-0"].split()[:2] == where["rollout-1"].split()[:2]  # both on the inference node
    assert len({where["coordinator"].split()[1], where["rollout-0"].split()[1], where["trainer"].split()[1]}) == 3
    ids = [rid for _, rid, _, _ in trained_requests(tmp_path)]
    assert len(ids) == len(set(ids)) == 6 * 4 * 4  # every sample of every step trained once
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))
    if variant:  # LoRA pushes carry the adapter alone, served with grouped drafts
        pushes = [r["trainer/push_bytes"] for r in steps if "trainer/push_bytes" in r]
        assert pushes and max(pushes) < 200_000  # the tiny model's full weights are ~1.2 MB
        # each engine runs flashq's grouped proposer (its stats reach the coordinator; how many drafts
        # a 6-step run makes by the time they are sent varies, so that count is not asserted)
        assert all(any(f"spec/drafting_s_total/rollout-{i}" in r for r in steps) for i in (0, 1))

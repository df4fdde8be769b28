"""Data-parallel FSDP2 training (the CPU twin, gloo) against one process on the same batches."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from flashq.config import load_config
from flashq.trainer.parallel import shares

OVERRIDES = ["trainer.minibatches=2", "trainer.micro_batch_tokens=64", "trainer.lr=1e-2", "trainer.loss.kl_coef=0.05"]


def test_shares_partition_the_sequences_and_balance_tokens():
    lengths = np.array([50, 3, 3, 3, 40, 2, 9, 30])
    indices = np.arange(100, 108)
    parts = shares(indices, lengths, 3)
    assert sorted(np.concatenate(parts).tolist()) == indices.tolist()
    loads = [lengths[p - 100].sum() for p in parts]
    assert max(loads) - min(loads) <= lengths.max()
    assert [len(p) for p in shares(indices[:1], lengths[:1], 2)] == [1, 0]  # more ranks than sequences


def _batches(learner):
    """Two prompts a batch: with prompt passes shared, each rank computes one prompt's group."""
    from tests.unit.test_shared_prompts import two_groups

    return [two_groups(0, seed=0), two_groups(1, seed=1)]


def _rank_main(rank, port, model, batches, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from flashq.trainer.learner import Learner

    cfg = load_config(None, ["trainer.world_size=2", *OVERRIDES])
    torch.set_num_threads(1)
    learner = Learner(cfg, model)
    first = learner.train_step(batches[0])
    learner.save(Path(out) / "step1", model)
    # resume on fresh ranks from what was saved, then take the second step
    resumed = Learner(cfg, Path(out) / "step1", reference_path=model)
    resumed.load_state(Path(out) / "step1")
    second = resumed.train_step(batches[1])
    resumed.save(Path(out) / "step2", model)
    if rank == 0:
        (Path(out) / "metrics.json").write_text(json.dumps([first, second]))
    _end(resumed.ranks)


def _end(ranks) -> None:
    """A rank ends as the trainer role does: leave the group, then exit without the
    interpreter's teardown, where c10d's threads can still abort a process (a rank of this test
    was killed by SIGABRT at its end once, in CI on a loaded host)."""
    from flashq.roles.common import exit_without_teardown
    from flashq.trainer.parallel import leave

    leave(ranks)
    exit_without_teardown(0)


@pytest.mark.slow
def test_two_fsdp_ranks_train_like_one_process_and_resume_on_two_or_one(tiny_model, tmp_path):
    from flashq.roles.common import free_port
    from flashq.trainer.learner import Learner, load_causal_lm

    single = Learner(load_config(None, OVERRIDES), tiny_model)
    batches = _batches(single)
    expected = [single.train_step(b) for b in batches]

    mp.start_processes(_rank_main, args=(free_port(), tiny_model, batches, str(tmp_path)), nprocs=2, start_method="spawn")

    got = json.loads((tmp_path / "metrics.json").read_text())
    for e, g in zip(expected, got):
        assert g["loss"] == pytest.approx(e["loss"], rel=1e-4, abs=1e-6)
        assert g["grad_norm"] == pytest.approx(e["grad_norm"], rel=1e-4)
        assert g["loss/is_weight_mean"] == pytest.approx(e["loss/is_weight_mean"], rel=1e-5)
        assert g["loss/ref_kl"] == pytest.approx(e["loss/ref_kl"], rel=1e-3, abs=1e-7)
    sharded = load_causal_lm(tmp_path / "step2", torch.float32, torch.device("cpu"))
    want = single.model.state_dict()
    # A key bias adds the same amount to every score of a query, which softmax ignores: its
    # gradient is zero in exact arithmetic, and Adam turns the rounding noise left in it into
    # steps of up to lr, whose sign depends on the summation order of each host's kernels. So the
    # key biases are compared through what they do (the logits), every other weight to 1% of a step.
    for name, tensor in sharded.state_dict().items():
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-4, msg=lambda m, name=name: f"{name} after two sharded steps: {m}")
    tokens = torch.tensor([[2, 121, 119, 14, 53, 47, 54, 65, 7, 180, 33, 96]])
    with torch.no_grad():
        torch.testing.assert_close(sharded(tokens).logits, single.model(tokens).logits, rtol=0, atol=1e-4)
    state = torch.load(tmp_path / "step2" / "trainer_state.pt", weights_only=False)
    assert state["version"] == 2
    assert sorted(p.name for p in (tmp_path / "step2" / "optimizer").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # resumable at another world size: one process continues from the two ranks' first step
    alone = Learner(load_config(None, OVERRIDES), tmp_path / "step1", reference_path=tiny_model)
    alone.load_state(tmp_path / "step1")
    m = alone.train_step(batches[1])
    assert m["loss"] == pytest.approx(expected[1]["loss"], rel=1e-4, abs=1e-6)
    assert m["grad_norm"] == pytest.approx(expected[1]["grad_norm"], rel=1e-4)
    for name, tensor in alone.model.state_dict().items():
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-4, msg=lambda m, name=name: f"{name} resumed on one rank: {m}")


def _bf16_rank_main(rank, port, model, batch, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from flashq.trainer.learner import Learner

    from flashq.trainer import parallel

    torch.set_num_threads(1)
    reads = []
    parallel.read_checkpoint = (lambda read: lambda path: (reads.append(rank), read(path))[1])(parallel.read_checkpoint)
    overrides = ["trainer.world_size=2", "trainer.compute_dtype=bfloat16", "trainer.lr=1e-6", "trainer.gradient_checkpointing=true"]
    learner = Learner(load_config(None, overrides), model)
    assert learner.model.is_gradient_checkpointing
    (Path(out) / f"reads-{rank}.json").write_text(json.dumps(reads))
    before = {n: p.full_tensor().clone() for n, p in learner.model.named_parameters()}
    seen = set()
    learner.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, inp, out: seen.add(str(out.dtype)))
    metrics = learner.train_step(batch)
    masters = {n: p.full_tensor() for n, p in learner.model.named_parameters()}
    moments = [s["exp_avg"] for s in learner.optimizer.state.values()]
    if rank == 0:
        changed = {n: float((masters[n] != before[n]).float().mean()) for n in masters}
        dtypes = sorted({str(t.dtype) for t in [*masters.values(), *[m.to_local() for m in moments]]})
        (Path(out) / "bf16.json").write_text(json.dumps({"loss": metrics["loss"], "changed": changed, "dtypes": dtypes, "computed": sorted(seen)}))
    _end(learner.ranks)


@pytest.mark.slow
def test_two_fsdp_ranks_compute_in_bf16_and_keep_float32_masters(tiny_model, tmp_path):
    """FSDP2's MixedPrecisionPolicy: bf16 gathers and compute, float32 shards and Adam state; an
    lr 1e-6 step moves the masters (it would round away in bf16 parameters). With gradient
    checkpointing, and the model built without rank 1 ever holding it whole."""
    from flashq.roles.common import free_port
    from flashq.trainer.learner import Learner

    single = Learner(load_config(None, ["trainer.lr=1e-6"]), tiny_model)
    batch = _batches(single)[0]
    expected = single.train_step(batch)
    mp.start_processes(_bf16_rank_main, args=(free_port(), tiny_model, batch, str(tmp_path)), nprocs=2, start_method="spawn")
    got = json.loads((tmp_path / "bf16.json").read_text())
    assert got["dtypes"] == ["torch.float32"] and got["computed"] == ["torch.bfloat16"]
    # rank 0 alone read the checkpoint; rank 1 built an empty skeleton and got its shards
    assert [json.loads((tmp_path / f"reads-{r}.json").read_text()) for r in (0, 1)] == [[0], []]
    assert got["loss"] == pytest.approx(expected["loss"], rel=0.05, abs=1e-3)
    assert min(got["changed"].values()) > 0.5  # every tensor's masters moved, nearly every element


def _hub_rank_main(rank, port, batch, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from flashq.roles.common import resolve_model
    from flashq.trainer.learner import Learner

    torch.set_num_threads(1)
    cfg = load_config(None, ["trainer.world_size=2", "model.name=acme/tiny-chat", *OVERRIDES])
    learner = Learner(cfg, resolve_model(cfg))  # as the trainer role loads its policy and KL reference
    metrics = learner.train_step(batch)
    if rank == 0:
        (Path(out) / "hub.json").write_text(json.dumps(metrics))
    _end(learner.ranks)


@pytest.mark.slow
def test_two_fsdp_ranks_and_their_kl_reference_load_a_model_named_by_a_hub_id(tiny_model, tmp_path, monkeypatch):
    """model.name a hub id in the Hugging Face cache (filled by hand: nothing is downloaded in
    tests): rank 0 reads the policy's and the reference's checkpoints from the cached snapshot."""
    from flashq.roles.common import free_port
    from flashq.trainer.learner import Learner
    from tests.hub_cache import prefill

    prefill(tmp_path / "hub", "acme/tiny-chat", tiny_model)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # the ranks are spawned: they read it at import
    single = Learner(load_config(None, OVERRIDES), tiny_model)
    batch = _batches(single)[0]
    expected = single.train_step(batch)
    mp.start_processes(_hub_rank_main, args=(free_port(), batch, str(tmp_path)), nprocs=2, start_method="spawn")
    got = json.loads((tmp_path / "hub.json").read_text())
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4, abs=1e-6)
    assert got["loss/ref_kl"] == pytest.approx(expected["loss/ref_kl"], rel=1e-3, abs=1e-7)

import os
from pathlib import Path

import pytest

from flashq.config import ConfigError, load_config, role_view

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_validate_and_overrides_apply():
    cfg = load_config(None, ["async_ratio=0.5", "trainer.lr=3e-4", "rollout.num_workers=3"])
    assert cfg.async_ratio == 0.5 and cfg.staleness_bound == 1
    assert cfg.trainer.lr == 3e-4
    assert cfg.role_names() == ["coordinator", "rollout-0", "rollout-1", "rollout-2", "reward-0", "trainer"]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("async_ratio=-1", "async_ratio: Input should be greater than or equal to 0"),
        ("trainer.lrr=1", "trainer.lrr: unknown field"),
        ("trainer.batch_groups=many", "trainer.batch_groups: Input should be a valid integer"),
        ("sampling.max_tokens=4096", "sampling.max_tokens (4096) must be below rollout.max_model_len"),
        ("weight_sync.backend=carrier-pigeon", "weight_sync.backend: Input should be 'auto', 'gloo', 'nccl' or 'ipc'"),
        ("async_ratio", "is not of the form key=value"),
        ("sampling.top_p=0.9", "sampling.top_p is 0.9: vLLM would report logprobs of the top-p truncated distribution"),
        ("trainer.loss.policy=cispo trainer.loss.correction=tis_token", "policy cispo already weights each token by pi_theta/pi_behav"),
        ("trainer.loss.policy=topr trainer.loss.correction=tis_sequence", "correction tis_sequence would apply a behaviour weight twice"),
        ("trainer.param_dtype=bfloat16", "compute_dtype float32 with param_dtype bfloat16"),
        ("rollout.engine_start=fork rollout.omp_threads=2", "rollout.engine_start fork with omp_threads 2"),
        ("trainer.compute_dtype=float16", "trainer.compute_dtype: Input should be 'float32' or 'bfloat16'"),
        ("weight_sync.receive_while_generating=true trainer.lora.rank=4", "receive_while_generating needs one worker per engine, "
         "in its engine core's process, full-weight pushes and no colocation: not trainer.lora"),
        ("weight_sync.receive_while_generating=true rollout.tensor_parallel_size=2",
         "not rollout.tensor_parallel_size > 1"),
        ("weight_sync.receive_while_generating=true rollout.engine_kwargs.distributed_executor_backend=mp",
         "not rollout.engine_kwargs.distributed_executor_backend 'mp' (the worker is another process)"),
        ("weight_sync.receive_while_generating=true placement.colocate=true async_ratio=0",
         "not placement.colocate (generation and training take turns)"),
    ],
)
def test_bad_values_name_the_field(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, override.split(" "))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "overrides, backend, colocate, expected",
    [
        ([], "gloo", False, True),  # unset: on with gloo
        ([], "nccl", False, False),  # unset: off with NCCL
        (["rollout.engine_kwargs.distributed_executor_backend=uni"], "gloo", False, True),
        # another executor puts the worker in a process of its own: unset turns it off (it would fail at the first push)
        (["rollout.engine_kwargs.distributed_executor_backend=mp"], "gloo", False, False),
        (["rollout.tensor_parallel_size=2"], "gloo", False, False),
        (["trainer.lora.rank=4"], "gloo", False, False),
        ([], "gloo", True, False),
        (["weight_sync.receive_while_generating=true"], "nccl", False, True),
    ],
)
def test_receiving_while_generating_needs_the_worker_in_the_engine_process(overrides, backend, colocate, expected):
    assert load_config(None, overrides).receives_while_generating(backend, colocate) is expected


@pytest.mark.parametrize(
    "override, expected",
    [
        ("trainer.lrr=1", "trainer.lrr: unknown field (did you mean trainer.lr? every key is in docs/reference/configuration.md)"),
        ("trainer.loss.polcy=ppo", "trainer.loss.polcy: unknown field (did you mean trainer.loss.policy?"),
        ("eval.task.kindd=file", "eval.task.kindd: unknown field (did you mean eval.task.kind?"),  # through an optional section
        ("lr=1", "lr: unknown field (did you mean trainer.lr or sft.lr?"),  # the right name in the wrong section
        ("zzz=1", "zzz: unknown field (check the spelling; every key is in docs/reference/configuration.md)"),
    ],
)
def test_an_unknown_key_names_the_key_meant(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert expected in str(err.value)


def test_the_behaviour_correction_follows_the_policy_unless_set():
    assert load_config(None).trainer.loss.correction == "tis_token"
    assert load_config(None, ["trainer.loss.policy=cispo"]).trainer.loss.correction == "none"
    assert load_config(None, ["trainer.loss.policy=reinforce", "trainer.loss.correction=tis_sequence"]).trainer.loss.correction == "tis_sequence"


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(scalar)


SHIPPED = sorted((ROOT / "configs").rglob("*.yaml")) + sorted((ROOT / "bench" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_passes_dry_run(path, tmp_path, capsys):
    """`flashq launch FILE --dry-run` as a user runs it; the GPU configs must pass it here too."""
    from flashq.cli import main

    assert main(["launch", str(path), "--dry-run", f"log.run_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    cfg = load_config(path)
    for role in cfg.role_names():
        assert f"# --- {role}" in out and role_view(cfg, role)


@pytest.mark.parametrize("left", ["metrics.jsonl", "checkpoints"])
def test_a_new_run_in_a_used_run_dir_is_refused_before_any_role_starts(left, tmp_path, capsys):
    """It would append to the earlier run's metrics and fail at its last checkpoint (a dry run
    says so too, so that the check costs nothing here)."""
    from flashq.cli import main

    (tmp_path / left).touch()
    assert main(["launch", str(ROOT / "configs" / "quickstart.yaml"), "--dry-run", f"log.run_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"log.run_dir {tmp_path} already holds a run ({left})" in err and f"--resume {tmp_path}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [left]  # nothing written, nothing started


def test_gpu_configs_place_engines_and_fsdp_ranks_on_their_own_devices(tmp_path):
    from flashq.launch import dry_run

    cfg = load_config(ROOT / "configs" / "gpu" / "math-qwen2.5-1.5b-8gpu.yaml", [f"log.run_dir={tmp_path}"])
    text = dry_run(cfg)
    assert "CUDA_VISIBLE_DEVICES=0,1 flashq role rollout-0" in text and "CUDA_VISIBLE_DEVICES=2,3 flashq role rollout-1" in text
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7 torchrun --standalone --nproc-per-node=4 -m flashq.cli role trainer" in text
    assert cfg.trainer.device == "cuda" and cfg.weight_sync.backend == "nccl" and cfg.reward.function.endswith("math_verify")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["placement.rollout_gpus=[0]", "rollout.num_workers=2"], "placement.rollout_gpus names 1 device(s); 2 rollout worker(s)"),
        (["placement.trainer_gpus=[1]", "trainer.world_size=2"], "placement.trainer_gpus names 1 device(s) for trainer.world_size 2"),
        (["placement.rollout_gpus=[0]", "placement.trainer_gpus=[0]"], "rollout-0 and trainer would share cuda:0"),
    ],
)
def test_gpu_placement_mistakes_are_named(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert expected in str(err.value)


def test_role_view_holds_only_what_the_role_reads():
    cfg = load_config(None)
    assert "trainer" not in role_view(cfg, "rollout-0")
    assert "async_ratio" in role_view(cfg, "trainer")
    with pytest.raises(ConfigError, match="unknown role"):
        role_view(cfg, "critic")


def test_the_rollout_frontend_moves_every_thread_of_the_worker_and_names_missing_cores():
    """placement.rollout_frontend: the rollout worker's threads (started before and after) leave
    the engine's cores; a core the machine lacks is named before anything starts."""
    import subprocess
    import sys

    from flashq.placement import check_cpus

    script = (
        "import os, threading\n"
        "from flashq.placement import pin_process\n"
        "os.sched_setaffinity(0, {0, 1})\n"
        "stop = threading.Event(); seen = {}\n"
        "before = threading.Thread(target=lambda: (stop.wait(), seen.update(before=os.sched_getaffinity(0)))); before.start()\n"
        "pin_process([1])\n"
        "after = threading.Thread(target=lambda: seen.update(after=os.sched_getaffinity(0))); after.start(); after.join()\n"
        "stop.set(); before.join()\n"
        "print(sorted(os.sched_getaffinity(0)), sorted(seen['before']), sorted(seen['after']))\n"
    )
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs cores 0 and 1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[1] [1] [1]"  # the process, a thread started before, one started after
    with pytest.raises(ConfigError, match=r"placement.rollout_frontend names CPU\(s\) \[4096\]"):
        check_cpus(load_config(None, ["placement.rollout_frontend=[4096]"]))


def test_a_batch_of_split_agent_episodes_fits_the_socket_limit():
    """A split episode is up to one sequence per call, so the largest batch grows with env.max_turns."""
    base = ["transport.max_message_mb=1", "env.max_turns=4"]
    fail = load_config("configs/agent_calculator.yaml", base)
    split = load_config("configs/agent_calculator.yaml", [*base, "env.on_rewrite=split"])
    cfg = split
    largest = cfg.trainer.batch_groups * cfg.sampling.group_size * 4 * (17 * cfg.rollout.max_model_len + 128)
    assert split.message_limit_bytes >= largest > fail.message_limit_bytes

"""GPU placement checked before anything starts: roles that would share a device are refused
by name (at load for the devices placement names, at launch for the ones it leaves out), and
with GPUs visible and no placement every role gets its own devices, instead of every engine
and the trainer landing on cuda:0 where NCCL refuses two ranks of one group."""

import os

import pytest

from flashq.config import ConfigError, load_config
from flashq.launch import role_specs
from flashq.placement import place_gpus, visible_gpus


def test_roles_sharing_a_named_device_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"rollout-1 and trainer would share cuda:1"):
        load_config(None, ["rollout.num_workers=2", "placement.rollout_gpus=[0,1]", "placement.trainer_gpus=[1]"])
    with pytest.raises(ConfigError, match=r"rollout-0 and rollout-1 would share cuda:0"):
        load_config(None, ["rollout.num_workers=2", "placement.rollout_gpus=[0,0]", "placement.trainer_gpus=[1]"])
    with pytest.raises(ConfigError, match=r"two ranks of trainer would share cuda:2"):
        load_config(None, ["trainer.world_size=2", "placement.rollout_gpus=[0]", "placement.trainer_gpus=[2,2]"])
    with pytest.raises(ConfigError, match=r"3 rollout worker\(s\) x tensor_parallel_size 1 need 3"):
        load_config(None, ["rollout.num_workers=3", "placement.rollout_gpus=[0,1]"])
    with pytest.raises(ConfigError, match=r"names 1 device\(s\) for trainer.world_size 2"):
        load_config(None, ["trainer.world_size=2", "placement.trainer_gpus=[3]"])


def test_a_launch_with_gpus_and_no_placement_gives_each_role_its_own(tmp_path):
    cfg = load_config(None, ["rollout.num_workers=2", "rollout.tensor_parallel_size=2", "trainer.world_size=2",
                             f"log.run_dir={tmp_path}"])
    placed = place_gpus(cfg, available=8)
    assert placed.placement.rollout_gpus == [0, 1, 2, 3] and placed.placement.trainer_gpus == [4, 5]
    devices = {spec.name: spec.env.get("CUDA_VISIBLE_DEVICES") for spec in role_specs(placed, tmp_path / "config.yaml")}
    assert devices["rollout-0"] == "0,1" and devices["rollout-1"] == "2,3" and devices["trainer"] == "4,5"
    with pytest.raises(ConfigError, match=r"4 rollout device\(s\) and 2 trainer device\(s\) need 6 GPUs; 4 visible"):
        place_gpus(cfg, available=4)
    assert place_gpus(cfg, available=0) is cfg  # a CPU machine: nothing to place
    on_cpu = load_config(None, ["trainer.device=cpu"])
    assert place_gpus(on_cpu, available=1) is on_cpu


def test_colocated_roles_share_one_device_and_nothing_else_may(tmp_path):
    """placement.colocate: the trainer and the one rollout worker take turns on one device; with
    none named both get cuda:0, and naming two devices is refused."""
    cfg = load_config(None, ["async_ratio=0", "placement.colocate=true", f"log.run_dir={tmp_path}"])
    placed = place_gpus(cfg, available=1)
    assert placed.placement.rollout_gpus == placed.placement.trainer_gpus == [0]
    devices = {spec.name: spec.env.get("CUDA_VISIBLE_DEVICES") for spec in role_specs(placed, tmp_path / "config.yaml")}
    assert devices["rollout-0"] == devices["trainer"] == "0"
    assert load_config(None, ["async_ratio=0", "placement.colocate=true", "placement.rollout_gpus=[1]",
                              "placement.trainer_gpus=[1]"]).placement.colocate
    with pytest.raises(ConfigError, match=r"take turns on one device, but placement names cuda:0 and cuda:1"):
        load_config(None, ["async_ratio=0", "placement.colocate=true", "placement.rollout_gpus=[0]", "placement.trainer_gpus=[1]"])
    with pytest.raises(ConfigError, match=r"placement.colocate takes turns .*async_ratio 2.0 \(needs 0\), rollout.num_workers 2"):
        load_config(None, ["async_ratio=2", "rollout.num_workers=2", "placement.colocate=true"])
    with pytest.raises(ConfigError, match=r"trainer.offload_optimizer frees the device for an engine that shares it"):
        load_config(None, ["trainer.offload_optimizer=true"])


def test_devices_placement_names_must_exist_and_cover_every_role():
    named = load_config(None, ["placement.rollout_gpus=[0]", "placement.trainer_gpus=[5]"])
    with pytest.raises(ConfigError, match=r"placement names cuda:5; 2 device\(s\) are visible"):
        place_gpus(named, available=2)
    assert place_gpus(named, available=6) is named
    half = load_config(None, ["placement.rollout_gpus=[1]"])
    with pytest.raises(ConfigError, match=r"not placement.trainer_gpus: those roles would default to cuda:0"):
        place_gpus(half, available=2)


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    assert visible_gpus() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == 0


def test_rollout_nice_reaches_every_thread_and_the_processes_started_after():
    """placement.rollout_nice: Linux keeps niceness per thread, so a thread started before (zmq's,
    say) must be set too, an engine process started after must inherit it, and the session's
    autogroup must follow. In a child process: this one's priority stays as it is."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import os, threading
        from flashq.placement import lower_priority
        os.setsid()  # its own session, as the launcher starts a role: and so its own autogroup
        stop = threading.Event()
        early = threading.Thread(target=stop.wait); early.start()
        lower_priority(7)
        late = threading.Thread(target=stop.wait); late.start()
        nices = [os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")]
        child = os.fork()
        if child == 0:
            os._exit(os.getpriority(os.PRIO_PROCESS, 0))
        _, status = os.waitpid(child, 0)
        stop.set(); early.join(); late.join()
        try:
            group = open("/proc/self/autogroup").read().split("nice")[1].strip()
        except FileNotFoundError:
            group = "none"
        print(len(nices), group, sorted(set(nices)), os.waitstatus_to_exitcode(status))
    """)
    count, group, nices = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout.split(maxsplit=2)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert count == "3" and nices.strip() == f"[{max(base, 7)}] {max(base, 7)}"
    # with autogroups on, the scheduler shares the CPU between sessions first: the session's group
    # must be lowered too, or the threads' niceness changes nothing against the trainer's session
    assert group in ("7", "none"), group

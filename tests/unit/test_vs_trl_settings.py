"""bench/vs_trl.py gives both systems one optimizer: flashq's overrides decay exactly the
parameters transformers' Trainer (TRL's) decays, on the model both train."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Trainer

from bench.vs_trl import FLASHQ_OPTIMIZER
from flashq.config import load_config
from flashq.trainer.learner import decay_groups


def decayed_by_flashq(model, overrides: list[str]) -> set[int]:
    tc = load_config(None, [*overrides, "trainer.weight_decay=1.0"]).trainer
    groups = decay_groups(list(model.parameters()), tc.weight_decay, tc.weight_decay_scope)
    return {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}


def test_flashq_decays_what_transformers_trainer_decays(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    # transformers' rule reads only the model; it names the tied LM head apart from the embedding it shares
    trl_decays = {id(model.get_parameter(n)) for n in Trainer.get_decay_parameter_names(None, model)}
    assert decayed_by_flashq(model, FLASHQ_OPTIMIZER) == trl_decays
    assert decayed_by_flashq(model, []) != trl_decays  # the quickstart's own scope (all) reaches further


def test_an_interrupted_calibration_goes_on_where_it_stopped(tmp_path, monkeypatch):
    """Job R's calibration takes hours and may be cut off: what it finished is kept, taken up
    again only on the same code, the same kind of CPU and the same number of steps, and the
    choice is made over every run. (The runs are faked: this tests the bookkeeping.)"""
    from bench import common
    from bench import vs_trl

    monkeypatch.setattr(vs_trl, "CALIBRATION_RUNS", tmp_path / "runs.jsonl")
    monkeypatch.setattr(vs_trl, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(vs_trl, "code_fingerprint", lambda *extra: "abc")
    monkeypatch.setattr(common, "git_commit", lambda: "c1")
    monkeypatch.setattr(vs_trl, "make_sft", lambda job, work: work / "sft")
    monkeypatch.setattr(vs_trl, "TRL_SETTINGS", {"default": [], "paged": []})
    monkeypatch.setattr(vs_trl, "FLASHQ_SETTINGS", {"turns": [], "split": []})
    written, calls, cut = [], [], [5]
    monkeypatch.setattr(vs_trl, "write_result", lambda name, rows, figures, notes: written.append((rows, figures)))
    wall = {"default": 50.0, "paged": 40.0, "turns": 10.0, "split": 20.0}  # the fastest: paged, turns

    def run(system):
        def go(*args):
            seed, setting = args[-2], args[-1]
            if len(calls) in cut:
                cut.clear()
                raise RuntimeError("cut off")  # the session ends during the sixth run
            calls.append((system, setting, seed))
            return {"wall_s": wall[setting], "curve": [[1, 0.5]]}
        return go

    monkeypatch.setattr(vs_trl, "run_trl", run("trl"))
    monkeypatch.setattr(vs_trl, "run_flashq", lambda job, mode, *args: run("flashq")(*args))
    with pytest.raises(RuntimeError, match="cut off"):
        vs_trl.calibrate(12)
    assert len(calls) == 5 and not written
    monkeypatch.setattr(common, "git_commit", lambda: "c2")  # a later commit that left the code as it was
    vs_trl.calibrate(12)
    assert len(calls) == 8 and calls[5:] == [("trl", "paged", 101), ("flashq", "turns", 101), ("flashq", "split", 101)]
    rows, figures = written[-1]
    assert figures["chosen"] == {"trl": "paged", "flashq": "turns"} and len(rows) == 8
    assert [r["git_commit"] for r in rows] == ["c1"] * 5 + ["c2"] * 3 and "code" not in rows[0]
    vs_trl.calibrate(12)
    assert len(calls) == 8  # all kept now
    vs_trl.calibrate(8)  # other steps: run again
    monkeypatch.setattr(vs_trl, "cpu_model", lambda: "Intel Xeon")
    vs_trl.calibrate(12)  # another kind of CPU: run again
    assert len(calls) == 24


def test_reported_runs_go_on_where_they_were_cut_off(tmp_path, monkeypatch):
    """Reported runs outlast a session: each finished run is kept with the commit it ran at and
    reused only under the same code, CPU, steps and settings (job R), and for the toy jobs, whose
    SFT each command makes anew, only from the same SFT weights and tasks."""
    from bench import common
    from bench import vs_trl

    monkeypatch.setattr(vs_trl, "REPORTED_RUNS", tmp_path / "runs.jsonl")
    monkeypatch.setattr(vs_trl, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(common, "git_commit", lambda: "c1")
    monkeypatch.setattr(vs_trl, "code_fingerprint", lambda *extra: "abc")
    settings = {"trl": "paged", "flashq": "turns"}
    calls = []

    def go(name):
        def run():
            calls.append(name)
            return {"wall_s": 1.0, "curve": [[0.5, 0.1]], "name": name}
        return run

    trl0, flashq0 = {"system": "trl", "seed": 0}, {"system": "flashq", "seed": 0}
    first = vs_trl.reported_runs("r", 40, settings, tmp_path, tmp_path)
    assert first.run(trl0, go("trl0"))["name"] == "trl0"
    monkeypatch.setattr(common, "git_commit", lambda: "c2")  # a later commit that left the code as it was
    again = vs_trl.reported_runs("r", 40, settings, tmp_path, tmp_path)
    assert again.run(trl0, go("trl0 again")) == {**again.run(trl0, go("-")), "name": "trl0", "git_commit": "c1"}
    assert again.run(flashq0, go("flashq0"))["git_commit"] == "c2"
    assert calls == ["trl0", "flashq0"]
    for steps, changed in [(12, settings), (40, {**settings, "trl": "default"})]:
        assert vs_trl.reported_runs("r", steps, changed, tmp_path, tmp_path).kept == {}
    monkeypatch.setattr(vs_trl, "code_fingerprint", lambda *extra: "newer")
    assert vs_trl.reported_runs("r", 40, settings, tmp_path, tmp_path).kept == {}
    monkeypatch.setattr(vs_trl, "KEPT", tmp_path)
    monkeypatch.setattr(vs_trl, "code_fingerprint", lambda *extra: ",".join(extra))

    def command(name: str, weights: bytes, tasks: bytes = b"") -> tuple[Path, Path]:
        work = tmp_path / name
        (work / "sft").mkdir(parents=True)
        (work / "sft" / "model.safetensors").write_bytes(weights)
        (work / "repeat.jsonl").write_bytes(tasks)
        return work, work / "sft"

    vs_trl.reported_runs("a", 40, settings, *command("first", b"w1")).run(trl0, go("a0"))
    assert vs_trl.reported_runs("a", 40, settings, *command("next", b"w1")).run(trl0, go("a0 again"))["name"] == "a0"
    assert vs_trl.reported_runs("a", 40, settings, *command("other sft", b"w2")).kept == {}
    vs_trl.reported_runs("b", 40, settings, *command("b first", b"w1", b"tasks 1")).run(trl0, go("b0"))
    assert vs_trl.reported_runs("b", 40, settings, *command("b next", b"w1", b"tasks 1")).kept
    assert vs_trl.reported_runs("b", 40, settings, *command("b other tasks", b"w1", b"tasks 2")).kept == {}
    assert calls == ["trl0", "flashq0", "a0", "b0"]


def test_colocate_benchmark_goes_on_where_it_was_cut_off(tmp_path, monkeypatch):
    """bench/colocate.py's six runs take over an hour: those finished are kept and not run again,
    on the same code, kind of CPU and steps only. (`run` is faked: this tests the bookkeeping.)"""
    from bench import colocate, common

    monkeypatch.setattr(colocate, "RUNS", tmp_path / "runs.jsonl")
    monkeypatch.setattr(colocate, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(common, "git_commit", lambda: "c1")
    monkeypatch.setattr(colocate, "code_fingerprint", lambda *extra: "abc")
    calls, cut = [], [4]

    def run(mode, work, steps, seed):
        if len(calls) in cut:
            cut.clear()
            raise RuntimeError("cut off")  # the session ends during the fifth run
        calls.append((mode, seed))
        return {"mode": mode, "seed": seed, "steps": steps, "wall_s": 100.0 + len(calls)}

    monkeypatch.setattr(colocate, "run", run)
    with pytest.raises(RuntimeError, match="cut off"):
        colocate.measured_runs(24, [0, 1])
    assert len(calls) == 4
    monkeypatch.setattr(common, "git_commit", lambda: "c2")  # a later commit that left the code as it was
    rows = colocate.measured_runs(24, [0, 1])
    assert len(calls) == 6 and calls[4:] == [("turns", 1), ("split", 1)]  # only the two not finished
    assert [(r["mode"], r["seed"]) for r in rows] == [(m, s) for s in (0, 1) for m in colocate.MODES]
    assert [r["git_commit"] for r in rows] == ["c1"] * 4 + ["c2"] * 2 and rows[0]["wall_s"] == 101.0
    assert "code" not in rows[0] and "cpu_model" not in rows[0]
    assert len(colocate.measured_runs(24, [0, 1])) == 6 and len(calls) == 6  # all kept now
    colocate.measured_runs(12, [0])  # other steps: run again
    monkeypatch.setattr(colocate, "code_fingerprint", lambda *extra: "newer")
    colocate.measured_runs(24, [0])  # other code: run again
    assert len(calls) == 12


def test_trls_paged_setting_trains_float32_weights():
    """TRL's paged generation casts the policy to bf16 in place and leaves it there; the runner's
    callback must put the float32 weights back before each optimizer step, so an update below
    bf16's resolution still lands (as it does in TRL's other settings)."""
    from bench.trl_runner import float32_masters

    model = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    callback = float32_masters(model)
    for _ in range(3):
        callback.on_step_begin(None, None, None)
        model.to(torch.bfloat16)  # what GRPOTrainer does before `generate_batch`
        model(torch.ones(1, 4, dtype=torch.bfloat16)).sum().backward()
        callback.on_pre_optimizer_step(None, None, None)
        assert model.weight.dtype == model.weight.grad.dtype == torch.float32
        opt.step()
        opt.zero_grad()
    # three steps of 1e-4 each: 1 - 3e-4 in float32; in bf16 (resolution 2^-8 near 1) they would vanish
    assert model.weight[0, 0].item() == pytest.approx(1 - 3e-4, rel=1e-6)

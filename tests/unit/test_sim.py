"""The simulator: flashq's own coordinator logic driven by modelled engines and trainer."""

import json

import numpy as np
import pytest

from flashq.config import ConfigError, load_config
from flashq.sim.calibration import Calibration, simulated_step_s
from flashq.sim.simulator import Simulation, sweep

LONGTAIL = ["sampling.forced_lengths={median: 32, sigma: 1.3, min: 4, max: 1024}", "sampling.max_tokens=1024",
            "rollout.max_model_len=1152", "rollout.num_workers=2", "trainer.batch_groups=8", "trainer.steps=12"]


def simulate(*overrides, cal=Calibration()):
    return Simulation(load_config(None, [*LONGTAIL, *overrides]), cal)


def test_async_beats_sync_on_a_long_tail_and_keeps_the_books():
    sync_sim, async_sim = simulate("async_ratio=0"), simulate("async_ratio=2")
    sync, fast = sync_sim.run(), async_sim.run()
    assert sync["steps"] == fast["steps"] == 12
    assert fast["tokens_per_s"] > 1.3 * sync["tokens_per_s"] and fast["engine_idle_share"] < sync["engine_idle_share"]
    books = async_sim.orch.ledger.summary(async_sim.orch.buffer)
    assert books["samples_trained"] == 12 * 8 * 8 and books["requests_in_flight"] == 0


def test_oracle_order_is_no_slower_than_fifo_with_a_small_engine_batch():
    fifo = simulate("async_ratio=0", "rollout.max_num_seqs=8", "rollout.max_inflight_per_worker=8").run()
    oracle = simulate("async_ratio=0", "rollout.max_num_seqs=8", "rollout.max_inflight_per_worker=8", "rollout.scheduler=oracle").run()
    assert oracle["seconds"] <= fifo["seconds"] * 1.001


def test_sweep_covers_the_grid_and_names_bad_axes(tmp_path):
    rows = sweep(None, LONGTAIL, ["async_ratio=0,2", "rollout.num_workers=1,2"], Calibration())
    assert [r["settings"] for r in rows][:2] == [{"async_ratio": "0", "rollout.num_workers": "1"}, {"async_ratio": "0", "rollout.num_workers": "2"}]
    with pytest.raises(ConfigError, match="not of the form"):
        sweep(None, LONGTAIL, ["async_ratio"], Calibration())
    with pytest.raises(ConfigError, match="needs sampling.forced_lengths"):
        Simulation(load_config(None), Calibration())


def test_calibration_fits_runs_by_simulating_them(tmp_path):
    """Runs made by the simulator itself under known constants (alpha 0 and 2: different batch
    dynamics); fitting from the defaults must predict their step times again."""
    from flashq.config import dump_config

    truth = Calibration(step_s=4e-3, step_s_per_seq=2e-4, train_s=0.05, train_s_per_token=1e-5, weight_sync_s=0.2)
    runs = []
    for name, alpha in (("a", 0), ("b", 2)):
        cfg = load_config(None, [*LONGTAIL, f"async_ratio={alpha}", "trainer.steps=6"])
        result = Simulation(cfg, truth).run()
        steps = [{"kind": "step", "step": i, "train/tokens": 500.0 * i, "train/seconds": 0.05 + 1e-5 * 500 * i,
                  "trainer/weight_sync_s": 0.2, "time/since_generation_s": sum(result["step_s_per_step"][:i])} for i in range(1, 7)]
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
        dump_config(cfg, tmp_path / name / "config.yaml")
        runs.append((tmp_path / name, (result["seconds"] - result["step_s_per_step"][0]) / 5))
    cal = Calibration.fit([r for r, _ in runs], starts=1, evaluations=60)
    assert cal.train_s_per_token == pytest.approx(1e-5, rel=1e-6) and cal.weight_sync_s == pytest.approx(0.2)
    for run, seconds in runs:
        predicted = Simulation(load_config(run / "config.yaml"), cal).run()
        assert simulated_step_s(predicted) == pytest.approx(seconds, rel=0.05)
    cal.save(tmp_path / "cal.json")
    assert Calibration.load(tmp_path / "cal.json") == cal


def test_engines_sharing_a_core_take_turns():
    one_core = simulate("async_ratio=0", "placement.rollout=[0]").run()
    own_devices = simulate("async_ratio=0").run()
    assert one_core["seconds"] > 1.3 * own_devices["seconds"]  # two engines, one core


def test_speculation_turns_on_in_the_tail_and_off_at_large_batch():
    cal = Calibration(step_s=10e-3, step_s_per_seq=1e-3, spec_accept=0.6, verify_s_per_token=1e-3)
    step1, tokens1 = cal.decode(np.full(1, 0.6))
    assert tokens1[0] > 1.5 and step1 / tokens1[0] < cal.step_time(1)  # one request alone: drafts pay
    step, tokens = cal.decode(np.full(256, 0.6))
    assert step == cal.step_time(256) and (tokens == 1.0).all()  # a full batch: a verified draft costs what a request does
    plain, spec = simulate("async_ratio=0").run(), simulate("async_ratio=0", cal=Calibration(spec_accept=0.6)).run()
    assert plain["mean_acceptance_length"] == 1.0 and spec["mean_acceptance_length"] > 1.5
    assert spec["seconds"] < plain["seconds"]


def test_tail_time_is_the_last_tenth_of_each_steps_responses():
    sim = simulate("async_ratio=0", "trainer.steps=2")
    result = sim.run()
    assert len(result["rollout_s_per_step"]) == len(result["tail_s_per_step"]) == 2
    ends = sorted(t for rid, t in sim.finished.items() if int(rid.split("/")[0][1:]) < 8)
    assert result["tail_s_per_step"][0] == pytest.approx(ends[-1] - ends[57])  # the 58th of 64 finished: 90% done
    assert 0 < result["tail_s_mean"] < result["rollout_s_mean"]


def test_a_full_kv_cache_preempts_and_costs_time_but_loses_no_request():
    """Every request dispatched at once into an engine whose cache holds a few of them: vLLM
    preempts the request admitted last and prefills it again later, so the run is slower than
    with room for all, and every response still arrives whole."""
    cal = Calibration(step_s_per_kv_token=1e-6, prefill_s_per_token=1e-4)
    roomy_sim = simulate("async_ratio=0", "trainer.steps=2", "rollout.max_inflight_per_worker=64", cal=cal)
    tight_sim = simulate("async_ratio=0", "trainer.steps=2", "rollout.max_inflight_per_worker=64",
                         cal=Calibration(**{**cal.__dict__, "kv_tokens": 1000.0}))
    roomy, tight = roomy_sim.run(), tight_sim.run()
    assert sum(e.preemptions for e in roomy_sim.engines.values()) == 0
    assert sum(e.preemptions for e in tight_sim.engines.values()) > 0
    assert tight["seconds"] > roomy["seconds"]
    assert tight_sim.orch.ledger.summary(tight_sim.orch.buffer)["samples_trained"] == 2 * 8 * 8
    for engine in tight_sim.engines.values():
        assert not engine.running and not engine.waiting


def test_step_time_grows_with_the_context_the_cache_holds():
    cal = Calibration(step_s=1e-3, step_s_per_seq=0.0, step_s_per_kv_token=1e-6)
    assert cal.decode(np.zeros(8), kv=0.0)[0] == pytest.approx(1e-3) and cal.decode(np.zeros(8), kv=4000.0)[0] == pytest.approx(5e-3)


def test_grouped_drafts_accept_more_as_a_group_finishes():
    by_refs = [0.3, 0.5, 0.7]
    cal = Calibration(step_s=10e-3, step_s_per_seq=1e-3, verify_s_per_token=1e-3, spec_accept_by_refs=by_refs)
    assert [cal.accept(n) for n in (0, 1, 2, 9)] == [0.3, 0.5, 0.7, 0.7]
    step, tokens = cal.decode(np.array([0.3, 0.7]))
    assert tokens[1] > tokens[0] > 1  # one draft length for the batch, each request its own acceptance
    flat = simulate("async_ratio=0", cal=Calibration(spec_accept=0.3)).run()
    grouped = simulate("async_ratio=0", cal=Calibration(spec_accept_by_refs=by_refs)).run()
    assert grouped["mean_acceptance_length"] > flat["mean_acceptance_length"] and grouped["seconds"] < flat["seconds"]


def test_oversubscribed_cores_lose_more_than_their_share_with_contention_above_one():
    def run(workers, contention):
        return simulate("async_ratio=0", "placement.rollout=[0]", f"rollout.num_workers={workers}",
                        cal=Calibration(engine_cores=1.0, contention=contention)).run()["seconds"]

    assert run(2, 1.5) > run(2, 1.0)  # two engines on one core: switching costs on top of sharing
    assert run(1, 1.5) == run(1, 1.0)  # one engine on its core: nothing is oversubscribed


def test_engines_sharing_a_core_wait_for_it_each_step_and_short_steps_lose_the_most():
    def slowdown(switch_s, batch):
        def run(workers):
            return simulate("async_ratio=0", "placement.rollout=[0]", f"rollout.num_workers={workers}",
                            f"rollout.max_num_seqs={batch}", f"rollout.max_inflight_per_worker={batch}",
                            cal=Calibration(engine_cores=1.0, contention=1.0, switch_s=switch_s)).run()["seconds"]
        return run(2) / run(1)

    small, large = slowdown(2e-3, 4) / slowdown(0.0, 4), slowdown(2e-3, 64) / slowdown(0.0, 64)
    assert small > large > 1  # the wait slows two engines on one core, and short steps the most


def test_engine_rates_count_tokens_over_busy_time_inside_the_steady_window(tmp_path):
    """Between the first and last trainer step (t = 10 .. 30): worker a is busy 10-20 (two
    overlapping responses, counted once) and generates 100 + 50 tokens there; worker b's response
    runs 0-20, so only its half inside the window counts."""
    from flashq.sim.calibration import measured_engine_rates

    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "step", "step": i, "time/since_generation_s": t}) + "\n" for i, t in ((1, 10.0), (2, 30.0))))
    trace = [{"worker": "a", "sent": 10.0, "finished": 20.0, "tokens": 100},
             {"worker": "a", "sent": 15.0, "finished": 20.0, "tokens": 50},
             {"worker": "b", "sent": 0.0, "finished": 20.0, "tokens": 400}]
    assert measured_engine_rates(tmp_path) == {}
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    assert measured_engine_rates(tmp_path) == pytest.approx({"a": 150 / 10, "b": 200 / 10})


def test_runs_of_one_configuration_are_its_repeats_and_measured_by_their_mean(tmp_path):
    """a1 and a2 differ only in their log section (their run dirs): repeats, whose step times
    (2 s, 3 s) and engine rates (50, 100 tokens per busy second) are averaged; b is its own."""
    from flashq.sim.calibration import configurations, measured_mean
    from flashq.config import dump_config

    for name, alpha, step_s, tokens, busy in (("a1", 0, 2.0, 100, 2.0), ("b", 2, 1.0, 0, 0.0), ("a2", 0, 3.0, 400, 4.0)):
        run = tmp_path / name
        run.mkdir()
        dump_config(load_config(None, [*LONGTAIL, f"async_ratio={alpha}", f"log.run_dir={run}"]), run / "config.yaml")
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"kind": "step", "step": i, "time/since_generation_s": step_s * i}) + "\n" for i in (1, 2, 3)))
        if tokens:  # one response, from the first trainer step on
            trace = {"worker": "rollout-0", "sent": step_s, "finished": step_s + busy, "tokens": tokens}
            (run / "requests.jsonl").write_text(json.dumps(trace) + "\n")
    groups = configurations([tmp_path / "a1", tmp_path / "b", tmp_path / "a2"])
    assert groups == [[tmp_path / "a1", tmp_path / "a2"], [tmp_path / "b"]]
    assert measured_mean(groups[0]) == (pytest.approx(2.5), pytest.approx({"rollout-0": 75.0}))
    assert measured_mean(groups[1]) == (pytest.approx(1.0), {})


@pytest.mark.parametrize("text, message", [
    ("{not json", "calibration"),
    ("[1, 2]", "expected a JSON object"),
    ('{"stepz": 1}', r"unknown constant\(s\) \['stepz'\]"),
    ('{"step_s": "fast"}', "step_s must be a number >= 0, got 'fast'"),
    ('{"kv_tokens": -5}', "kv_tokens must be a number >= 0"),
    ('{"spec_accept_by_refs": [0.5, 1.0]}', r"spec_accept_by_refs must be a list of probabilities in \[0, 1\), got \[0.5, 1.0\]"),
    ('{"spec_accept_by_refs": 0.5}', "spec_accept_by_refs must be a list of probabilities"),
])
def test_a_bad_calibration_file_names_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        Calibration.load(path)

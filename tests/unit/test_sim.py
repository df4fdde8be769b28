"""The simulator: flashq's own coordinator logic driven by modelled engines and trainer."""

import json

import pytest

from flashq.config import ConfigError, load_config
from flashq.sim import Calibration, Simulation, sweep

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


def test_calibration_recovers_the_step_time_line(tmp_path):
    """Two runs whose engines ran at mean batch 4 and 32 under T(B) = 2ms + 0.1ms * B."""
    runs = []
    for name, batch in (("a", 4.0), ("b", 32.0)):
        busy = 10.0
        tokens = batch * busy / (2e-3 + 1e-4 * batch)
        steps = [{"kind": "step", "step": i, "train/tokens": 100.0 * i, "train/seconds": 0.01 + 1e-4 * 100 * i,
                  "trainer/weight_sync_s": 0.2, "rollout/busy_s_total/rollout-0": busy,
                  "rollout/load_s_total/rollout-0": batch * busy, "rollout/tokens_total/rollout-0": tokens} for i in (1, 2, 3)]
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
        runs.append(tmp_path / name)
    cal = Calibration.fit(runs)
    assert cal.step_s == pytest.approx(2e-3, rel=1e-6) and cal.step_s_per_seq == pytest.approx(1e-4, rel=1e-6)
    assert cal.train_s_per_token == pytest.approx(1e-4, rel=1e-6) and cal.weight_sync_s == pytest.approx(0.2)
    cal.save(tmp_path / "cal.json")
    assert Calibration.load(tmp_path / "cal.json") == cal


def test_speculation_turns_on_in_the_tail_and_off_at_large_batch():
    cal = Calibration(step_s=10e-3, step_s_per_seq=1e-3, spec_accept=0.6, verify_s_per_token=1e-3)
    step1, tokens1 = cal.decode(1)
    assert tokens1 > 1.5 and step1 / tokens1 < cal.step_time(1)  # one request alone: drafts pay
    assert cal.decode(256) == (cal.step_time(256), 1.0)  # a full batch: a verified draft costs what a request does
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

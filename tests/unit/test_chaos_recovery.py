"""bench/chaos.py's recovery books: each kill is credited only with what happened before the next
kill of its role, or before the trainer's kill resumed the whole run. At 2d1e293 a rollout worker
killed 14 s before the trainer came back with the resumed run, and its "restart" was read off its
next kill's return 105 s later."""

from bench.chaos import recovery


def event(t: float, peer: str, what: str) -> dict:
    return {"time": t, "peer": peer, "event": what}


def test_a_restart_overtaken_by_the_trainers_resume_is_not_read_off_the_next_kill():
    kills = [{"time": 0.0, "role": "rollout-0", "step": 789}, {"time": 14.0, "role": "trainer", "step": 949},
             {"time": 94.0, "role": "rollout-0", "step": 1711}, {"time": 120.0, "role": "reward-1", "step": 1775}]
    events = [event(0.1, "rollout-0", "lost"), event(30.0, "coordinator", "started"),
              event(94.1, "rollout-0", "lost"), event(105.0, "rollout-0", "rejoined"), event(105.2, "rollout-0", "serving"),
              event(120.1, "reward-1", "lost"), event(120.8, "reward-1", "rejoined")]
    first, trainer, second, reward = recovery(kills, events, [])
    assert first["detected_s"] == 0.1 - 0.0
    assert first["rejoined_s"] is None and first["serving_s"] is None
    assert first["overtaken_by"] == "trainer killed at step 949 (the whole run resumed)"
    assert trainer["rejoined_s"] == 30.0 - 14.0
    assert round(second["serving_s"], 6) == 11.2 and "overtaken_by" not in second
    assert round(reward["serving_s"], 6) == 0.8  # a reward worker serves once it is back


def test_a_worker_killed_again_before_it_returned_gets_no_figure_from_the_next_return():
    kills = [{"time": 0.0, "role": "rollout-1", "step": 10}, {"time": 5.0, "role": "rollout-1", "step": 12}]
    events = [event(0.2, "rollout-1", "lost"), event(17.0, "rollout-1", "rejoined"), event(17.1, "rollout-1", "serving")]
    first, second = recovery(kills, events, [])
    assert first["rejoined_s"] is None and "overtaken_by" not in first  # killed again by chaos, not resumed
    assert second["rejoined_s"] == 12.0

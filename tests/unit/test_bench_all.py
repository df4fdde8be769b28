"""bench/all.py, the benchmark sweep: its bounds, figure comparison and drift, its plan. Nothing runs
a benchmark here; each test fails when the logic it names breaks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import all as sweep
from bench import common, figures
from bench.sweep_plan import BENCHES, SKIPPED, Bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, want", [(">= 0.25", (">=", 0.25)), ("<= 20", ("<=", 20.0)), ("== 0", ("==", 0.0)),
                                        ("<0.5", ("<", 0.5)), (" > -1e-3 ", (">", -0.001))])
def test_parse_bound_reads_a_side_and_a_number(text, want):
    assert sweep.parse_bound(text) == want


@pytest.mark.parametrize("text", ["=> 2", "about 3", ">= ", "20", ""])
def test_parse_bound_refuses_what_is_not_a_bound(text):
    with pytest.raises(ValueError):
        sweep.parse_bound(text)


def test_meets_each_side_at_its_edge():
    assert sweep.meets(0.25, ">=", 0.25) and not sweep.meets(0.24, ">=", 0.25)
    assert sweep.meets(20, "<=", 20) and not sweep.meets(20.1, "<=", 20)
    assert sweep.meets(0, "==", 0) and not sweep.meets(1, "==", 0)
    assert not sweep.meets(1, ">", 1) and sweep.meets(0.9, "<", 1)


def test_judge_bounds_reads_a_bounds_dict_and_bare_bound_numbers():
    figs = {"real_model_wall_minutes": 20.3, "samples_lost": 0, "bounds": {"real_model_wall_minutes": "<= 20", "samples_lost": "== 0"},
            "lora_reward_gain": 0.3, "lora_reward_gain_bound": 0.2,
            "adapter_push_bytes_vs_full": 0.1, "adapter_push_bytes_vs_full_bound": 0.05,
            "reward_gain": 0.5}  # no reward_gain_bound here: no bound
    got = {r["figure"]: (r["bound"], r["met"]) for r in sweep.judge_bounds(figs)}
    assert got == {"real_model_wall_minutes": ("<= 20", False), "samples_lost": ("== 0", True),
                   "lora_reward_gain": (">= 0.2", True), "adapter_push_bytes_vs_full": ("<= 0.05", False)}


def test_a_bound_on_a_missing_figure_is_neither_met_nor_failed():
    [row] = sweep.judge_bounds({"bounds": {"x": ">= 1"}})
    assert row["met"] is None


def test_judge_bounds_agrees_with_the_docs_tables_on_every_result_file():
    for entry in figures.ENTRIES.values():
        data = json.loads((figures.RESULTS / f"{entry.result}.json").read_text())
        docs = {fig: ok for fig, (_, _, _, ok) in figures.bounds(data).items()}
        ours = {r["figure"]: r["met"] for r in sweep.judge_bounds(data["figures"]) if r["met"] is not None}
        assert ours == docs, entry.result


def test_flatten_joins_nested_names_with_dots_and_drops_the_archive():
    flat = sweep.flatten({"a": 1, "by_role": {"trainer": {"s": 2.0}}, "xs": [1, 2], "earlier": [{"a": 0}]})
    assert flat == {"a": 1, "by_role.trainer.s": 2.0, "xs": [1, 2]}


def test_spread_is_the_range_of_the_values_listed_beside_a_figure():
    flat = {"reward_gain_per_seed": [0.1, 0.4, 0.2], "x_spread": [1.0, 1.5], "y_by_round": [2.0],
            "eval_greedy_gain_per_seed": [0.3, 0.6], "eps_alpha2_without_redundancy_vs_sync_spread": [0.5, 9.0]}
    assert sweep.spread("reward_gain", flat) == pytest.approx(0.3)
    assert sweep.spread("x", flat) == pytest.approx(0.5)
    assert sweep.spread("y", flat) is None  # one round: no range
    assert sweep.spread("real_model_eval_greedy_gain", flat) == pytest.approx(0.3)  # the list names the figure's tail
    assert sweep.spread("eps_alpha2_vs_sync", flat) is None  # another figure's list


def test_widest_spreads_takes_the_widest_any_file_records():
    one, other = {"figures": {"g": 1, "g_per_seed": [1, 2]}}, {"figures": {"g_per_seed": [0, 3]}}
    assert sweep.widest_spreads(["g", "h"], one, None, other) == {"g": 3}


def test_compare_flags_a_move_beyond_the_tolerance_only():
    rows = {r["figure"]: r for r in sweep.compare({"a": 1.0, "b": 1.0}, {"a": 1.1, "b": 1.2}, ["a", "b"], {}, 0.15)}
    assert rows["a"]["moved"] is False and rows["b"]["moved"] is True
    assert rows["b"]["change"] == pytest.approx(0.2) and rows["b"]["basis"] == "15%"


def test_compare_uses_the_recorded_spread_instead_of_the_tolerance():
    [wide] = sweep.compare({"g": 0.5}, {"g": 0.8}, ["g"], {"g": 0.4}, 0.15)
    [narrow] = sweep.compare({"g": 0.5}, {"g": 0.8}, ["g"], {"g": 0.2}, 0.15)
    assert (wide["moved"], wide["basis"]) == (False, "spread") and narrow["moved"] is True


def test_compare_from_zero_any_change_moves_and_a_flipped_flag_moves():
    assert sweep.compare({"lost": 0}, {"lost": 1}, ["lost"], {}, 0.15)[0]["moved"] is True
    assert sweep.compare({"lost": 0}, {"lost": 0}, ["lost"], {}, 0.15)[0]["moved"] is False
    assert sweep.compare({"fits": True}, {"fits": False}, ["fits"], {}, 0.15)[0]["moved"] is True


def test_compare_reads_nested_figures_and_marks_one_sided_ones():
    rows = {r["figure"]: r for r in sweep.compare({"p": {"q": 1.0}, "old": 2}, {"p": {"q": 2.0}, "new": 3},
                                                  ["p.q", "old", "new", "neither"], {}, 0.15)}
    assert rows["p.q"]["moved"] is True
    assert rows["old"]["moved"] is None and rows["new"]["moved"] is None and "neither" not in rows


def test_compare_without_names_takes_every_number_both_hold():
    rows = sweep.compare({"a": 1, "s": "x", "only_before": 2, "earlier": [{"a": 5}]}, {"a": 1, "s": "x"}, [], {}, 0.15)
    assert [r["figure"] for r in rows] == ["a"]


def test_select_keeps_the_plans_order_and_leaves_out_skips():
    assert [b.name for b in sweep.select(BENCHES, ["fuzz", "queue"], [])] == ["queue", "fuzz"]
    rest = [b.name for b in sweep.select(BENCHES, [], ["fuzz"])]
    assert "fuzz" not in rest and len(rest) == len(BENCHES) - 1


def test_select_refuses_unknown_names_and_calibrations():
    with pytest.raises(SystemExit, match="no such benchmark"):
        sweep.select(BENCHES, ["nope"], [])
    with pytest.raises(SystemExit, match="calibration"):
        sweep.select(BENCHES, [], ["real_model_calibration"])


def test_estimates_prefer_the_minutes_the_last_sweep_measured():
    plan = [Bench("x", (("bench/x.py",),), (("bench/x.py",),), (), 10, 2), Bench("y", (("bench/y.py",),), (("bench/y.py",),), (), 20, 4)]
    last = {"results": [{"name": "x", "status": "ok", "minutes": 7.5}, {"name": "y", "status": "failed", "minutes": 0.1}]}
    assert sweep.estimates(plan, False, last) == {"x": 7.5, "y": 20}
    assert sweep.estimates(plan, True, None) == {"x": 2, "y": 4}


def test_summary_names_files_at_other_commits_moves_and_unmet_bounds():
    outcomes = [{"name": "a", "status": "ok", "reason": "", "bounds": [{"figure": "g", "met": False}, {"figure": "m", "met": None}],
                 "compared": [{"figure": "h", "moved": True}, {"figure": "k", "moved": False}]},
                {"name": "b", "status": "skipped", "reason": "no CUDA", "bounds": [], "compared": None}]
    s = sweep.summary(outcomes, {"a": "abc1234", "b": "0ld0000", "c": None}, "abc1234ffff", quick=False)
    assert s["at_other_commits"] == ["b", "c"]
    assert s["moved"] == {"a": ["h"]} and s["bounds_not_met"] == {"a": ["g"]}
    assert s["ok"] == ["a"] and s["skipped"] == {"b": "no CUDA"}
    assert s["code_changed_since"] == {"b": ["(commit 0ld0000 is not in this clone)"]}  # c names no commit


def test_the_code_changed_under_a_figure_is_named():
    """A file measured at the sweep's ff25a2b names the files the real-model reward fix (caf61c7)
    changed; a file measured at the fix itself is current and not listed."""
    changed = sweep.code_changes({"old": "ff25a2b042733d30d618e857d7cd543f58d12927", "same": "caf61c7"}, "caf61c71219de181806dd5e2a3415eab5f919be6")
    assert changed == {"old": ["configs/smollm2_arithmetic.yaml", "flashq/reporting/report.py", "flashq/rewards/reasoning_gym.py"]}


def test_the_plan_covers_every_result_file():
    files = {p.stem for p in (ROOT / "bench" / "results").glob("*.json")}
    planned = {b.name for b in BENCHES}
    assert len(planned) == len(BENCHES)
    assert not files - planned - set(SKIPPED), "a result file neither run by the sweep nor listed in sweep_plan.SKIPPED"


def test_every_planned_command_names_a_script_and_every_compared_figure_exists():
    for b in BENCHES:
        assert all((ROOT / argv[0]).is_file() for argv in (*b.full, *b.quick)), b.name
        data = json.loads((ROOT / "bench" / "results" / f"{b.name}.json").read_text())
        assert not [f for f in b.figures if f not in sweep.flatten(data["figures"])], b.name


def test_a_redirected_run_puts_its_plots_beside_its_results(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path / "quick")
    monkeypatch.setattr(common, "DOCS", tmp_path / "docs")
    monkeypatch.setenv("FLASHQ_BENCH_RESULTS", str(tmp_path / "quick"))
    assert common.plot_path("x.png") == tmp_path / "quick" / "x.png"
    monkeypatch.delenv("FLASHQ_BENCH_RESULTS")
    assert common.plot_path("x.png") == tmp_path / "docs" / "x.png"


def test_a_benchmark_whose_calibration_has_not_run_is_skipped_saying_so(monkeypatch, tmp_path):
    """vs_trl's job R runs each system at a setting chosen on calibration runs a sweep never
    redoes: without that file the sweep lists it as skipped, naming the file and why."""
    monkeypatch.setattr(sweep, "RESULTS", tmp_path)
    why = sweep.missing_need(("result:vs_trl_calibration",))
    assert why is not None and "bench/results/vs_trl_calibration.json is missing" in why and "--calibrate" in why
    (tmp_path / "vs_trl_calibration.json").write_text("{}")
    assert sweep.missing_need(("result:vs_trl_calibration",)) is None
    assert "result:vs_trl_calibration" in next(b for b in BENCHES if b.name == "vs_trl").needs


def test_resume_leaves_out_only_what_a_sweep_at_this_commit_finished_and_its_file_still_names(tmp_path):
    """A sweep cut off by a session's end goes on with `--resume`: a benchmark noted done at this
    commit is left out, with its bounds judged from its file; one noted at another commit, one that
    failed (never noted), or one whose file was rewritten since at another commit runs again."""
    done, folder = tmp_path / "sweep_done.jsonl", tmp_path / "results"
    folder.mkdir()
    plan = [Bench(n, ((f"bench/{n}.py",),), ((f"bench/{n}.py",),), (), 1, 1) for n in ("a", "b", "c", "d")]
    figs = {"g": 0.4, "bounds": {"g": ">= 0.5"}}
    for name, commit in [("a", "head"), ("b", "head"), ("c", "old"), ("d", "head")]:
        (folder / f"{name}.json").write_text(json.dumps({"git_commit": commit, "figures": figs}))
    by = {b.name: b for b in plan}
    sweep.record_done({"name": "a", "status": "ok", "commit": "head"}, done, by["a"])
    sweep.record_done({"name": "b", "status": "failed", "commit": "head"}, done, by["b"])  # not noted
    sweep.record_done({"name": "c", "status": "ok", "commit": "head"}, done, by["c"])  # its file was rewritten at "old" since
    sweep.record_done({"name": "d", "status": "ok", "commit": "older"}, done, by["d"])  # noted at another commit
    earlier = sweep.done_earlier(plan, "head", done, folder)
    assert list(earlier) == ["a"]
    assert earlier["a"]["status"] == "done earlier" and earlier["a"]["commit"] == "head"
    assert earlier["a"]["bounds"] == [{"figure": "g", "value": 0.4, "bound": ">= 0.5", "met": False}]
    assert sweep.done_earlier(plan, None, done, folder) == {}
    s = sweep.summary([earlier["a"]], {"a": "head"}, "head", quick=False)
    assert s["done_earlier"] == ["a"] and s["bounds_not_met"] == {"a": ["g"]}


def test_resume_goes_on_across_commits_that_change_no_code(monkeypatch, tmp_path):
    """A sweep longer than a session: the session commits what it measured, and the next one's
    `--resume` still leaves it out, since results, docs, tests, the sweep's runner (bench/all.py)
    and the docs' tables (bench/figures.py) are not what a sweep measures; a
    commit changing flashq/ (or a benchmark's script) makes it run again."""
    repo = tmp_path / "repo"
    (repo / "flashq").mkdir(parents=True)
    (repo / "bench" / "results").mkdir(parents=True)

    def commit(path: str, text: str) -> str:
        (repo / path).write_text(text)
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", path], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    measured = commit("flashq/core.py", "v1")
    results_only = commit("bench/results/a.json", json.dumps({"git_commit": measured, "figures": {}}))
    docs_only = commit("README.md", "figures")
    runner_only = commit("bench/all.py", "print('the runner')")
    tables_only = commit("bench/figures.py", "print('the tables')")
    script_changed = commit("bench/a.py", "print()")
    code_changed = commit("flashq/core.py", "v2")
    monkeypatch.setattr(sweep, "ROOT", repo)
    done = tmp_path / "sweep_done.jsonl"
    plan = [Bench("a", (("bench/a.py",),), (("bench/a.py",),), (), 1, 1)]
    sweep.record_done({"name": "a", "status": "ok", "commit": measured}, done, plan[0])
    folder = repo / "bench" / "results"
    for head in (measured, results_only, docs_only, runner_only, tables_only):
        earlier = sweep.done_earlier(plan, head, done, folder)
        assert earlier["a"]["commit"] == measured and "done at" in earlier["a"]["reason"], head
    assert "whose code is this commit's" in sweep.done_earlier(plan, docs_only, done, folder)["a"]["reason"]
    assert sweep.done_earlier(plan, code_changed, done, folder) == {}
    assert sweep.done_earlier(plan, script_changed, done, folder) == {}


def test_resume_reruns_only_the_benchmark_whose_own_scripts_or_commands_changed(monkeypatch, tmp_path):
    """A fix to one benchmark's harness mid-sweep sends that benchmark back, not the sweep: a's
    code is flashq/ and the scripts a.py reaches (helper.py by import, child.py as the argv of a
    process it starts), not b.py, a docstring's mention, or the plan; a's commands are part of
    its note, and a note written before notes had commands counts the plan as code."""
    repo = tmp_path / "repo"
    (repo / "flashq").mkdir(parents=True)
    (repo / "bench" / "results").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]

    def commit(path: str, text: str) -> str:
        (repo / path).write_text(text)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", path], check=True)
        return subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit("flashq/core.py", "v1")
    commit("bench/helper.py", "X = 1")
    commit("bench/child.py", "print()")
    commit("bench/sweep_plan.py", "PLAN = 1")
    commit("bench/b.py", "print()")
    measured = commit("bench/a.py", '"""Unlike bench/b.py."""\nfrom bench.helper import X\nARGV = ["python", "bench/child.py"]\n')
    commit("bench/results/a.json", json.dumps({"git_commit": measured, "figures": {}}))
    monkeypatch.setattr(sweep, "ROOT", repo)
    a = Bench("a", (("bench/a.py",),), (("bench/a.py",),), (), 1, 1)
    assert sorted(s for s in ("a", "b", "child", "helper", "sweep_plan")
                  if f":(exclude)bench/{s}.py" not in sweep.bench_code(a, repo)) == ["a", "child", "helper"]
    folder, done, old_note = repo / "bench" / "results", tmp_path / "done.jsonl", tmp_path / "old.jsonl"
    sweep.record_done({"name": "a", "status": "ok", "commit": measured}, done, a)
    old_note.write_text(json.dumps({"name": "a", "commit": measured, "date": "then"}) + "\n")
    other_bench = commit("bench/b.py", "print('fixed')")
    plan_changed = commit("bench/sweep_plan.py", "PLAN = 2")
    assert "a" in sweep.done_earlier([a], other_bench, done, folder)
    assert "a" in sweep.done_earlier([a], plan_changed, done, folder)
    assert "a" in sweep.done_earlier([a], other_bench, old_note, folder)
    assert sweep.done_earlier([a], plan_changed, old_note, folder) == {}
    longer = Bench("a", (("bench/a.py", "--rounds", "5"),), (("bench/a.py",),), (), 1, 1)
    assert sweep.done_earlier([longer], plan_changed, done, folder) == {}
    assert sweep.done_earlier([a], commit("bench/child.py", "print('fixed')"), done, folder) == {}
    subprocess.run([*git, "reset", "-q", "--hard", plan_changed], check=True)
    assert sweep.done_earlier([a], commit("bench/helper.py", "X = 2"), done, folder) == {}


def test_resume_is_refused_for_a_quick_sweep():
    with pytest.raises(SystemExit):
        sweep.main(["--quick", "--resume", "--dry-run"])


def test_the_docs_tables_follow_every_result_a_sweep_writes(monkeypatch, tmp_path):
    """A sweep a session's end cuts off must leave docs that match the result files it wrote (stop
    85's CI failed on tables older than the files): the tables are regenerated after each benchmark,
    not only once the whole sweep is over. The benchmarks here are stand-ins that write nothing; the
    order of the calls is what is checked."""
    events: list[str] = []

    def fake_run(bench, quick, logs):
        events.append(f"ran {bench.name}")
        return {"name": bench.name, "status": "ok", "reason": "", "minutes": 0.0, "commit": "head",
                "log": "", "bounds": [], "compared": None}

    plan = [Bench(n, ((f"bench/{n}.py",),), ((f"bench/{n}.py",),), (), 1, 1) for n in ("a", "b")]
    monkeypatch.setattr(sweep, "BENCHES", plan)
    monkeypatch.setattr(sweep, "RESULTS", tmp_path)
    monkeypatch.setattr(sweep, "DONE", tmp_path / "sweep_done.jsonl")
    monkeypatch.setattr(sweep, "ROOT", tmp_path)
    monkeypatch.setattr(sweep, "run_bench", fake_run)
    monkeypatch.setattr(sweep, "write_docs_tables", lambda: events.append("docs") or [])
    assert sweep.main(["--only", "a", "b"]) == 0
    assert events[:4] == ["ran a", "docs", "ran b", "docs"]

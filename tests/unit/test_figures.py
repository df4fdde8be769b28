"""The benchmark figures in README.md, docs/benchmarks/index.md and each benchmark page's head are
the result files' own.

bench/figures.py generates them from bench/results/*.json; these tests fail when a block no
longer matches the files (someone re-ran a benchmark, or edited the text by hand), and show that
a changed figure in a result file does change the row it feeds.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import figures

ROOT = Path(__file__).resolve().parents[2]


def test_readme_and_docs_blocks_match_the_result_files():
    stale = figures.stale()
    assert not stale, f"stale benchmark figures in {', '.join(stale)}: run python bench/figures.py"


def _results_with(tmp_path: Path, name: str, **changed: float) -> tuple[Path, dict]:
    """A copy of bench/results with figures of `name` changed and its date moved to 2031-01-02."""
    results = tmp_path / "results"
    shutil.copytree(figures.RESULTS, results)
    path = results / f"{name}.json"
    data = json.loads(path.read_text())
    data["figures"].update(changed)
    data["date"] = "2031-01-02T00:00:00+0000"
    path.write_text(json.dumps(data))
    return results, data


def test_a_changed_figure_changes_its_row(tmp_path: Path):
    results, data = _results_with(tmp_path, "quickstart", reward_gain=0.123)

    def row(block: str) -> str:
        return next(line for line in block.splitlines() if line.startswith("| [quickstart]"))

    before, after = row(figures.readme_block()), row(figures.readme_block(results))
    assert before != after
    assert "reward +0.123" in after and after.endswith(f"(measured 2031-01-02) | {figures.missed(data)} |")
    assert "reward +0.123" in row(figures.index_block(results))
    assert "reward +0.123" in figures.page_block(figures.ENTRIES["quickstart"], results)
    # the README, the index and the quickstart's own page now read as stale, and getting-started,
    # whose quoted run summary names the date; no other page
    assert figures.stale(ROOT, results) == ["README.md", "docs/benchmarks/index.md", "docs/benchmarks/quickstart.md",
                                            "docs/getting-started.md"]


def test_the_host_names_the_vector_isa_where_the_file_records_it(tmp_path: Path):
    """Hosts that all read 'AMD EPYC' ran the calculator up to 3.5x apart: a file that records
    torch's CPU capability shows it beside the CPU, in the index and on its page."""
    results, data = _results_with(tmp_path, "quickstart")
    data["machine"] = {**data["machine"], "cpu_model": "AMD EPYC", "cpu_capability": "AVX2"}
    data["machine"].pop("gpu", None)
    (results / "quickstart.json").write_text(json.dumps(data))
    assert "2031-01-02, AMD EPYC (AVX2))" in figures.page_block(figures.ENTRIES["quickstart"], results)
    assert "| 2031-01-02 | AMD EPYC (AVX2) |" in figures.index_block(results)
    del data["machine"]["cpu_capability"]  # files measured before it was recorded read as before
    (results / "quickstart.json").write_text(json.dumps(data))
    assert "2031-01-02, AMD EPYC)" in figures.page_block(figures.ENTRIES["quickstart"], results)


def test_every_bound_a_result_file_states_is_judged():
    """A new `*_bound` key needs its side in figures.BOUNDS, or the docs would not say met or fails."""
    for entry in figures.ENTRIES.values():
        data = json.loads((figures.RESULTS / f"{entry.result}.json").read_text())
        figs = data["figures"]
        named = [k[: -len("_bound")] for k, v in figs.items() if k.endswith("_bound") and type(v) in (int, float)]
        named += list(figs.get("bounds") or {})  # real_model.json writes its bounds as '>= 0.25'
        judged = figures.bounds(data)
        missing = [k for k in named if k not in judged and not any(f.startswith(k) for f in judged)]
        assert not missing, f"{entry.result}.json: bounds without a side in figures.BOUNDS: {missing}"


def test_a_missed_bound_shows_in_its_readme_row(tmp_path: Path):
    """A figure that misses its stated bound is named in the README row, met ones are not."""
    results, _ = _results_with(tmp_path, "lora", lora_reward_gain=0.1, lora_reward_gain_bound=0.2,
                               lora_wall_minutes=9.0, lora_wall_minutes_bound=15.0)
    row = next(line for line in figures.readme_block(results).splitlines() if line.startswith("| [LoRA]"))
    column = row.rsplit("|", 2)[1]
    assert "`lora_reward_gain` 0.1 (bound ≥ 0.2)" in column and "lora_wall_minutes" not in column


def test_the_long_tail_bounds_are_judged_once_the_file_states_them():
    """longtail.json states its bounds from now on in a `bounds` dict (bench/longtail.py BOUNDS, as
    quickstart, sim, chaos, real_model and specdec do): its summary then says met or fails, and a
    missed one shows in the README's column, with no entry in figures.BOUNDS."""
    data = json.loads((figures.RESULTS / "longtail.json").read_text())
    data["figures"].update(makespan_vs_oracle=1.17, tail_time_vs_fifo=0.2,
                           bounds={"tail_time_vs_fifo": "<= 0.25", "makespan_vs_oracle": "<= 1.10"})
    assert figures.longtail(data).endswith("the oracle's (fails ≤ 1.10)")
    assert "`makespan_vs_oracle` 1.17 (bound ≤ 1.10)" in figures.missed(data)
    assert "tail_time_vs_fifo" not in figures.missed(data)
    data["figures"]["makespan_vs_oracle"] = 1.05
    assert figures.longtail(data).endswith("(met ≤ 1.10)") and figures.missed(data) == "none"


def test_the_specdec_row_says_whether_the_trained_goal_is_reached():
    """specdec.json states a goal beside its bound (grouped drafts on the trained real model); the
    row says reached or not, from the file's own `goals`."""
    data = json.loads((figures.RESULTS / "specdec.json").read_text())
    data["figures"].update(real_model_trained_grouped_tokens_per_s_vs_nospec=0.948,
                           goals={"real_model_trained_grouped_tokens_per_s_vs_nospec": ">= 1.5"})
    assert figures.specdec(data).endswith("0.95× trained (goal ≥ 1.5: not reached)")
    data["figures"]["real_model_trained_grouped_tokens_per_s_vs_nospec"] = 1.6
    assert figures.specdec(data).endswith("1.60× trained (goal ≥ 1.5: reached)")


def test_readme_block_names_no_commit():
    block = figures.readme_block()
    assert not re.findall(r"\b[0-9a-f]{7,40}\b", block)


def test_a_figure_quoted_in_prose_follows_its_file(tmp_path: Path):
    """The README's and the how-to's real-model sentence is generated too: a re-run changes it."""
    results, _ = _results_with(tmp_path, "real_model", real_model_wall_minutes=31.5)
    assert "docs/how-to/real-models.md" in figures.prose_files()
    assert {"README.md", "docs/how-to/real-models.md"} <= set(figures.stale(ROOT, results))
    quoted = figures.with_inline((ROOT / "README.md").read_text(), "README.md", results)
    assert "slowest run 31.5 min (bound 20: fails)" in quoted
    assert "(measured 2031-01-02, " in quoted
    with pytest.raises(ValueError, match="figure:nonesuch"):
        figures.with_inline("<!-- figure:nonesuch --><!-- /figure -->", "x.md")


def test_a_quoted_run_summary_follows_its_file(tmp_path: Path):
    """The quickstart's printed summary in the README and getting-started is the result file's
    first run, as flashq prints it: a re-run changes it; a file without runs is named."""
    results, data = _results_with(tmp_path, "quickstart")
    data["results"]["summaries"][0]["reward_final"] = 0.987
    (results / "quickstart.json").write_text(json.dumps(data))
    assert {"README.md", "docs/getting-started.md"} <= set(figures.prose_files())
    for name in ("README.md", "docs/getting-started.md"):
        quoted = figures.with_inline((ROOT / name).read_text(), name, results)
        assert "-> 0.987 (last 360 steps)" in quoted
        assert f"That is seed {data['results']['runs'][0]['seed']} of `python bench/quickstart.py`" in quoted
        assert "(measured 2031-01-02)." in quoted
    del data["results"]["summaries"]
    (results / "quickstart.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="quickstart.json: no results.summaries"):
        figures.with_inline("<!-- run-summary:quickstart --><!-- /run-summary -->", "x.md", results)

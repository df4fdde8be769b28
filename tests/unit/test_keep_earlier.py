"""bench/common.py keep_earlier: a rerun archives the figures it replaces with where they ran; write_result
does it for every benchmark that does not archive them itself."""
import json

import bench.common as common


def test_a_rerun_archives_the_old_figures_with_their_commit_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    older = {"gain": 0.2, "git_commit": "c0", "date": "d0", "command": "x", "cpu_model": "Xeon"}
    (tmp_path / "q.json").write_text(json.dumps({
        "git_commit": "c1", "date": "d1", "command": "python bench/q.py", "machine": {"cpu_model": "AMD EPYC"},
        "figures": {"gain": 0.3, "earlier": [older]}}))
    figures = common.keep_earlier("q", {"gain": 0.4})
    assert figures["gain"] == 0.4
    assert figures["earlier"] == [older, {"gain": 0.3, "git_commit": "c1", "date": "d1", "command": "python bench/q.py",
                                          "cpu_model": "AMD EPYC"}]


def test_write_result_archives_what_it_replaces_for_every_benchmark(tmp_path, monkeypatch):
    """Benchmarks pass their figures as they are; write_result keeps the history of each."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    common.write_result("p", [], {"gap": 0.005})
    common.write_result("p", [], {"gap": 0.021})
    figures = json.loads((tmp_path / "p.json").read_text())["figures"]
    assert figures["gap"] == 0.021 and [e["gap"] for e in figures["earlier"]] == [0.005]
    common.write_result("p", [], common.keep_earlier("p", {"gap": 0.03}))  # archived by the benchmark: once, not twice
    assert [e["gap"] for e in json.loads((tmp_path / "p.json").read_text())["figures"]["earlier"]] == [0.005, 0.021]

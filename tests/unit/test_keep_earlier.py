"""bench/common.py keep_earlier: a rerun archives the figures it replaces with where they ran."""
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

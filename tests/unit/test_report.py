"""What a run's report says: the summary figures and the plot (flashq.reporting.report)."""

import json

from flashq.reporting.report import summarize, summary_text, write_report


def _step(step: int, mean_tokens: float, truncated: float) -> dict:
    return {"kind": "step", "time": float(step), "step": step, "reward/mean": 0.1 * (step > 10), "time/elapsed_s": 10.0 * step,
            "staleness/max": 1, "staleness/mean": 0.5, "staleness/violations": 0, "trainer/weight_sync_s": 0.1,
            "hist/staleness/0": 10, "hist/staleness/1": 5, "response/mean_tokens": mean_tokens, "response/truncated_frac": truncated}


def test_the_report_shows_responses_running_to_the_token_limit(tmp_path):
    """A policy that learned to keep writing until max_tokens (the real-model example, reward-hacking
    its answer tags) must show in the summary and the plot, not only in the samples."""
    rows = [_step(s, 20.0, 0.1) for s in range(1, 11)] + [_step(s, 48.0, 1.0) for s in range(11, 21)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(tmp_path)
    assert s["response_tokens_first_steps"] == 20.0 and s["response_tokens_final"] == 48.0
    assert s["truncated_share_final"] == 1.0
    assert "responses 20.0 -> 48.0 tokens (mean), 100% cut at max_tokens at the end" in summary_text(s)
    png, _ = write_report(tmp_path)
    assert png.stat().st_size > 0 and json.loads((tmp_path / "summary.json").read_text())["truncated_share_final"] == 1.0

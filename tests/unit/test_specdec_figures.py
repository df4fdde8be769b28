"""bench/specdec.py's figures for the real model's bound: grouped against none engine pair by
engine pair (the k-th engine of each ran back to back), with the pairs' standard error, beside
the ratio of the means the bound is judged on. Rows are made up here: the figures' arithmetic."""

import pytest

from bench.specdec import average, calculator_figures, paired_ratios, real_figures


def _engine(mode: str, e1: float, e2: float) -> dict:
    return {"workload": "real", "model": "start", "mode": mode, "draft": None if mode == "none" else 16,
            "max_num_seqs": 16, "epoch1_tokens_per_s": e1, "epoch2_tokens_per_s": e2, "epoch2_mean_acceptance_length": 1.4}


def test_the_bound_s_modes_are_compared_pair_by_pair():
    # the host drifts: each pair ran at its own speed, grouped 0.96x of none within every pair
    none = [_engine("none", e, e) for e in (100.0, 130.0, 110.0, 125.0)]
    grouped = [_engine("grouped", 0.96 * e, 0.96 * e) for e in (100.0, 130.0, 110.0, 125.0)]
    rows = [average(none), average(grouped)]
    ratios, se = paired_ratios(rows, "epoch2")
    assert ratios == pytest.approx([0.96] * 4) and se == pytest.approx(0.0, abs=1e-12)
    figures = real_figures(rows, ["none", "grouped"])
    assert figures["real_model_grouped_tokens_per_s_vs_nospec"] == pytest.approx(0.96)
    assert figures["real_model_epoch1_grouped_vs_nospec_pairs"] == pytest.approx([0.96] * 4)
    assert figures["real_model_epoch2_grouped_vs_nospec_pairs_standard_error"] == pytest.approx(0.0, abs=1e-12)


def test_pairs_that_disagree_show_their_spread():
    rows = [average([_engine("none", 100.0, 100.0), _engine("none", 100.0, 100.0)]),
            average([_engine("grouped", 90.0, 100.0), _engine("grouped", 100.0, 100.0)])]
    ratios, se = paired_ratios(rows, "epoch1")
    assert ratios == pytest.approx([0.9, 1.0]) and se == pytest.approx(0.05)
    assert paired_ratios([average([_engine("none", 1.0, 1.0)]), average([_engine("grouped", 1.0, 1.0)])], "epoch1")[1] is None


def test_a_grouped_drafter_that_backed_off_entirely_is_named_not_a_crash():
    """At ff25a2b's sweep the adaptive grouped drafter proposed nothing in a full batch's epoch 2
    (no acceptance length), and min() over the sizes raised on the None; an engine without drafts
    beside one with them averaged to the first engine's value alone."""
    def engine(mode: str, size: int, accepted: float | None) -> dict:
        return {**_engine(mode, 100.0, 100.0), "workload": "calculator", "model": "sft", "max_num_seqs": size,
                "epoch2_mean_acceptance_length": accepted}
    assert average([engine("grouped", 16, None), engine("grouped", 16, 3.0)])["epoch2_mean_acceptance_length"] == 3.0
    assert average([engine("grouped", 16, None), engine("grouped", 16, None)])["epoch2_mean_acceptance_length"] is None
    rows = [average([engine(m, size, None if m == "none" or size == 256 else 17.7)]) for size in (16, 256)
            for m in ("none", "grouped")]
    figures = calculator_figures(rows, ["none", "grouped"], [16, 256])
    assert figures["grouped_mean_acceptance_length"] == 17.7 and figures["grouped_sizes_without_drafts"] == [256]
    assert figures["grouped_tokens_per_s_vs_nospec_at_256"] == 1.0

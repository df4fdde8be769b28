import math

import pytest

from flashq.trainer.lr_schedule import lr_factor


def test_constant_holds_the_peak_after_a_linear_warm_up():
    assert [lr_factor(s, 10, "constant", warmup=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, 10) == 1.0


def test_cosine_and_linear_decay_from_the_peak_to_the_floor():
    # warm-up 2 of 10 steps: the decay runs over steps 2..10, p = (step - 2) / 8
    assert lr_factor(2, 10, "cosine", warmup=2) == 1.0
    assert lr_factor(6, 10, "cosine", warmup=2) == pytest.approx(0.5)  # p = 1/2: (1 + cos(pi/2)) / 2
    assert lr_factor(4, 10, "cosine", warmup=2) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert lr_factor(10, 10, "cosine", warmup=2) == pytest.approx(0.0)
    assert lr_factor(6, 10, "linear", warmup=2) == pytest.approx(0.5)
    assert lr_factor(8, 10, "linear", warmup=2) == pytest.approx(0.25)
    # a floor of 0.1: the decay ends at 0.1 and covers the 0.9 above it
    assert lr_factor(6, 10, "cosine", warmup=2, min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(10, 10, "linear", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(50, 10, "linear", min_ratio=0.1) == pytest.approx(0.1)  # past the end: the floor


def test_an_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="'step'"):
        lr_factor(3, 10, "step")

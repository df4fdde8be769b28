"""Overlong responses: DAPO's soft penalty and overlong filtering, by hand and in a real step."""

import numpy as np
import pytest

from flashq.algos.overlong import filtered_loss_mask, soft_overlong_penalty
from flashq.config import ConfigError, load_config
from flashq.trainer.learner import Learner
from tests.unit.test_learner import make_batch


def test_soft_penalty_by_hand():
    # L = 16, margin 4: free up to 12 tokens, then (12 - |y|) / 4 down to -1 at 16
    assert soft_overlong_penalty(np.array([5, 12, 14, 16, 17]), 16, 4).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]


def test_filtering_zeroes_exactly_the_truncated_sequences():
    offsets = np.array([0, 3, 5, 9])
    assert filtered_loss_mask(np.zeros(0, np.uint8), offsets, np.array([False, True, False])).tolist() == [1, 1, 1, 0, 0, 1, 1, 1, 1]
    env = np.array([1, 0, 1, 1, 1, 0, 1, 1, 0], np.uint8)  # an episode's own mask is kept elsewhere
    assert filtered_loss_mask(env, offsets, np.array([True, False, False])).tolist() == [0, 0, 0, 1, 1, 0, 1, 1, 0]


def test_the_penalty_turns_equal_rewards_into_a_length_signal(tiny_model):
    """Rewards all 1 carry no advantage; with the penalty, longer responses (3..6 tokens, limit 6,
    margin 4) score lower and the step has a gradient."""
    plain = Learner(load_config(None), tiny_model)
    assert plain.train_step(make_batch(plain, [1, 1, 1, 1]))["grad_norm"] == 0
    shaped = Learner(load_config(None, ["sampling.max_tokens=6", "trainer.loss.overlong=penalty", "trainer.loss.overlong_margin=4"]), tiny_model)
    m = shaped.train_step(make_batch(shaped, [1, 1, 1, 1]))
    assert m["grad_norm"] > 0 and m["reward/mean"] == 1.0 and m["reward/shaped_mean"] == pytest.approx(1 - 2.5 / 4)


def test_filtering_leaves_truncated_responses_out_of_the_loss(tiny_model):
    learner = Learner(load_config(None, ["trainer.loss.overlong=filter"]), tiny_model)
    batch = make_batch(learner, [1, 0, 0, 1])
    batch.finish_reasons = ["stop", "length", "stop", "length"]
    m = learner.train_step(batch)
    assert m["train/tokens"] == 3 + 5 and m["response/truncated_frac"] == 0.5  # responses of 3, 4, 5, 6 tokens
    assert m["response/mean_tokens"] == 4.5 and m["response/max_tokens"] == 6  # the responses' lengths, not the loss's


def test_a_penalty_without_a_margin_is_refused():
    with pytest.raises(ConfigError, match="overlong penalty needs 0 < overlong_margin < sampling.max_tokens"):
        load_config(None, ["trainer.loss.overlong=penalty"])

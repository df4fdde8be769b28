"""The adaptive draft length: the probability a draft token needs grows with the batch, and the
step-cost model it rests on is fitted from observed steps."""

import pytest

from flashq.drafting.budget import DraftBudget


def test_drafts_need_more_certainty_as_the_batch_grows():
    budget = DraftBudget(fixed_s=2e-3, per_token_s=5e-5, floor=0.05)
    probs = [budget.min_prob(b) for b in (1, 16, 64, 256, 4096)]
    assert probs == sorted(probs) and probs[0] == 0.05  # the floor in the tail
    assert probs[2] == pytest.approx(1 / (1 + 2e-3 / (64 * 5e-5)))
    assert probs[-1] > 0.9  # a huge batch: only near-certain drafts


def test_the_step_model_is_fitted_from_observed_steps():
    budget = DraftBudget(fixed_s=1e-3, per_token_s=1e-5, half_life_steps=50)
    for i in range(400):  # the real engine: 9 ms a step plus 60 us a verified position
        tokens = 16 + (i * 37) % 240
        budget.observe(tokens, 9e-3 + 6e-5 * tokens)
    fixed, per_token = budget.fit()
    assert fixed == pytest.approx(9e-3, rel=0.05) and per_token == pytest.approx(6e-5, rel=0.05)


def test_pauses_are_not_steps():
    budget = DraftBudget(fixed_s=1e-3, per_token_s=1e-5)
    before = budget.fit()
    budget.observe(32, 5.0)  # a weight update held the engine for seconds
    assert budget.fit() == before

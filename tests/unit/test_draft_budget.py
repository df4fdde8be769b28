"""The adaptive draft length: the probability a draft token needs grows with the batch, the
step-cost model it rests on is fitted from observed steps, and the drafter's estimates are
checked against what verification accepted."""

import pytest

from flashq.drafting.budget import AcceptanceRates, DraftBudget


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
    budget.observe(32, 5.0)  # a weight update held the engine for seconds, before the level is known
    for i in range(50):
        budget.observe(16 + i % 8, 2e-3 + 1e-5 * (16 + i % 8))
    before = budget.fit()
    budget.observe(32, 5.0)  # and once it is
    assert budget.fit() == before and budget.step_s(32) < 4e-3


def _cpu_engine_steps(n: int, pause_every: int = 0):
    """(positions, seconds) of a CPU engine at 16 requests with short drafts: 90 ms a step plus
    2.8 ms a verified position, +-15% of noise, and a weight update of 10 s every `pause_every` steps."""
    for i in range(n):
        tokens = 16 + (i * 5) % 9
        noise = 1 + 0.15 * (((i * 7919) % 201) / 100 - 1)
        yield tokens, 10.0 if pause_every and i % pause_every == 3 else (0.09 + 2.8e-3 * tokens) * noise


def test_a_prior_sixty_times_too_fast_is_fitted_away():
    """The default prior is a fast engine's (1.5 ms a step); SmolLM2's steps on a CPU take ~130 ms.
    Every step was once more than 20x the prior's prediction and dropped as a pause, so the fit
    never left the prior; the level now follows the steps, and pauses are still told apart."""
    budget = DraftBudget()
    for tokens, seconds in _cpu_engine_steps(600, pause_every=50):
        budget.observe(tokens, seconds)
    assert budget.step_s(20) == pytest.approx(0.09 + 2.8e-3 * 20, rel=0.1)
    assert budget.needed(16) == pytest.approx(1 / (1 + 0.09 / (16 * 2.8e-3)), abs=0.05)


def test_a_narrow_spread_of_positions_keeps_the_prior_s_shape():
    """Steps of nearly one size say little about the slope: a steep local trend (what a batch of
    16 requests with drafts of 0-8 tokens showed on a CPU, 12 ms + 8 ms a position when fitted
    alone) would have a draft token need 0.91 acceptance. The fit keeps the prior's ratio at the
    data's level until positions spread."""
    budget = DraftBudget(fixed_s=1.5e-3, per_token_s=4e-5)
    for i in range(600):
        tokens = 16 + (i * 5) % 9
        budget.observe(tokens, 0.012 + 8e-3 * tokens)
    fixed, per_token = budget.fit()
    assert fixed / per_token > 20  # the prior's 37.5 positions, not the local trend's 1.5
    assert budget.step_s(20) == pytest.approx(0.012 + 8e-3 * 20, rel=0.1)
    assert budget.needed(16) < 0.4


def test_drafts_that_are_not_accepted_stop_and_are_probed_again_later():
    """A real model at T = 1: siblings' continuations look certain to the drafter but 3% of drafted
    tokens were accepted. Drafting stops; as the record fades it resumes for a probe."""
    record = AcceptanceRates(prior_tokens=8, half_life_steps=100)
    budget = DraftBudget(fixed_s=2e-3, per_token_s=5e-5, floor=0.1, acceptance=record)
    assert budget.min_prob(16) == pytest.approx(budget.needed(16))  # nothing on record: the estimates are trusted
    for step in range(40):
        for k in range(16):
            record.observe([0.95, 0.85, 0.7, 0.5], accepted=1 if (step * 16 + k) % 33 == 0 else 0)
        record.step()
    assert budget.min_prob(16) > 1  # no estimate is accepted often enough to pay: draft nothing
    steps_off = 0
    while budget.min_prob(16) > 1:
        record.step()
        steps_off += 1
    assert 100 < steps_off < 2000 and 0.9 < budget.min_prob(16) <= 1  # a probe, of the surest tokens only


def test_estimates_are_held_to_their_record_class_by_class():
    record = AcceptanceRates(prior_tokens=8)
    for _ in range(50):
        record.observe([0.95, 0.85, 0.5, 0.3], accepted=3)  # the 0.9-1, 0.8-0.9 and 0.4-0.6 tokens accepted, 0.2-0.4 not
    assert record.threshold(0.6) == pytest.approx(0.4)  # 0.4-0.6 accepted well above its estimate: drafted
    assert record.threshold(0.2) == pytest.approx(0.4)  # 0.2-0.4 never accepted: not drafted even when little is needed
    assert AcceptanceRates().threshold(0.3) == pytest.approx(0.3)  # nothing on record: the estimate decides
    record = AcceptanceRates(prior_tokens=8)
    for _ in range(50):
        record.observe([0.95, 0.85], accepted=0)  # the surest class fails: nothing below it is drafted either
    assert record.threshold(0.2) == float("inf")


def test_without_a_record_the_estimates_decide():
    budget = DraftBudget(fixed_s=2e-3, per_token_s=5e-5, floor=0.1)
    assert budget.min_prob(64) == pytest.approx(1 / (1 + 2e-3 / (64 * 5e-5)))

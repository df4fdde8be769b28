"""How far to speculate, from the batch size and the engine's measured step cost (Seer's
marginal-benefit rule, in closed form).

A decode step costs about `T(tokens) = fixed + per_token * tokens`, where `tokens` counts every
position the step verifies (one per request, plus its draft tokens). Without drafts each request
gets one token per step, at a cost per token of `fixed / batch + per_token`. One more draft
token costs `per_token` and yields a token with the probability `p` that the whole draft up to
it is accepted. It pays when `p / per_token >= 1 / (fixed / batch + per_token)`, i.e. when

    p >= 1 / (1 + fixed / (batch * per_token)).

In a small batch (the long tail) the fixed cost dominates and drafts pay even when unlikely;
in a large batch only near-certain drafts pay, and speculation turns itself off. `fixed` and
`per_token` are fitted online (least squares with exponential forgetting) from the time between
steps and the positions each step verified, so the rule follows the real engine: a GPU whose
decode step is bound by weight reads has a small `per_token` and speculates further than a CPU.

`p` is the drafter's estimate: the share of earlier matches that went on that way. Where
responses diverge (a real model sampling at T = 1) that share overstates what verification
accepts: on SmolLM2-135M-Instruct 3% of drafted tokens were accepted, and drafting ran at 0.40x
of none (bench/specdec.py). So each estimate is first checked against the record
(`AcceptanceRates`): a token is drafted only if tokens with its estimate have been accepted often
enough to pay. When none are, drafting stops, and resumes for a probe once the record has faded.
"""

from __future__ import annotations

import numpy as np


class AcceptanceRates:
    """How often verification accepted draft tokens, by the probability the drafter gave them.

    Estimates fall into classes (`EDGES`); each class counts the tokens drafted in it and those
    accepted, forgotten with a half-life in engine steps and seeded with `prior_tokens` accepted
    at the class's own midpoint (a class never tried is trusted as estimated). `threshold` turns
    the record into the least estimate worth drafting: with nothing on record, the cost rule's."""

    EDGES = np.array([0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0])

    def __init__(self, prior_tokens: float = 8.0, half_life_steps: float = 100.0):
        self.prior_tokens = prior_tokens
        self.midpoints = (self.EDGES[:-1] + self.EDGES[1:]) / 2
        self.decay = 0.5 ** (1.0 / half_life_steps)
        self.drafted = np.zeros(len(self.midpoints))
        self.accepted = np.zeros(len(self.midpoints))

    def _classes(self, probs) -> np.ndarray:
        return np.clip(np.searchsorted(self.EDGES, probs, side="right") - 1, 0, len(self.midpoints) - 1)

    def observe(self, probs, accepted: int) -> None:
        """One verified draft: its tokens' estimates, of which the first `accepted` were accepted."""
        probs = np.asarray(probs, dtype=np.float64)
        classes = self._classes(probs)
        np.add.at(self.drafted, classes, 1.0)
        np.add.at(self.accepted, classes[:accepted], 1.0)

    def step(self) -> None:
        """An engine step passed: the record fades (so a class that stopped paying is probed again)."""
        self.drafted *= self.decay
        self.accepted *= self.decay

    def rates(self) -> np.ndarray:
        """Each class's share of tokens accepted, the prior included."""
        return (self.accepted + self.prior_tokens * self.midpoints) / (self.drafted + self.prior_tokens)

    def threshold(self, needed: float) -> float:
        """The least estimate to draft when a token must be accepted `needed` of the time to pay.
        A token's chance is its estimate scaled by its class's record (accepted rate over
        midpoint); estimates are path probabilities, falling along a draft, so the walk goes down
        from the surest class and stops at the first that does not pay in full. Above 1: draft
        nothing (the surest class does not pay)."""
        scale = self.rates() / self.midpoints
        least = float("inf")
        for c in reversed(range(len(scale))):
            lowest = max(float(self.EDGES[c]), needed / scale[c])
            if lowest > self.EDGES[c + 1]:
                break
            least = lowest
            if lowest > self.EDGES[c]:
                break
        return least


class DraftBudget:
    def __init__(self, fixed_s: float = 1.5e-3, per_token_s: float = 4e-5, floor: float = 0.1,
                 half_life_steps: float = 200.0, prior_steps: float = 20.0, acceptance: AcceptanceRates | None = None):
        """`acceptance`: check the drafter's estimates against what was accepted (None: take them as they are)."""
        self.acceptance = acceptance
        self.prior = (fixed_s, per_token_s)
        self.floor = floor
        self.decay = 0.5 ** (1.0 / half_life_steps)
        # weighted sums for the fit y = a + b x, seeded with `prior_steps` steps of the prior at two batch sizes
        self.sw = self.sx = self.sy = self.sxx = self.sxy = 0.0
        for x in (1.0, 256.0):
            self._add(x, fixed_s + per_token_s * x, prior_steps / 2)

    def _add(self, x: float, y: float, w: float = 1.0) -> None:
        self.sw += w
        self.sx += w * x
        self.sy += w * y
        self.sxx += w * x * x
        self.sxy += w * x * y

    def observe(self, tokens: int, seconds: float) -> None:
        """One engine step that verified `tokens` positions in `seconds`. Pauses (weight updates,
        an empty engine) are not steps: anything slower than 20x the fit's prediction is ignored."""
        if tokens <= 0 or seconds <= 0 or seconds > 20 * self.step_s(tokens):
            return
        for name in ("sw", "sx", "sy", "sxx", "sxy"):
            setattr(self, name, getattr(self, name) * self.decay)
        self._add(float(tokens), seconds)

    def fit(self) -> tuple[float, float]:
        """(fixed seconds per step, seconds per verified position); the prior if the fit is degenerate."""
        var = self.sw * self.sxx - self.sx * self.sx
        if var <= 0:
            return self.prior
        per_token = (self.sw * self.sxy - self.sx * self.sy) / var
        fixed = (self.sy - per_token * self.sx) / self.sw
        if per_token <= 0 or fixed <= 0:
            return self.prior
        return fixed, per_token

    def step_s(self, tokens: int) -> float:
        fixed, per_token = self.fit()
        return fixed + per_token * tokens

    def needed(self, batch: int) -> float:
        """The least probability of acceptance a draft token needs to pay for itself."""
        fixed, per_token = self.fit()
        return max(self.floor, 1.0 / (1.0 + fixed / (max(batch, 1) * per_token)))

    def min_prob(self, batch: int) -> float:
        """The least drafter's estimate to draft at this batch size (above 1: draft nothing)."""
        needed = self.needed(batch)
        if self.acceptance is None:
            return needed
        return max(self.floor, self.acceptance.threshold(needed))

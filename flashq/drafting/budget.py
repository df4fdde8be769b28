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
    """The step-cost model `fixed + per_token * tokens`, fitted online, and the rule above.

    The prior's shape (its ratio of fixed cost to per-position cost) is kept until the data's
    spread of positions supports a slope of their own: leaving it is penalised as much as
    `prior_steps` steps spread over `SPREAD` positions would weigh, at whatever level the data
    show. An engine near one batch size (every step verifying about as many positions, where a
    local trend can be anything) keeps the prior's shape at its own level; one whose batch sweeps a
    range of sizes fits both terms. The level follows the data however far off the prior is (a
    CPU engine's step can be 60x the default's), so a slow step is taken for a pause (a weight
    update, an empty engine) only against what steps have measured."""

    WARMUP_STEPS = 8  # steps whose median sets the level before the first pause can be told apart
    SPREAD = 16.0  # positions: data spread less than this keep the prior's shape

    def __init__(self, fixed_s: float = 1.5e-3, per_token_s: float = 4e-5, floor: float = 0.1,
                 half_life_steps: float = 200.0, prior_steps: float = 20.0, acceptance: AcceptanceRates | None = None):
        """`acceptance`: check the drafter's estimates against what was accepted (None: take them as they are)."""
        self.acceptance = acceptance
        self.prior = (fixed_s, per_token_s)
        self.prior_steps = prior_steps
        self.floor = floor
        self.decay = 0.5 ** (1.0 / half_life_steps)
        self.warmup: list[tuple[float, float]] = []  # (positions, seconds) of the first steps, until the level is known
        self.sw = self.sx = self.sy = self.sxx = self.sxy = 0.0  # the observed steps' forgetting sums

    def _prior_s(self, tokens: float) -> float:
        return self.prior[0] + self.prior[1] * tokens

    def _add(self, x: float, y: float) -> None:
        for name in ("sw", "sx", "sy", "sxx", "sxy"):
            setattr(self, name, getattr(self, name) * self.decay)
        self.sw += 1.0
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y

    def observe(self, tokens: int, seconds: float) -> None:
        """One engine step that verified `tokens` positions in `seconds`. Pauses are not steps:
        anything slower than 20x what the fit predicts is ignored (during the first steps, 20x
        their median against the prior's shape)."""
        if tokens <= 0 or seconds <= 0:
            return
        if len(self.warmup) < self.WARMUP_STEPS:
            self.warmup.append((float(tokens), seconds))
            if len(self.warmup) == self.WARMUP_STEPS:
                level = float(np.median([y / self._prior_s(x) for x, y in self.warmup]))
                for x, y in self.warmup:
                    if y <= 20 * level * self._prior_s(x):
                        self._add(x, y)
            return
        if seconds > 20 * self.step_s(tokens):
            return
        self._add(float(tokens), seconds)

    def fit(self) -> tuple[float, float]:
        """(fixed seconds per step, seconds per verified position): least squares over the observed
        steps, plus a penalty on leaving the prior's shape worth `prior_steps` steps spread over
        `SPREAD` positions; the prior before any step is observed."""
        if self.sw == 0:
            return self.prior
        ratio = self.prior[1] / self.prior[0]  # the shape: per_token = ratio * fixed
        lam = self.prior_steps * self.SPREAD ** 2
        # normal equations of sum w (y - a - b x)^2 + lam (b - ratio a)^2
        m00, m01, m11 = self.sw + lam * ratio ** 2, self.sx - lam * ratio, self.sxx + lam
        det = m00 * m11 - m01 * m01
        fixed = (self.sy * m11 - m01 * self.sxy) / det
        per_token = (m00 * self.sxy - m01 * self.sy) / det
        if per_token <= 0 or fixed <= 0:
            level = self.sy / (self.prior[0] * self.sw + self.prior[1] * self.sx)
            return level * self.prior[0], level * self.prior[1]
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

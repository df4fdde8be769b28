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
"""

from __future__ import annotations


class DraftBudget:
    def __init__(self, fixed_s: float = 1.5e-3, per_token_s: float = 4e-5, floor: float = 0.1,
                 half_life_steps: float = 200.0, prior_steps: float = 20.0):
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

    def min_prob(self, batch: int) -> float:
        """The least probability of acceptance a draft token needs to pay for itself."""
        fixed, per_token = self.fit()
        return max(self.floor, 1.0 / (1.0 + fixed / (max(batch, 1) * per_token)))

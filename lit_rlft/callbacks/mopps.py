"""MoPPSCallback: Thompson sampling of Beta posteriors on prompt success rates (MoPPS)."""

from __future__ import annotations

import numpy as np

from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.selection.mopps import MoPPSSelector
from lit_rlft.step.context import StepContext


class MoPPSCallback(SelectionCallback):
    """Train on prompts whose sampled success rate is closest to ``target``, from a Beta posterior per prompt.

    Each prompt's success rate has a ``Beta(alpha, beta)`` posterior, updated from the groups it was rolled out in;
    each step a Thompson sample ``gamma ~ Beta(alpha, beta)`` ranks a candidate set and the ``B`` closest to
    ``target`` are trained on (see ``lit_rlft.selection.mopps``). Logs ``mopps/{effective_ratio,
    posterior_mean_selected, posterior_mean_pool, sampled_rate_selected, observed_prompts}``.

    Example::

        trainer = L.Trainer(callbacks=[MoPPSCallback(candidate_ratio=16)])

    Args:
        candidate_ratio: candidates per step = ``candidate_ratio * B`` (the reference code's ``ts_ratio``: 16 in its
            MATH scripts, 8 in its Countdown scripts);
            ``None``: the whole pool.
        target: the success rate aimed at (0.5).
        prior: ``(alpha_0, beta_0)`` of every prompt's Beta posterior (1, 1: uniform).
        decay: ``lambda``: how much of a posterior survives each update of its prompt (1: all, the reference code's
            config default and MATH scripts; its Countdown scripts use 0.5).
        seed: seed of the Thompson samples, ties and the candidate stream.
    """

    name = "mopps"
    predicts_success = True  # its strategy has spread_probabilities: AllocationCallback allocates from it

    def __init__(self, candidate_ratio: int | None = 16, target: float = 0.5,
                 prior: tuple[float, float] = (1.0, 1.0), decay: float = 1.0, seed: int = 0):
        super().__init__(seed=seed)
        MoPPSSelector(1, 2, prior=prior, decay=decay, target=target, candidate_ratio=candidate_ratio)  # validate now
        self.candidate_ratio, self.target, self.prior, self.decay = candidate_ratio, target, tuple(prior), decay

    def build(self, ctx: StepContext, num_prompts: int) -> MoPPSSelector:
        return MoPPSSelector(num_prompts, ctx.num_generations, prior=self.prior, decay=self.decay, target=self.target,
                             candidate_ratio=self.candidate_ratio, seed=self.seed)

    def metrics(self, ctx: StepContext) -> dict[str, float]:
        s = self.strategy
        out = {"mopps/posterior_mean_pool": float(s.posterior_mean().mean()),
               "mopps/observed_prompts": float((s.num_observed > 0).sum())}
        if self._last_selected is not None:
            out["mopps/posterior_mean_selected"] = float(s.posterior_mean(self._last_selected).mean())
            picked = np.isin(s.last_candidates, self._last_selected)
            out["mopps/sampled_rate_selected"] = float(s.last_gamma[picked].mean())
        return out

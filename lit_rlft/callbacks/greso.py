"""GRESOCallback: skip, before rolling out, prompts whose recent groups kept having no reward variance (GRESO)."""

from __future__ import annotations

from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.selection.greso import GRESOSelector
from lit_rlft.step.context import StepContext


class GRESOCallback(SelectionCallback):
    """Draw prompts in a shuffled order, skipping each with a probability that grows with how many of its latest
    groups in a row were all correct or all wrong (see ``lit_rlft.selection.greso``); the batch is filled by drawing
    more. Logs ``greso/{effective_ratio, p_easy, p_hard, skipped, skipped_easy, skipped_hard, zero_variance_easy,
    zero_variance_hard}``.

    Example::

        trainer = L.Trainer(callbacks=[GRESOCallback(target_zero_variance=0.25)])

    Args:
        target_zero_variance: the share of zero-variance groups per batch that the skip probabilities steer toward.
        hard_fraction: the part of that share given to all-wrong prompts (the rest to all-correct ones).
        initial_p: starting base keep probability for both kinds.
        step_size: how far the base keep probabilities move per step.
        min_keep: every prompt keeps at least this chance to be rolled out.
        seed: seed of the skip draws and the candidate order.
    """

    name = "greso"

    def __init__(self, target_zero_variance: float = 0.25, hard_fraction: float = 2 / 3, initial_p: float = 0.5,
                 step_size: float = 0.01, min_keep: float = 0.01, seed: int = 0):
        super().__init__(seed=seed)
        self.options = dict(target_zero_variance=target_zero_variance, hard_fraction=hard_fraction,
                            initial_p=initial_p, step_size=step_size, min_keep=min_keep)
        GRESOSelector(1, **self.options)  # validate now

    def build(self, ctx: StepContext, num_prompts: int) -> GRESOSelector:
        return GRESOSelector(num_prompts, seed=self.seed, **self.options)

    def metrics(self, ctx: StepContext) -> dict[str, float]:
        s = self.strategy
        easy, hard = s.last_zero_variance
        return {"greso/p_easy": s.p_easy, "greso/p_hard": s.p_hard, "greso/skipped": float(s.last_skipped),
                "greso/skipped_easy": float(s.last_skipped_easy), "greso/skipped_hard": float(s.last_skipped_hard),
                "greso/zero_variance_easy": easy, "greso/zero_variance_hard": hard}

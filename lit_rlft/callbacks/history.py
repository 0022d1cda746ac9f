"""HistoryResamplingCallback: SRPO's history resampling (drop prompts whose last group was all correct)."""

from __future__ import annotations

from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.selection.history import HistoryResampler
from lit_rlft.step.context import StepContext


class HistoryResamplingCallback(SelectionCallback):
    """Per epoch over the pool, skip the prompts whose last group was all correct (SRPO).

    All-wrong and mixed prompts stay; never-seen prompts stay. Logs ``history/active_prompts``.

    Example::

        trainer = L.Trainer(callbacks=[HistoryResamplingCallback()])
    """

    name = "history"

    def build(self, ctx: StepContext, num_prompts: int) -> HistoryResampler:
        return HistoryResampler(num_prompts, seed=self.seed)

    def metrics(self, ctx: StepContext) -> dict[str, float]:
        return {"history/active_prompts": float(self.strategy.num_active)}

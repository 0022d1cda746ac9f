"""The seam through which callbacks reshape a step's rollout batch inside ``training_step``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lightning as L

    from lit_rlft.core.types import Rollouts


class RolloutHook:
    """Mixin for callbacks that change the rollout batch after scoring and before advantages.

    ``GRPOModule.training_step`` calls :meth:`on_rollouts` of every callback that is a ``RolloutHook``, in the
    order of ``trainer.callbacks``. Dynamic sampling refills with more rounds of candidates here; replay mixes in
    stored groups here.
    """

    def on_rollouts(self, trainer: L.Trainer, pl_module: L.LightningModule, rollouts: Rollouts) -> Rollouts:
        return rollouts

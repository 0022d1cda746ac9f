"""The seam through which callbacks reshape a step's rollout batch inside ``training_step``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning as L

    from lit_rlft.core.types import OutcomeRecord, Rollouts


class RolloutHook:
    """Mixin for callbacks that change the rollout batch after scoring and before advantages.

    ``GRPOModule`` calls :meth:`on_rollouts` of every callback that is a ``RolloutHook``, in callback order, with
    this rank's ``rollouts`` and the global ``record`` of outcomes (every rank's groups). A hook returns both,
    reshaped; it must keep them consistent (``record.trained_batch()`` is the global batch of which ``rollouts`` is
    this rank's slice) and give every rank the same number of groups. Dynamic sampling refills with more rounds of
    candidates here; replay mixes in stored groups here. More generation goes through ``pl_module.rollout(ids)``, a
    collective call that every rank makes with the same global ids.
    """

    def on_rollouts(self, trainer: L.Trainer | Any, pl_module: L.LightningModule, rollouts: Rollouts,
                    record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]:
        return rollouts, record

"""DynamicSamplingCallback: DAPO's dynamic sampling, the oracle filter that DPS approximates."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_rlft.callbacks.base import RolloutHook
from lit_rlft.checkpointing import decode_state, encode_state
from lit_rlft.core.types import Rollouts
from lit_rlft.selection.dynamic import DynamicFilter


class DynamicSamplingCallback(RolloutHook, L.Callback):
    """Keep only groups with non-zero reward spread, rolling out more rounds of fresh prompts until ``B`` are kept.

    Every candidate is generated (and charged to the budget: ``budget/completions_dynamic_sampling`` counts the
    extra rounds); groups with equal rewards are discarded. When ``max_rounds`` rounds do not find ``B`` effective
    groups, the step trains on what was kept and warns, instead of crashing; when none was kept it trains on the
    first round (whose zero advantages give no gradient). Logs ``dynamic_sampling/{rounds, kept_groups,
    discarded_groups, rolled_out_groups, filled}``.

    Example::

        trainer = L.Trainer(callbacks=[DynamicSamplingCallback(max_rounds=10)])

    Args:
        max_rounds: rounds per step at most, the first included (DAPO: 10; the DPS paper used 4 on MATH).
    """

    def __init__(self, max_rounds: int = 10):
        self.filter = DynamicFilter(max_rounds=max_rounds)
        self.max_rounds = max_rounds

    def on_rollouts(self, trainer: L.Trainer, pl_module: L.LightningModule, rollouts: Rollouts) -> Rollouts:
        batch_size = rollouts.num_groups
        round_ = self.filter.start(batch_size)
        parts = [rollouts.select_groups(np.flatnonzero(round_.add(rollouts.rewards.numpy())))]
        used = set(rollouts.prompt_ids.tolist())
        plan = trainer.datamodule.plan
        while not round_.done:
            ids = plan.draw_unused(batch_size, used)
            if ids.size == 0:
                break
            used.update(ids.tolist())
            more = pl_module.generate_rollouts(ids, purpose="dynamic_sampling")
            parts.append(more.select_groups(np.flatnonzero(round_.add(more.rewards.numpy()))))
        result = round_.finish()
        kept = Rollouts.concat(parts)
        kept = kept.select_groups(torch.arange(min(batch_size, kept.num_groups)))
        pl_module.log_dict({
            "dynamic_sampling/rounds": float(result.rounds),
            "dynamic_sampling/kept_groups": float(result.num_kept),
            "dynamic_sampling/discarded_groups": float(result.num_discarded),
            "dynamic_sampling/rolled_out_groups": float(result.num_rolled_out),
            "dynamic_sampling/filled": float(result.filled),
        }, on_step=True, on_epoch=False, batch_size=batch_size)
        if not result.filled:
            rank_zero_warn(
                f"DynamicSamplingCallback: {result.num_kept} of {batch_size} effective groups after "
                f"{result.rounds} rounds (max_rounds={self.max_rounds}); training on what was kept"
            )
        return kept if kept.num_groups > 0 else rollouts

    def state_dict(self) -> dict:
        return {"filter": encode_state(self.filter.state_dict())}

    def load_state_dict(self, state_dict: dict) -> None:
        if "filter" in state_dict:
            self.filter.load_state_dict(decode_state(state_dict["filter"]))

"""UniformHandbackCallback: hand the selector's batch back to uniform sampling as the pool is used up.

Composes with any selection callback listed before it (``[DPSCallback(candidate_ratio=8),
UniformHandbackCallback(start_passes=2, end_passes=4)]``): after the selector has scheduled the next batch, a share
of it (:func:`~lit_rlft.selection.handback.handback_share` of the passes made so far) is replaced by the next prompts
of the plan's uniform order. The selector still observes every trained group, the uniformly drawn ones included.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.callbacks.selection import require_after_selector
from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.selection.handback import hand_back, handback_share
from lit_rlft.step.context import StepContext, StepOutput


class UniformHandbackCallback(StepCallback):
    """Replace a growing share of each selected batch with uniform draws as passes over the pool grow.

    Args:
        start_passes: passes over the pool (fresh prompt draws / pool size) before any of the batch is handed back.
        end_passes: passes from which the whole batch is uniform (linear in between).
        seed: chooses which of the selector's prompts give way.

    Logs ``handback/share`` (of the next batch) and ``handback/passes`` after every step.
    """

    name = "handback"

    def __init__(self, start_passes: float = 2.0, end_passes: float = 4.0, seed: int = 0):
        handback_share(0.0, start_passes, end_passes)  # validate now
        self.start_passes, self.end_passes, self.seed = float(start_passes), float(end_passes), seed
        self.rng = np.random.default_rng(seed)
        self.draws = 0  # fresh prompt groups rolled out so far
        self.pool_size = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(start_passes=self.start_passes, end_passes=self.end_passes, seed=self.seed)

    @property
    def passes(self) -> float:
        return self.draws / self.pool_size if self.pool_size else 0.0

    def setup_step(self, ctx: StepContext) -> None:
        require_after_selector(ctx, self, "reshapes the batch the selector planned")
        self.pool_size = len(ctx.data.train_pool)

    def before_first_step(self, ctx: StepContext) -> None:
        self._hand_back(ctx)

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        self.draws += int(output.record.fresh().prompt_ids.numel())
        if not ctx.ends_after_this_step():  # nothing is planned after the last step
            self._hand_back(ctx)
        share = handback_share(self.passes, self.start_passes, self.end_passes)
        ctx.log({f"{self.name}/share": share, f"{self.name}/passes": self.passes})

    def _hand_back(self, ctx: StepContext) -> None:
        """Hand back the share due now of the batch the selector planned."""
        plan = ctx.data.plan
        share = handback_share(self.passes, self.start_passes, self.end_passes)
        if plan.scheduled is not None and share > 0:
            by = plan.scheduled_by or "scheduled"
            plan.schedule(hand_back(plan.scheduled, share, self.rng, plan.draw_unused), by=f"{by}+{self.name}")

    def state_dict(self) -> dict[str, Any]:
        return encode_state({"version": 1, "draws": self.draws, "rng": self.rng.bit_generator.state})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        state = decode_state(state_dict)
        self.draws = int(state["draws"])
        self.rng.bit_generator.state = state["rng"]

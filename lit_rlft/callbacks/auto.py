"""AutoShareCallback: let the run decide how much of each batch its selector picks (``auto`` in the study).

Composes with any selection callback listed before it (``[MoPPSCallback(...), AutoShareCallback()]``): after the
selector has scheduled the next batch, :class:`~lit_rlft.selection.auto.ShareController`'s share of it is kept and the
rest is replaced by the next prompts of the plan's uniform order, the *control slice*. After each step the two
slices' fresh groups are compared (informative share, and the selector's coverage of the pool) and the share moves
towards the slice that taught more per completion. The selector still observes every trained group, the control
slice's included, so its beliefs keep up with prompts it did not pick.

Nothing is rolled out for measurement alone: the control slice is trained on like the rest of the batch, so its
completions are the run's training completions (``budget/completions``); ``auto/control_completions`` counts them.
The decision is made from the step's gathered record and the plan, both the same on every rank, with the
callback's own seeded generator: every rank splits the batch identically.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.selection.auto import ShareController, split_batch
from lit_rlft.step.context import StepContext, StepOutput


class AutoShareCallback(StepCallback):
    """Split each selected batch between the selector and a uniform control slice, by what the run measures.

    Args:
        initial_share: the selected share before any evidence.
        min_selected: the least share the selector keeps (its probe: it can earn its share back).
        min_control: the least share drawn uniformly (the measurement never stops).
        rate: how fast the share moves (logit change per unit of ``log`` of the signal, per step).
        horizon: steps over which the slices' outcomes are discounted (by ``1 - 1 / horizon`` per step).
        seed: chooses which of the selector's prompts are kept.

    Logs after every step ``auto/share`` (of the next batch), ``auto/signal`` (the ratio ``R`` of the selected
    slice's value per completion over the control slice's), ``auto/informative_selected``,
    ``auto/informative_control``, ``auto/coverage`` and ``auto/control_completions`` (cumulative).
    """

    name = "auto"

    def __init__(self, initial_share: float = 0.5, min_selected: float = 0.125, min_control: float = 0.25,
                 rate: float = 0.25, horizon: float = 32.0, seed: int = 0):
        ShareController(1, initial_share, min_selected, min_control, rate, horizon)  # validate now
        self.initial_share, self.min_selected, self.min_control = initial_share, min_selected, min_control
        self.rate, self.horizon, self.seed = rate, horizon, seed
        self.rng = np.random.default_rng(seed)
        self.controller: ShareController | None = None
        self.planned: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # step -> (selected ids, control ids)
        self.control_completions = 0
        self._pending_state: dict[str, Any] | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(initial_share=self.initial_share, min_selected=self.min_selected,
                                        min_control=self.min_control, rate=self.rate, horizon=self.horizon,
                                        seed=self.seed)

    def setup_step(self, ctx: StepContext) -> None:
        if getattr(ctx.data, "plan", None) is None:
            raise RuntimeError("AutoShareCallback needs a PromptDataModule with a training pool")
        callbacks = list(ctx.callbacks)
        mine = next((i for i, cb in enumerate(callbacks) if cb is self), None)
        selectors = [i for i, cb in enumerate(callbacks) if isinstance(cb, SelectionCallback)]
        if mine is not None and (not selectors or max(selectors) > mine):
            raise ValueError("AutoShareCallback must come after a selection callback in the callbacks list (it "
                             "splits the batch the selector planned); got the order "
                             f"{[type(cb).__name__ for cb in callbacks]}")
        if self.controller is None:
            self.controller = ShareController(len(ctx.data.train_pool), self.initial_share, self.min_selected,
                                              self.min_control, self.rate, self.horizon)
        if self._pending_state is not None:
            self._load(self._pending_state)
            self._pending_state = None

    def before_first_step(self, ctx: StepContext) -> None:
        self._split(ctx, ctx.rollout_step + ctx.async_depth)

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        fresh = output.record.fresh()  # every rank's fresh groups
        planned = self.planned.pop(ctx.rollout_step - 1, None)
        metrics: dict[str, float] = {}
        if planned is not None:
            ids = fresh.prompt_ids.numpy()
            rates = fresh.success_rates.numpy().astype(np.float64)
            selected, control = np.isin(ids, planned[0]), np.isin(ids, planned[1])
            signal = self.controller.observe(ids[selected], rates[selected], rates[control])
            sizes = fresh.member_mask().sum(1).numpy()
            self.control_completions += int(sizes[control].sum())
            metrics.update(signal.metrics(self.name))
        else:
            metrics[f"{self.name}/share"] = self.controller.share
        if not ctx.ends_after_this_step():  # nothing is planned after the last step
            self._split(ctx, ctx.rollout_step + ctx.async_depth)
        metrics[f"{self.name}/control_completions"] = float(self.control_completions)
        ctx.log(metrics)

    def _split(self, ctx: StepContext, step: int) -> None:
        """Keep the controller's share of the batch the selector planned for ``step``; draw the rest uniformly."""
        plan = ctx.data.plan
        if plan.scheduled is None:
            return
        kept, control = split_batch(plan.scheduled, self.controller.share, self.rng, plan.draw_unused)
        by = plan.scheduled_by or "scheduled"
        plan.schedule(np.concatenate([kept, control]), by=f"{by}+{self.name}")
        self.planned[step] = (kept, control)

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.controller is None:
            return {}
        planned = {str(step): {"selected": sel, "control": ctrl} for step, (sel, ctrl) in self.planned.items()}
        return encode_state({"version": 1, "controller": self.controller.state_dict(), "planned": planned,
                             "control_completions": self.control_completions, "rng": self.rng.bit_generator.state})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.controller is None:
            self._pending_state = state_dict  # restored in setup_step, once the pool's size is known
        else:
            self._load(state_dict)

    def _load(self, state_dict: dict[str, Any]) -> None:
        state = decode_state(state_dict)
        self.controller.load_state_dict(state["controller"])
        self.planned = {int(step): (np.asarray(p["selected"], dtype=np.int64), np.asarray(p["control"], dtype=np.int64))
                        for step, p in state["planned"].items()}
        self.control_completions = int(state["control_completions"])
        self.rng.bit_generator.state = state["rng"]

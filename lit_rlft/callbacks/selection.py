"""SelectionCallback: the thin Lightning adapter every prompt-selection strategy shares.

At the end of step ``t`` it shows the strategy the outcomes of the step's *fresh* groups (replayed groups say
nothing new about the current policy), then writes the prompts of step ``t+1`` into the datamodule's batch plan.
The outcomes come from the step's gathered record: every group any rank rolled out, including the candidates
dynamic sampling discarded, so the strategy holds the same state on every rank. The strategy is built in
``on_fit_start`` (once the policy exists) and the first batch is chosen in ``on_train_start``. The strategy's state
and the callback's random generator are part of every checkpoint, so a resumed run selects exactly what the
uninterrupted run selects, on any number of ranks.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import numpy as np

from lit_rlft.callbacks.budget import training_ends_after_this_step
from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.selection.base import SelectionStrategy, effective_ratio


class SelectionCallback(L.Callback):
    """Drive a Lightning-free :class:`~lit_rlft.selection.base.SelectionStrategy` from Lightning hooks.

    Subclasses build the strategy in :meth:`build` and may add metrics in :meth:`metrics` or act before each
    selection in :meth:`before_select`.

    Args:
        seed: seed of the callback's random generator (tie breaking, reference draws, ...).
    """

    name = "selection"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.strategy: SelectionStrategy | None = None
        self._pending_state: dict[str, Any] | None = None
        self._last_selected: np.ndarray | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(seed=self.seed)

    # -- to override ------------------------------------------------------------------------------------
    def build(self, trainer: L.Trainer, pl_module: L.LightningModule, num_prompts: int) -> SelectionStrategy:
        raise NotImplementedError

    def before_select(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        """Hook before each selection (DOTS rolls out its reference set here)."""

    def before_observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> dict[str, float]:
        """Hook before :meth:`SelectionStrategy.observe` (DPS scores its predictions here); returns metrics."""
        return {}

    # -- Lightning hooks ----------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        dm = trainer.datamodule
        if dm is None or getattr(dm, "plan", None) is None:
            raise RuntimeError(f"{type(self).__name__} needs a PromptDataModule with a training pool")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.strategy is not None:
            return
        self.strategy = self.build(trainer, pl_module, len(trainer.datamodule.train_pool))
        if self._pending_state is not None:
            self._load(self._pending_state)
            self._pending_state = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        plan = trainer.datamodule.plan
        if plan.scheduled is None:  # a fresh run (a resumed one restored its plan)
            self._schedule(trainer, pl_module, pl_module.rollout_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        t0, gen0 = time.perf_counter(), pl_module.budget.generation_s
        fresh = outputs["record"].fresh()  # every rank's fresh groups, discarded candidates included
        ids = fresh.prompt_ids.numpy()
        rates = fresh.success_rates.numpy().astype(np.float64)
        step = pl_module.rollout_step - 1  # the step that just ran
        metrics = self.before_observe(ids, rates, step)
        self.strategy.observe(ids, rates, step)
        metrics[f"{self.name}/effective_ratio"] = effective_ratio(rates)
        if not training_ends_after_this_step(trainer, pl_module):
            self._schedule(trainer, pl_module, pl_module.rollout_step)
        metrics.update(self.metrics(trainer, pl_module))
        # Selection overhead: everything this callback did except generating reference rollouts (those are
        # rollouts, counted in the budget and in budget/generation_seconds).
        generation = pl_module.budget.generation_s - gen0
        metrics[f"{self.name}/overhead_s"] = time.perf_counter() - t0 - generation
        metrics[f"{self.name}/reference_generation_s"] = generation
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=max(1, len(ids)))

    def metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        return {}

    def _schedule(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        plan = trainer.datamodule.plan
        self.before_select(trainer, pl_module, step)
        ids = self.strategy.select(plan.batch_size, step, self.rng)
        plan.schedule(ids, source=self.name)
        self._last_selected = ids

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.strategy is None:
            return {}
        return encode_state({"version": 1, "strategy": self.strategy.state_dict(), "rng": self.rng.bit_generator.state})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.strategy is None:
            self._pending_state = state_dict  # restored in on_fit_start, once the strategy is built
        else:
            self._load(state_dict)

    def _load(self, state: dict[str, Any]) -> None:
        state = decode_state(state)
        self.strategy.load_state_dict(state["strategy"])
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]

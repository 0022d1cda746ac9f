"""SelectionCallback: the thin adapter every prompt-selection strategy shares.

At the end of step ``t`` it shows the strategy the outcomes of the step's *fresh* groups (replayed groups say
nothing new about the current policy), then writes the prompts of step ``t+1`` into the batch plan. The outcomes come
from the step's gathered record: every group any rank rolled out, including the candidates dynamic sampling
discarded, so the strategy holds the same state on every rank. The strategy is built in :meth:`setup_step` (once
the policy exists) and the first batch is chosen in :meth:`before_first_step`. The strategy's state and the
callback's random generator are part of every checkpoint, so a resumed run selects exactly what the uninterrupted
run selects, on any number of ranks.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.selection.base import SelectionStrategy, effective_ratio
from lit_rlft.step.context import StepContext, StepOutput


class SelectionCallback(StepCallback):
    """Drive a Lightning-free :class:`~lit_rlft.selection.base.SelectionStrategy` from a step's context.

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
    def build(self, ctx: StepContext, num_prompts: int) -> SelectionStrategy:
        raise NotImplementedError

    def before_select(self, ctx: StepContext, step: int) -> None:
        """Hook before each selection (DOTS rolls out its reference set here)."""

    def before_observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> dict[str, float]:
        """Hook before :meth:`SelectionStrategy.observe` (DPS scores its predictions here); returns metrics."""
        return {}

    def metrics(self, ctx: StepContext) -> dict[str, float]:
        return {}

    # -- the step's hooks -----------------------------------------------------------------------------------
    def setup_step(self, ctx: StepContext) -> None:
        if getattr(ctx.data, "plan", None) is None:
            raise RuntimeError(f"{type(self).__name__} needs a PromptDataModule with a training pool")
        if self.strategy is not None:
            return
        self.strategy = self.build(ctx, len(ctx.data.train_pool))
        if self._pending_state is not None:
            self._load(self._pending_state)
            self._pending_state = None

    def before_first_step(self, ctx: StepContext) -> None:
        if ctx.data.plan.scheduled is None:  # a fresh run (a resumed one restored its plan)
            self._schedule(ctx, ctx.rollout_step + ctx.async_depth)

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        t0, gen0 = time.perf_counter(), ctx.budget.generation_s
        fresh = output.record.fresh()  # every rank's fresh groups, discarded candidates included
        ids = fresh.prompt_ids.numpy()
        rates = fresh.success_rates.numpy().astype(np.float64)
        step = ctx.rollout_step - 1  # the step that just ran
        metrics = self.before_observe(ids, rates, step)
        if fresh.members is not None and getattr(self.strategy, "observes_group_sizes", False):
            self.strategy.observe(ids, rates, step, group_sizes=fresh.member_mask().sum(1).numpy())
        else:
            self.strategy.observe(ids, rates, step)
        metrics[f"{self.name}/effective_ratio"] = effective_ratio(rates)
        if not ctx.ends_after_this_step():  # the batch of step t + 1 + k (k = async_depth: t + 1.. are in flight)
            self._schedule(ctx, ctx.rollout_step + ctx.async_depth)
        metrics.update(self.metrics(ctx))
        # Selection overhead: everything this callback did except generating reference rollouts (those are
        # rollouts, counted in the budget and in budget/generation_seconds).
        generation = ctx.budget.generation_s - gen0
        metrics[f"{self.name}/overhead_s"] = time.perf_counter() - t0 - generation
        metrics[f"{self.name}/reference_generation_s"] = generation
        ctx.log(metrics)

    def _schedule(self, ctx: StepContext, step: int) -> None:
        plan = ctx.data.plan
        self.before_select(ctx, step)
        in_flight = ctx.in_flight  # asynchronous rollouts: never drawn again before their outcome is observed
        extra = {"exclude": in_flight} if in_flight.size else {}
        ids = self.strategy.select(plan.batch_size, step, self.rng, **extra)
        plan.schedule(ids, by=self.name)
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
            self._pending_state = state_dict  # restored in setup_step, once the strategy is built
        else:
            self._load(state_dict)

    def _load(self, state: dict[str, Any]) -> None:
        state = decode_state(state)
        self.strategy.load_state_dict(state["strategy"])
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]


def require_after_selector(ctx: StepContext, callback: StepCallback, does: str) -> None:
    """Raise unless ``callback`` (when it is among ``ctx.callbacks``) comes after every selection callback there,
    and ``ctx.data`` has a batch plan. ``does`` says what it does to the selector's batch, for the message."""
    name = type(callback).__name__
    if getattr(ctx.data, "plan", None) is None:
        raise RuntimeError(f"{name} needs a PromptDataModule with a training pool")
    callbacks = list(ctx.callbacks)
    mine = next((i for i, cb in enumerate(callbacks) if cb is callback), None)
    selectors = [i for i, cb in enumerate(callbacks) if isinstance(cb, SelectionCallback)]
    if mine is not None and (not selectors or max(selectors) > mine):
        raise ValueError(f"{name} must come after a selection callback in the callbacks list (it {does}); got the "
                         f"order {[type(cb).__name__ for cb in callbacks]}")

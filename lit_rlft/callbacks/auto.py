"""AutoShareCallback: let the run decide how much of each batch its selector picks (``auto`` in the study).

Composes with any selection callback listed before it (``[MoPPSCallback(...), AutoShareCallback()]``): after the
selector has scheduled the next batch, :class:`~lit_rlft.selection.auto.ShareController`'s share of it is kept and the
rest is replaced by the next prompts of the plan's uniform order, the *control slice*. After each step the two
slices' fresh groups are compared (their informative share, weighed by how much of the learning transfers to
held-back prompts) and the share moves towards the slice that taught more per completion. The selector still
observes every trained group, the control slice's included, so its beliefs keep up with prompts it did not pick.

The control slice is trained on like the rest of the batch: its completions are training completions
(``auto/control_completions`` counts them). What is rolled out for measurement alone is the held-back probe: a fixed
set of pool prompts (``holdout``, at most 1/16 of the pool) that is never trained on, rolled out before the first step
and then whenever the probes so far have cost less than ``probe_budget`` of the completions trained on; those
completions are charged to the run's budget under ``auto`` (``budget/completions_auto``), so a budgeted run trains on
fewer completions by as many. The decision is made from the step's gathered record and the plan, both the same on
every rank, with the callback's own seeded generator: every rank splits the batch identically.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.callbacks.selection import require_after_selector
from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.selection.auto import ShareController, Transfer, probe_variance, split_batch
from lit_rlft.step.context import StepContext, StepOutput


class AutoShareCallback(StepCallback):
    """Split each selected batch between the selector and a uniform control slice, by what the run measures.

    Args:
        initial_share: the selected share before any evidence.
        min_selected: the least share the selector keeps (its probe: it can earn its share back).
        min_control: the least share drawn uniformly (the measurement never stops).
        rate: how fast the share moves (logit change per unit of ``log`` of the signal, per step).
        horizon: steps over which the slices' outcomes are discounted (by ``1 - 1 / horizon`` per step).
        holdout: prompts of the pool held back from training to measure transfer (at most 1/16 of the pool).
        probe_budget: the most the probes of the held-back prompts cost, as a share of the completions trained on:
            one is rolled out before the first step, then after any step that leaves them below this share.
        probe_generations: completions per held-back prompt in a probe (default: half the run's ``G``, at least 2).
        seed: chooses the held-back prompts and which of the selector's prompts are kept.

    Logs after every step ``auto/share`` (of the next batch), ``auto/signal`` (the ratio ``R`` of the selected
    slice's value per completion over the control slice's), ``auto/informative_selected``,
    ``auto/informative_control``, ``auto/transfer``, ``auto/coverage``, ``auto/control_completions`` (cumulative)
    and, after each probe, ``auto/held_back_success``.
    """

    name = "auto"

    def __init__(self, initial_share: float = 0.5, min_selected: float = 0.125, min_control: float = 0.125,
                 rate: float = 0.25, horizon: float = 32.0, holdout: int = 32, probe_budget: float = 0.03,
                 probe_generations: int | None = None, seed: int = 0):
        ShareController(1, initial_share, min_selected, min_control, rate, horizon)  # validate now
        if int(holdout) != holdout or holdout < 1:
            raise ValueError(f"`holdout` must be an integer >= 1 (prompts held back), got {holdout!r}")
        if not 0.0 < probe_budget < 1.0:
            raise ValueError(f"`probe_budget` must lie in (0, 1) (a share of the trained completions), got "
                             f"{probe_budget!r}")
        if probe_generations is not None and (int(probe_generations) != probe_generations or probe_generations < 2):
            raise ValueError(f"`probe_generations` must be an integer >= 2 (a success rate's variance needs two), "
                             f"got {probe_generations!r}")
        self.initial_share, self.min_selected, self.min_control = initial_share, min_selected, min_control
        self.rate, self.horizon, self.seed = rate, horizon, seed
        self.holdout, self.probe_budget = int(holdout), float(probe_budget)
        self.probe_generations = None if probe_generations is None else int(probe_generations)
        self.held = np.zeros(0, dtype=np.int64)  # the held-back prompts (chosen in setup_step)
        self.transfer = Transfer()
        self.rng = np.random.default_rng(seed)
        self.controller: ShareController | None = None
        self.planned: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # step -> (selected ids, control ids)
        self.control_completions = 0
        self.trained_completions = 0  # fresh completions trained on (what the probes' cost is a share of)
        self.probe_completions = 0
        self._pending_state: dict[str, Any] | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(initial_share=self.initial_share, min_selected=self.min_selected,
                                        min_control=self.min_control, rate=self.rate, horizon=self.horizon,
                                        holdout=self.holdout, probe_budget=self.probe_budget,
                                        probe_generations=self.probe_generations, seed=self.seed)

    def setup_step(self, ctx: StepContext) -> None:
        require_after_selector(ctx, self, "splits the batch the selector planned")
        if self.controller is None:
            size = len(ctx.data.train_pool)
            n = min(self.holdout, size // 16)
            if n < 1:
                raise ValueError(f"AutoShareCallback holds back up to 1/16 of the pool to measure transfer; a pool of "
                                 f"{size} prompts is too small (need 16 or more)")
            self.controller = ShareController(size, self.initial_share, self.min_selected, self.min_control,
                                              self.rate, self.horizon)
            self.held = np.sort(self.rng.choice(size, size=n, replace=False)).astype(np.int64)
        if self._pending_state is not None:
            self._load(self._pending_state)
            self._pending_state = None

    def before_first_step(self, ctx: StepContext) -> None:
        if not self.transfer.probes:  # a fresh run (a resumed one restored its probes)
            self._probe(ctx, ctx.rollout_step)
        self._split(ctx, ctx.rollout_step + ctx.async_depth)

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        fresh = output.record.fresh()  # every rank's fresh groups
        planned = self.planned.pop(ctx.rollout_step - 1, None)
        metrics: dict[str, float] = {}
        if planned is not None:
            ids = fresh.prompt_ids.numpy()
            rates = fresh.success_rates.numpy().astype(np.float64)
            selected, control = np.isin(ids, planned[0]), np.isin(ids, planned[1])
            self.transfer.add_pool(ctx.rollout_step - 1, float(rates[control].mean()) if control.any() else 0.0,
                                   int(control.sum()))
            signal = self.controller.observe(ids[selected], rates[selected], rates[control], self.transfer.value)
            sizes = fresh.member_mask().sum(1).numpy()
            self.control_completions += int(sizes[control].sum())
            self.trained_completions += int(sizes.sum())
            metrics.update(signal.metrics(self.name))
        else:
            metrics[f"{self.name}/share"] = self.controller.share
        if not ctx.ends_after_this_step():  # nothing is planned (nor measured) after the last step
            if self.probe_completions < self.probe_budget * self.trained_completions:  # under the policy step t + 1 trains
                metrics[f"{self.name}/held_back_success"] = self._probe(ctx, ctx.rollout_step)
            self._split(ctx, ctx.rollout_step + ctx.async_depth)
        metrics[f"{self.name}/control_completions"] = float(self.control_completions)
        ctx.log(metrics)

    def _probe(self, ctx: StepContext, step: int) -> float:
        """Roll out the held-back prompts under the current policy (charged as ``auto``); their mean success."""
        g = self.probe_generations or max(2, ctx.num_generations // 2)
        rates = ctx.success_rates(self.held, purpose=self.name, num_generations=g)
        self.probe_completions += self.held.size * g
        self.transfer.add_probe(step, float(np.mean(rates)), probe_variance(rates, g))
        return float(np.mean(rates))

    def _split(self, ctx: StepContext, step: int) -> None:
        """Keep the controller's share of the batch the selector planned for ``step``; draw the rest uniformly;
        never a held-back prompt."""
        plan = ctx.data.plan
        if plan.scheduled is None:
            return
        held = set(self.held.tolist())
        selected = np.array([i for i in plan.scheduled.tolist() if i not in held], dtype=np.int64)
        share = self.controller.share * plan.scheduled.size / max(selected.size, 1)

        def draw(n: int, used: set[int]) -> np.ndarray:
            return plan.draw_unused(n, used | held) if n > 0 else np.zeros(0, dtype=np.int64)

        kept, control = split_batch(selected, min(1.0, share), self.rng, draw)
        short = plan.scheduled.size - kept.size - control.size
        if short > 0:  # held-back prompts left the selector's batch: uniform draws take their places
            control = np.concatenate([control, draw(short, set(kept.tolist()) | set(control.tolist()))])
        by = plan.scheduled_by or "scheduled"
        plan.schedule(np.concatenate([kept, control]), by=f"{by}+{self.name}")
        self.planned[step] = (kept, control)

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.controller is None:
            return {}
        planned = {str(step): {"selected": sel, "control": ctrl} for step, (sel, ctrl) in self.planned.items()}
        return encode_state({"version": 1, "controller": self.controller.state_dict(), "planned": planned,
                             "held": self.held, "transfer": self.transfer.state_dict(),
                             "control_completions": self.control_completions,
                             "trained_completions": self.trained_completions,
                             "probe_completions": self.probe_completions, "rng": self.rng.bit_generator.state})

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
        self.trained_completions = int(state["trained_completions"])
        self.probe_completions = int(state["probe_completions"])
        self.held = np.asarray(state["held"], dtype=np.int64)
        self.transfer.load_state_dict(state["transfer"])
        self.rng.bit_generator.state = state["rng"]

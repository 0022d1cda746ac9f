"""StudyCallback: what one arm of a study measures, from inside a normal ``lit-rlft fit`` of its config.

The study composes each run's config with this callback last (after the strategy's callbacks and the budget stop);
the run itself is the user's own ``fit`` (or the same run through ``FabricLoop``: ``lit-rlft study --loop fabric``).
It is a :class:`~lit_rlft.callbacks.base.StepCallback` over the declared step context
(:class:`~lit_rlft.study.evaluation.StudyContext`), so it measures alike under the Trainer, ``FabricLoop`` and a
plain loop. The callback:

- evaluates the policy (:class:`~lit_rlft.study.evaluation.HeldOutEvaluator`) before the first step and after every
  step in which cumulative completions (every purpose: reference sets, filtered rounds) cross one of ``marks``, and
  once more at the end if the run stopped between marks. The start evaluation is shared: when ``start_cache`` holds
  one made for a policy with the same probe (:func:`~lit_rlft.study.evaluation.policy_probe`) and the same
  evaluation settings, it is reused instead of measured again;
- times every training step (from the end of the previous step's measuring, or of the start evaluation, to the end
  of the strategy callbacks' work after it: selection overhead included, evaluation and checkpoints excluded). The training wall-clock of a point is the sum of the step times before it,
  so it starts at the first training step;
- counts, per step, the completions generated in groups without reward spread (fresh groups only; a dynamic-sampling
  round's discarded groups included): the rollouts that taught nothing;
- writes everything to ``out`` (JSON, atomically) after every evaluation, so a run that dies keeps its curve;
- with ``checkpoint``, saves the run (weights, optimizer, every callback's state: the selection's, the plan, its own
  curve and clocks) to that file after every evaluation but the last, through the driver
  (:meth:`~lit_rlft.step.context.StepContext.save_checkpoint`), so a killed run resumes from its last mark
  (``lit-rlft fit --ckpt_path``) and selects, samples and measures what the uninterrupted run would have.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.records.jsonio import read_json, write_json, write_result
from lit_rlft.step.context import StepOutput
from lit_rlft.study.evaluation import EvalSettings, HeldOutEvaluator, StudyContext, policy_probe

__all__ = ["StudyCallback", "zero_spread_completions"]


def zero_spread_completions(record: Any) -> tuple[int, int]:
    """``(wasted, fresh)``: completions in freshly generated groups of an :class:`~lit_rlft.core.types.OutcomeRecord`
    whose rewards have no spread, and all completions in fresh groups (replayed groups are not generated again)."""
    fresh = ~record.is_replay
    rewards = record.rewards[fresh].float()
    members = record.members[fresh] if record.members is not None else torch.ones_like(rewards, dtype=torch.bool)
    sizes = members.sum(dim=1)
    high = torch.where(members, rewards, torch.full_like(rewards, -float("inf"))).amax(dim=1)
    low = torch.where(members, rewards, torch.full_like(rewards, float("inf"))).amin(dim=1)
    flat = (high - low) <= 0
    return int(sizes[flat].sum()), int(sizes.sum())


class StudyCallback(StepCallback):
    """Measure one arm of a study (see the module docstring), under the Trainer, ``FabricLoop`` or a plain loop.

    Args:
        marks: completion counts (increasing) after which to evaluate; the last is usually the budget.
        out: the JSON file the measurements go to (rank 0 writes it).
        eval_seed: the evaluation's sampling seed (the same in every arm: common random numbers).
        train_subset: prompts of the fixed training-pool subset whose reward is tracked (0: none).
        train_generations: samples per training-subset prompt.
        groups: pooled difficulty groups of the held-out accuracy, e.g. ``{"learnable": [3, 4]}``.
        start_cache: a JSON file shared by the study's runs holding the start evaluation (None: always measure).
        eval_reward_funcs: score the evaluation with these rewards instead of the run's (e.g. the rule, while the
            run trains on a learned reward model).
        checkpoint: a checkpoint file written after every evaluation at a mark before the last (None: none).
    """

    def __init__(self, marks: list[int], out: str, eval_seed: int = 0, train_subset: int = 0,
                 train_generations: int = 4, groups: dict[str, list[Any]] | None = None,
                 start_cache: str | None = None, eval_reward_funcs: list[str] | None = None,
                 checkpoint: str | None = None):
        if not marks or any(b <= a for a, b in zip(marks, marks[1:])) or marks[0] < 1:
            raise ValueError(f"StudyCallback: marks must be increasing positive completion counts, got {marks}")
        self.marks, self.out = [int(m) for m in marks], str(out)
        self.settings = EvalSettings(seed=eval_seed, train_subset=train_subset, train_generations=train_generations,
                                     groups=groups or {}, reward_funcs=list(eval_reward_funcs or []))
        self.evaluator = HeldOutEvaluator(self.settings)
        self.start_cache, self.checkpoint = start_cache, checkpoint
        self.curve: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.train_s = 0.0  # the training wall-clock: the sum of step times
        self.eval_s = 0.0
        self._next = 0  # index of the next mark
        self._t_step: float | None = None  # when the measured step's clock started

    # -- the step's context methods (the Trainer, FabricLoop and a plain loop call them alike) ---------------------
    def before_first_step(self, ctx: StudyContext) -> None:
        if not self.curve:
            self._evaluate(ctx, start=True)
        self._t_step = time.perf_counter()

    def after_step(self, ctx: StudyContext, output: StepOutput) -> None:
        seconds = time.perf_counter() - (self._t_step or time.perf_counter())
        self.train_s += seconds
        wasted, fresh = zero_spread_completions(output.record)
        self.steps.append({"step": int(output.step), "completions": int(ctx.budget.completions), "step_s": seconds,
                           "zero_spread_completions": wasted, "fresh_completions": fresh})
        if ctx.collective.rank == 0:  # the study's progress bar reads it while the run goes on
            write_json(Path(self.out).with_name("progress.json"), {"completions": int(ctx.budget.completions)})
        crossed = False
        while self._next < len(self.marks) and ctx.budget.completions >= self.marks[self._next]:
            self._next, crossed = self._next + 1, True
        if crossed:
            self._evaluate(ctx)
        if ctx.ends_after_this_step():  # the last step (the budget, max_steps, a stop request)
            if self.curve[-1]["step"] != ctx.rollout_step:
                self._evaluate(ctx)  # stopped between marks: the final point
            self._write(ctx, finished=True)
        elif crossed and self.checkpoint:
            t0 = time.perf_counter()
            ctx.save_checkpoint(self.checkpoint)
            self.eval_s += time.perf_counter() - t0  # kept out of the training clock, as evaluations are
        self._t_step = time.perf_counter()  # the next step's clock starts after this one's measuring

    # -- measuring ---------------------------------------------------------------------------------------------
    def _evaluate(self, ctx: StudyContext, start: bool = False) -> dict[str, Any]:
        t0 = time.perf_counter()
        point: dict[str, Any] = {"step": int(ctx.rollout_step), "completions": int(ctx.budget.completions),
                                 "wall_s": self.train_s}
        shared = self._shared_start(ctx) if start else None
        if shared is not None:
            point.update(shared["metrics"], shared_start=True)
        else:
            metrics = self.evaluator.measure(ctx)
            point.update(metrics)
            if start and self.start_cache and ctx.collective.rank == 0:
                write_json(self.start_cache, {"probe": policy_probe(ctx), "settings": self.settings.key(),
                                              "metrics": metrics})
        point["eval_s"] = time.perf_counter() - t0
        self.eval_s += point["eval_s"]
        self.curve.append(point)
        self._write(ctx)
        return point

    def _shared_start(self, ctx: StudyContext) -> dict[str, Any] | None:
        """The study's start evaluation when it was made for this very policy and these settings, else None."""
        if not self.start_cache or not Path(self.start_cache).is_file():
            return None
        cached = read_json(self.start_cache)
        if not cached or cached.get("settings") != self.settings.key():
            return None
        return cached if cached.get("probe") == policy_probe(ctx) else None

    def _write(self, ctx: StudyContext, finished: bool = False) -> None:
        if ctx.collective.rank != 0:
            return
        write_result(self.out, {"curve": self.curve, "steps": self.steps, "finished": finished,
                                "rollout_steps": int(ctx.rollout_step), "budget": ctx.budget.state_dict(),
                                "timings": {"train_wall_s": self.train_s, "eval_s": self.eval_s}})

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"curve": self.curve, "steps": self.steps, "train_s": self.train_s, "eval_s": self.eval_s,
                "next": self._next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curve, self.steps = list(state.get("curve", [])), list(state.get("steps", []))
        self.train_s, self.eval_s = float(state.get("train_s", 0.0)), float(state.get("eval_s", 0.0))
        self._next = int(state.get("next", 0))

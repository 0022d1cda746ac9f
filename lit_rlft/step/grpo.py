"""GRPOStep: one GRPO rollout step, without Lightning. ``GRPOModule`` (Trainer), ``FabricLoop`` and a plain PyTorch loop
(:func:`lit_rlft.step.loop.train`, see ``docs/design.md``) drive it.

One step, as named calls (:meth:`GRPOStep.run`)::

    rollouts, record = self.rollouts.next_batch(...)        # 1-3. the plan's batch: this rank's slice generated and
                                                            #      scored by the rollout source, every rank's outcomes
    rollouts, record = hook.on_rollouts(self, ...)          # 4. rollout hooks reshape (dynamic sampling, replay)
    advantages = group_advantages(...)                      # 5. group-relative advantages
    update = self.updater.update(rollouts, advantages, ...) # 6. num_iterations x num_mini_batches optimizer steps
    self.sync_weights()                                      #    the source samples from the new weights next
    # 7. the driver calls the callbacks' after-step hooks with the StepOutput; a stop may be requested there

Notation: ``B`` prompts (global), ``G = num_generations``, ``N = B * G``, ``W`` ranks. On ``W`` ranks, rank ``r``
rolls out and trains on the ``r``-th slice of ``B / W`` prompts; the record holds every rank's outcomes.

The step is the :class:`~lit_rlft.step.context.StepContext` that callbacks see, and runs one step. What it holds:
:attr:`rollouts` (every rollout, sharded over the ranks, from a :class:`~lit_rlft.rollout.source.RolloutSource`
whose kind it never asks: :mod:`lit_rlft.step.sharded`), :attr:`validation` (:mod:`lit_rlft.step.validation`), the
updater, the reference policy, the callbacks it was bound with (their rollout hooks and stop conditions) and where
its driver logs. :func:`~lit_rlft.step.builder.build_step` builds one from a :class:`~lit_rlft.step.config.GRPOConfig`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from lit_rlft.core.advantages import ScaleRewards, group_advantages
from lit_rlft.core.losses import GRPOLoss
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.models.sharding import hf_model, is_sharded
from lit_rlft.rewards.scorer import Scorer
from lit_rlft.rollout.engines.base import stop_token_ids
from lit_rlft.rollout.source import RolloutSource
from lit_rlft.runtime.distributed import Collective, LocalCollective
from lit_rlft.step import evaluation
from lit_rlft.step.budget import RolloutBudget
from lit_rlft.step.config import AsyncConfig, GenerationConfig, OptimConfig
from lit_rlft.step.context import PromptData, RolloutHook, StepOutput, StopCondition, planned_generations
from lit_rlft.step.metrics import NoSignalWarning, step_metrics
from lit_rlft.step.seeding import StepSeeds
from lit_rlft.step.sharded import ShardedRollouts
from lit_rlft.step.update import PolicyUpdater, UpdateBackend, reference_logprobs
from lit_rlft.step.validation import Validation

if TYPE_CHECKING:
    from lit_rlft.step.config import GRPOConfig

__all__ = ["GRPOStep"]

MetricSink = Callable[[Mapping[str, float], int], None]
"""``(metrics, rollout step) -> None``: where the step and its callbacks log scalars."""
TextSink = Callable[[str, str, int], None]
"""``(tag, text, rollout step) -> None``."""


class GRPOStep:
    """One GRPO rollout step with the off-policy (replay) loss; Lightning-free.

    Args:
        source: where this rank's rollouts come from (:class:`~lit_rlft.rollout.in_process.InProcessRollouts`, a
            :class:`~lit_rlft.rollout.process.ProcessRollouts`, ...).
        tokenizer: the policy's tokenizer.
        generation: how completions are sampled.
        asynchronous: the asynchronous pipeline (``depth``: training batches kept in flight).
        loss: the per-micro-batch loss (its ``max_completion_length`` defaults to the generation's).
        optim: how each rollout batch is split into optimizer steps (the optimizer itself is the backend's).
        scale_rewards: ``group`` (GRPO), ``batch`` or ``none`` (Dr. GRPO) advantage normalisation.
        tools: the JSON schemas of the environment's tools (chat-template prompts describe them).

    Usually built by :func:`~lit_rlft.step.builder.build_step` from a ``GRPOConfig``. Before the first step:
    :meth:`attach` (the policy; the builder does it), :meth:`bind` (the prompt data, the ranks, the callbacks, where to
    log) and :meth:`start`; then :meth:`run` once per rollout step until :meth:`ends_after_this_step`.
    """

    def __init__(self, source: RolloutSource, tokenizer: Any, *, generation: GenerationConfig | None = None,
                 asynchronous: AsyncConfig | None = None, loss: GRPOLoss | None = None, optim: OptimConfig | None = None, scale_rewards: ScaleRewards = "group",
                 tools: Sequence[dict[str, Any]] = ()):
        if scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"model.scale_rewards must be one of group, batch, none; got {scale_rewards!r}")
        self.generation = generation or GenerationConfig()
        self.optim = optim or OptimConfig()
        loss = loss or GRPOLoss()
        if loss.max_completion_length is None:
            loss = dataclasses.replace(loss, max_completion_length=self.generation.max_completion_length)
        self.scale_rewards, self.tokenizer, self.tools = scale_rewards, tokenizer, list(tools)
        self.updater = PolicyUpdater(loss, self.generation.temperature, self.optim)  # the one holder of the loss
        self.config: GRPOConfig | None = None  # what build_step built this step from
        self.seeds = StepSeeds(self.generation.seed)
        self.asynchronous = asynchronous or AsyncConfig()
        self.rollouts = ShardedRollouts(source, self.seeds, self.asynchronous.depth)
        self.scorer = source.scorer  # through the setter: the step reports failures, not the scorer
        self.validation = Validation(self.rollouts, self.seeds, self.generation)
        self.rollout_step = 0  # completed rollout steps (checkpointed)
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None  # frozen copy for the KL term (full fine-tuning with beta > 0)
        self.stop_token_ids: list[int] = []
        self.callbacks: list[Any] = []  # bound by the driver: rollout hooks and stop conditions among them
        self._sink: MetricSink = lambda metrics, step: None
        self._text_sink: TextSink = lambda tag, text, step: None
        self._ends: Callable[[], bool] = lambda: False
        self._saver: Callable[[str], None] | None = None
        self._log_dir, self._log_step, self._sync_s = ".", 0, 0.0
        self._stop: str | None = None
        self._engine_stale = False  # weights changed since the source last saw them (a checkpoint was loaded)
        self._no_signal = NoSignalWarning()

    # ------------------------------------------------------------------------------------------------ wiring
    def bind(self, data: PromptData, collective: Collective | None = None, *, callbacks: Sequence[Any] = (),
             sink: MetricSink | None = None, text_sink: TextSink | None = None, ends: Callable[[], bool] | None = None,
             log_dir: str | None = None, saver: Callable[[str], None] | None = None, stage: str = "fit") -> None:
        """Connect the step to its prompt data, its ranks, its callbacks (those that are :class:`RolloutHook` reshape
        each batch, in order; :class:`StopCondition` ones can end training) and its driver's logging, own stop
        condition (``ends``: e.g. ``max_steps`` reached) and checkpoint writer (``saver(path)``: what
        :meth:`save_checkpoint` calls; None: the driver saves none). A stop requested in an earlier fit is
        forgotten."""
        collective = collective or LocalCollective()
        self.callbacks, self._stop = list(callbacks), None
        self._sink, self._text_sink = sink or self._sink, text_sink or self._text_sink
        self._saver = saver or self._saver
        self._ends, self._log_dir = ends or self._ends, log_dir or self._log_dir
        if self.tools:  # chat-template prompts describe the environment's tools
            data.set_tools(self.tools)
        data.set_tokenizer(self.tokenizer)
        world = collective.world_size
        if stage == "fit" and data.batch_size % world:
            raise ValueError(
                f"data.batch_size ({data.batch_size}) must divide by the number of ranks ({world}): the global batch "
                f"is split evenly, every rank rolls out data.batch_size / {world} prompts"
            )
        self.rollouts.bind(data, collective)
        self.validation.bind(data)

    def attach(self, policy: nn.Module, reference: nn.Module | None = None) -> None:
        """Use ``policy`` (built, and sharded if it is), with ``reference`` for the KL term, and hand it to the rollout
        source: exactly once per policy, however often the drivers call this."""
        if policy is self.policy:
            self.reference = reference if reference is not None else self.reference
            return
        self.policy, self.reference = policy, reference
        self.stop_token_ids = stop_token_ids(hf_model(policy), self.tokenizer)
        self.rollouts.sharded = is_sharded(policy)
        self.rollouts.source.attach(policy)

    @property
    def scorer(self) -> Scorer:
        """The scorer (the source's): ``(completions [N], columns) -> RewardResult``."""
        return self.rollouts.source.scorer

    @scorer.setter
    def scorer(self, scorer: Scorer) -> None:
        source = self.rollouts.source
        source.scorer = scorer  # a plain callable becomes a Scorer there
        source.scorer.report = False  # the step prints every rank's failures itself (RewardFailureLog)

    @property
    def source(self) -> RolloutSource:
        return self.rollouts.source

    # ------------------------------------------------------------------------------------------------ the context
    @property
    def data(self) -> PromptData:
        return self.rollouts.bound_data

    @property
    def collective(self) -> Collective:
        return self.rollouts.collective

    @property
    def budget(self) -> RolloutBudget:
        return self.rollouts.budget

    @property
    def device(self) -> torch.device:
        """Where the policy's (local) parameters are: the step's log-prob passes run there."""
        param = next(self.policy.parameters(), None) if self.policy is not None else None
        return param.device if param is not None else torch.device("cpu")

    @property
    def num_generations(self) -> int:
        return self.generation.num_generations

    @property
    def log_dir(self) -> str:
        return self._log_dir

    @property
    def async_depth(self) -> int:
        """``k``: batches generated ahead of training (0: synchronous); what callbacks observe lags by ``k`` steps."""
        return self.rollouts.depth

    @property
    def in_flight(self) -> np.ndarray:
        """``[n]`` global ids dispatched and not yet observed (empty when synchronous): selection must not draw them."""
        return self.rollouts.in_flight_ids()

    def rollout(self, prompt_ids: np.ndarray, purpose: str = "train",
                num_generations: int | None = None) -> tuple[Rollouts, OutcomeRecord]:
        """Roll out the global prompt ids ``[b]`` now (a collective call: every rank, the same ids), ``num_generations``
        completions each (default ``G``): this rank's rollouts and every rank's outcomes, charged under ``purpose``."""
        return self.rollouts.rollout(prompt_ids, self.rollout_step, purpose, sampling=self.generation.sampling,
                                     num_generations=num_generations or self.num_generations)

    def success_rates(self, prompt_ids: np.ndarray, purpose: str = "reference",
                      num_generations: int | None = None) -> np.ndarray:
        """Roll out ``prompt_ids`` ``[K]`` under the current policy (any ``K``, a collective call), ``num_generations``
        completions each (default ``G``); their success rates ``[K]``, charged under ``purpose`` (DOTS' reference
        sets, ``auto``'s probes)."""
        return self.rollouts.success_rates(prompt_ids, self.rollout_step, purpose,
                                           num_generations or self.num_generations, self.generation.sampling)

    def plan_batch(self) -> np.ndarray:
        """The global prompt ids ``[B]`` of the next planned batch (callbacks wrote it). The ids and the plan's state
        after drawing them are checked equal on every rank: a rank whose selection state drifted would otherwise draw
        other prompts and make other collective calls (a hang). The run stops on every rank instead, naming them."""
        plan = self.data.plan
        ids = plan.next_batch()
        if self.collective.is_distributed:  # one process has nothing to compare (and the state is pool-sized)
            self.collective.check_same((ids.tolist(), plan.state_dict()), f"step {self.rollout_step}: the batch plan")
        return ids

    def log(self, metrics: Mapping[str, float]) -> None:
        self._sink(metrics, self._log_step)

    def log_text(self, tag: str, text: str) -> None:
        if self.collective.rank == 0:
            self._text_sink(tag, text, self._log_step)

    def request_stop(self, reason: str) -> None:
        """End training after the step that just ran (the first reason is kept). The Trainer, ``FabricLoop`` and a
        plain loop asking :meth:`ends_after_this_step` all honour it; every rank must request it alike."""
        if self._stop is None:
            self._stop = reason

    def save_checkpoint(self, path: str) -> None:
        """Write the run's checkpoint to ``path`` now, through the driver (``Trainer.save_checkpoint``,
        ``FabricLoop.save``); a collective call: every rank calls it."""
        if self._saver is None:
            raise RuntimeError(f"GRPOStep: cannot save {path}: the driver bound no checkpoint writer "
                               "(step.bind(..., saver=...); the Trainer and FabricLoop bind theirs)")
        self._saver(path)

    @property
    def stop_requested(self) -> str | None:
        """Why training ends after this step: a :meth:`request_stop`, or a bound :class:`StopCondition` met (asked
        now, so callbacks see it whatever their order); None when nothing asks for a stop."""
        if self._stop is None:
            for cb in self.callbacks:
                reason = cb.stop_reason(self) if isinstance(cb, StopCondition) else None
                if reason:
                    self.request_stop(reason)
                    break
        return self._stop

    def ends_after_this_step(self) -> bool:
        return self.stop_requested is not None or bool(self._ends())

    # ------------------------------------------------------------------------------------------------ the step
    def start(self) -> None:
        """Before training: the reference beside the policy, the source on the current weights (once, if a restored
        checkpoint changed them), the policy in training mode (a validation before fit leaves it in eval mode)."""
        if self.reference is not None:
            self.reference.to(self.device)
        self.sync_weights(only_if_stale=True)
        self.policy.train()

    def run(self, backend: UpdateBackend, hooks: Sequence[RolloutHook] | None = None) -> StepOutput:
        """One rollout step with ``backend`` doing the optimisation; the step's outputs (see :class:`StepOutput`).
        ``hooks``: the rollout hooks to run (default: the bound callbacks that are :class:`RolloutHook`, in order)."""
        hooks = [cb for cb in self.callbacks if isinstance(cb, RolloutHook)] if hooks is None else hooks
        if self.policy is None:
            raise RuntimeError("GRPOStep: no policy (call attach first)")
        t_step = time.perf_counter()
        self._log_step = self.rollout_step
        self.rollouts.costs = type(self.rollouts.costs)()
        self.seeds.reseed(self.rollout_step, salt=0, rank=self.collective.rank)
        rollouts, record = self.rollouts.next_batch(self.rollout_step, self.plan_batch,  # 1-3
                                                    planned_generations(hooks, self.num_generations),
                                                    self.generation.sampling)
        for hook in hooks:  # 4
            rollouts, record = hook.on_rollouts(self, rollouts, record)
        trained = record.trained_batch()
        batch_rewards = trained.rewards if self.collective.is_distributed else None
        ragged = trained.members is not None or rollouts.members is not None  # groups of different sizes, any rank
        advantages = group_advantages(  # 5 [B_l, G]; statistics over each group's own members
            rollouts.rewards, self.scale_rewards, batch_rewards=batch_rewards,
            members=rollouts.member_mask() if ragged else None,
            batch_members=trained.member_mask() if ragged and batch_rewards is not None else None)
        steps_before = self.updater.optimizer_steps
        update = self.updater.update(rollouts, advantages.reshape(-1), backend, self.collective,  # 6
                                     reference_logprobs(self.updater, self.reference, self.policy, self.device))
        rollouts = dataclasses.replace(rollouts, behaviour_logprobs=update.behaviour_logprobs)
        if update.metrics["nonfinite_skips"]:
            self._warn(f"step {self.rollout_step}: {int(update.metrics['nonfinite_skips'])} optimizer step(s) had a "
                       f"non-finite loss or gradient and were skipped ({self.updater.skips_in_a_row} in a row; the "
                       f"run stops at model.optim.max_nonfinite_skips={self.updater.max_nonfinite_skips})")
        self.sync_weights(version=self.rollout_step + 1)  # the next batches (reference sets, validation) sample these
        self.rollout_step += 1
        metrics = step_metrics(rollouts, record, trained, update.metrics, self.rollouts, self._sync_s,
                               time.perf_counter() - t_step)
        if metrics["batch/no_signal"]:
            self._no_signal(trained, self.rollout_step - 1, self.collective.rank)
        metrics.update(self.rollouts.async_metrics(rollouts, self.rollout_step - 1))
        return StepOutput(step=self.rollout_step - 1, rollouts=rollouts, record=record, metrics=metrics,
                          optimizer_steps=self.updater.optimizer_steps - steps_before)

    def sync_weights(self, only_if_stale: bool = False, version: int | None = None) -> None:
        """Push the current weights to the rollout source (HF in process: nothing to do; vLLM or a generation
        process: a weight push, timed as ``time/weight_sync_s``). Every rank calls it (FSDP2 gathers).
        ``only_if_stale``: only when the weights changed since the source last saw them other than by this step's
        own updates (a checkpoint was loaded), as when training or validation starts. ``version``: the weights'
        version (updates made; default the current step)."""
        if only_if_stale and not self._engine_stale:
            return
        t0 = time.perf_counter()
        self.rollouts.source.sync_weights(self.policy, self.rollout_step if version is None else version,
                                  full=self._engine_stale)
        self._sync_s = time.perf_counter() - t0
        self._engine_stale = False

    def _warn(self, message: str) -> None:
        if self.collective.rank == 0:
            warnings.warn(message, UserWarning, stacklevel=3)

    # ------------------------------------------------------------------------------------------------ validation
    def validate(self, batches: Iterable[Any]) -> dict[str, float]:
        """The validation pool's batches of global prompt ids through :meth:`begin_validation`,
        :meth:`validation_batch` and :meth:`validation_results` (what the Trainer's validation loop calls one by
        one); the ``val/...`` metrics, the same on every rank."""
        self.begin_validation()
        for batch in batches:
            self.validation_batch(batch)
        return self.validation_results()

    def begin_validation(self) -> None:
        """Before a validation: the source on the current weights (if a restored checkpoint changed them)."""
        self.sync_weights(only_if_stale=True)
        self.validation.begin()

    def validation_batch(self, prompt_ids: Any) -> None:
        """One batch of global validation ids (see :class:`~lit_rlft.step.validation.Validation`)."""
        self.validation.batch(prompt_ids, self.rollout_step, self.device)

    def validation_results(self) -> dict[str, float]:
        return self.validation.results()

    def evaluating(self, seeds: StepSeeds, scorer: Scorer | None = None) -> contextlib.AbstractContextManager[None]:
        """A measurement's block: the policy in eval mode, rollouts on ``seeds``, scored by ``scorer`` (None: the
        run's); all restored after (:func:`lit_rlft.step.evaluation.evaluating`)."""
        return evaluation.evaluating(self, seeds, scorer)

    def evaluate(self, seeds: StepSeeds, scorer: Scorer | None = None) -> dict[str, float]:
        """The held-out split's ``val/...`` metrics with ``seeds`` and ``scorer``, leaving the run as it was
        (:func:`lit_rlft.step.evaluation.evaluate`)."""
        return evaluation.evaluate(self, seeds, scorer)

    @property
    def last_validation(self) -> dict[str, float]:
        """The metrics of the latest validation."""
        return self.validation.last

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The step's counters, for checkpoints (plain types); asynchronous, the ledger of batches in flight."""
        return {"rollout_step": self.rollout_step, **self.rollouts.state_dict(), "updater": self.updater.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counters; the weights restored with them are pushed to the source when
        training or validation starts."""
        self._engine_stale = True
        self.rollout_step = int(state.get("rollout_step", 0))
        self.rollouts.load_state_dict(state)
        self.updater.load_state_dict(state.get("updater", {}))

    def close(self) -> None:
        """Stop what the rollout source started (reward and environment workers, a generation process); idempotent, a
        later rollout starts them again."""
        self.rollouts.close()

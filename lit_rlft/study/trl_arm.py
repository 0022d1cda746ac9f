"""TRL's ``GRPOTrainer`` as an arm of a study: the same run config, measured by the same evaluator.

    python -m lit_rlft.study.trl_arm --config <out>/arms/trl-seed0/config.yaml    # what `lit-rlft study` runs

The run config (the study's composed one) is read through LightningCLI as ``lit-rlft fit`` reads it; TRL gets:

- the policy lit_rlft builds from it (``model``, ``dtype``, ``tiny``, ``lora`` as peft adapters, gradient checkpointing):
  the same weights, the same adapters' initialisation under the same seed;
- every training prompt as lit_rlft renders it (template, chat template), checked token for token against lit_rlft's
  prompt tokens, with the reward columns, shuffled by the run's seed;
- the config's rule rewards and weights, called as lit_rlft calls them (``fn(completions, **columns)``);
- B prompts x G completions per step, one generation batch per optimizer step, the sampling settings, the optimizer
  (AdamW, learning rate, betas, weight decay, warm-up and schedule, clipping), ``num_iterations``, and every loss
  setting TRL names as lit_rlft does (:data:`LOSS_FIELDS`: ``loss_type``, ``epsilon``, ``beta``, ...); float32
  without autocast (TRL's ``bf16=True`` default would autocast even on a CPU), as many steps as the budget allows.

The study's :class:`~lit_rlft.study.callback.StudyCallback` settings in the config (marks, output, evaluation seed)
are honoured the same way: the evaluator (:class:`~lit_rlft.study.evaluation.HeldOutEvaluator`, through a lit_rlft
step bound to TRL's model) at the start (shared when the probe matches) and after every step that crosses a mark;
per-step times from TRL's step begin to its step end (the clock starts at the first training step, evaluation
excluded); completions without reward spread from TRL's own ``frac_reward_zero_std``; TRL's logged scalars in
TensorBoard under ``<run>/tb``.

What lit_rlft offers and TRL does not (an inference engine other than HF generate, asynchronous rollouts,
environments, several mini-batches per generation batch, reward models through lit_rlft's runner) is refused before
anything runs, naming the option.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import transformers

from lit_rlft.records.jsonio import read_json, write_json, write_result
from lit_rlft.study.arm_main import arm_main
from lit_rlft.study.evaluation import HeldOutEvaluator, policy_probe

if TYPE_CHECKING:
    from lit_rlft.step.grpo import GRPOStep

__all__ = ["LOSS_FIELDS", "TRLArmError", "main", "trl_config_kwargs"]

#: ``GRPOLoss`` fields that TRL's ``GRPOConfig`` has under the same name and meaning, passed as they are.
LOSS_FIELDS = ("epsilon", "epsilon_high", "delta", "loss_type", "importance_sampling_level", "beta",
               "use_bias_correction_kl", "mask_truncated_completions", "sapo_temperature_neg", "sapo_temperature_pos",
               "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "top_entropy_quantile",
               "entropy_coef", "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",
               "entropy_target", "off_policy_mask_threshold")


class TRLArmError(ValueError):
    """A setting of the run config that TRL's trainer cannot reproduce (the message names it)."""


def refuse_unsupported(config: Any) -> None:
    """Raise :class:`TRLArmError` for what TRL's ``GRPOTrainer`` would run differently."""
    from lit_rlft.rollout.engines.hf import HFEngine

    o = config.optim
    if config.engine is not None and not isinstance(config.engine, HFEngine):
        raise TRLArmError(f"model.engine {type(config.engine).__name__}: the trl arm generates with HF generate "
                          "(TRL's use_vllm=False); give the HF engine")
    if config.asynchronous.depth:
        raise TRLArmError("model.asynchronous.depth > 0: TRL's GRPOTrainer generates synchronously")
    if config.environment is not None:
        raise TRLArmError("model.environment: the trl arm runs single-turn completions only")
    if o.num_mini_batches != 1:
        raise TRLArmError(f"model.optim.num_mini_batches {o.num_mini_batches}: the trl arm makes one optimizer step "
                          "per generation batch")


def trl_config_kwargs(config: Any, batch_size: int, max_steps: int, seed: int, out: Path,
                      cuda: bool) -> dict[str, Any]:
    """TRL ``GRPOConfig`` arguments equal to lit_rlft's ``GRPOConfig`` (see the module docstring)."""
    g, o, loss = config.generation, config.optim, config.loss
    G = g.num_generations
    kwargs: dict[str, Any] = dict(
        output_dir=str(out / "trl"), per_device_train_batch_size=batch_size * G, gradient_accumulation_steps=1,
        num_generations=G, max_completion_length=g.max_completion_length, temperature=g.temperature,
        top_p=g.top_p, top_k=g.top_k, learning_rate=o.learning_rate, adam_beta1=o.adam_betas[0],
        adam_beta2=o.adam_betas[1], weight_decay=o.weight_decay, optim="adamw_torch",
        lr_scheduler_type="constant_with_warmup" if o.lr_scheduler == "constant" else "cosine",
        warmup_steps=o.warmup_steps, max_grad_norm=o.max_grad_norm, num_iterations=o.num_iterations,
        scale_rewards=config.scale_rewards, reward_weights=config.reward_weights, use_vllm=False,
        shuffle_dataset=True, seed=seed, data_seed=seed, report_to=[], logging_steps=1, max_steps=max_steps,
        use_cpu=not cuda, gradient_checkpointing=o.gradient_checkpointing, save_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True, bf16=False, fp16=False,
    )
    kwargs.update({name: getattr(loss, name) for name in LOSS_FIELDS})
    return kwargs


#: Keyword arguments TRL passes reward functions itself: lit_rlft's columns of these names travel renamed.
TRL_REWARD_ARGS = frozenset({"prompt", "prompts", "completions", "completion_ids", "trainer_state", "log_extra",
                             "log_metric", "environments"})


def dataset_column(name: str) -> str:
    """The TRL data set column that carries lit_rlft's reward column ``name``."""
    return f"lit_rlft_{name}" if name in TRL_REWARD_ARGS else name


def _reward_funcs(scorer: Any, columns: list[str]) -> list[Any]:
    """The config's rule rewards in TRL's convention (``fn(completions, **dataset columns)``), each given lit_rlft's
    columns under their own names."""
    funcs, names = getattr(scorer, "funcs", None), getattr(scorer, "names", None)
    if funcs is None or getattr(scorer, "batched", []):
        raise TRLArmError("model.reward_funcs: the trl arm passes rule rewards (callables) to TRL; reward models and "
                          "judges are not supported there")
    out = []
    for fn, name in zip(funcs, names):
        def call(completions: list[str], _fn: Any = fn, **kwargs: Any) -> list[float | None]:
            return list(_fn(completions, **{k: kwargs[dataset_column(k)] for k in columns}))

        call.__name__ = name
        out.append(call)
    return out


def _study_callback(trainer: Any) -> Any:
    from lit_rlft.study.callback import StudyCallback

    found = [c for c in trainer.callbacks if isinstance(c, StudyCallback)]
    if not found:
        raise TRLArmError("the config has no lit_rlft.study.StudyCallback: the trl arm runs a study's composed config")
    return found[0]


def run(config_path: str) -> dict[str, Any]:
    """Train TRL's ``GRPOTrainer`` on the composed run config and write the StudyCallback's measurements file."""
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from lit_rlft.callbacks import RolloutBudgetStop
    from lit_rlft.cli.lightning_cli import grpo_cli
    from lit_rlft.models.loading import build_policy
    from lit_rlft.step.builder import build_step
    from lit_rlft.step.config import AsyncConfig

    cli = grpo_cli(["--config", config_path], run=False)
    module, dm, trainer_cfg = cli.model, cli.datamodule, cli.trainer
    config = module.config
    refuse_unsupported(config)
    study = _study_callback(trainer_cfg)
    budget = next((c.max_completions for c in trainer_cfg.callbacks if isinstance(c, RolloutBudgetStop)), None)
    if budget is None:
        raise TRLArmError("the config has no RolloutBudgetStop: the study sets the budget")
    seed = int(config.generation.seed or 0)
    transformers.set_seed(seed)
    run_dir = Path(study.out).parent
    cuda = torch.cuda.is_available() and trainer_cfg.accelerator.__class__.__name__ != "CPUAccelerator"

    # the evaluation step: lit_rlft's own, in process, on the HF engine, bound to TRL's model below
    eval_config = dataclasses.replace(config, engine=None, asynchronous=AsyncConfig())
    step = build_step(eval_config, models=False)
    dm.setup("fit")
    step.bind(dm)
    tok = step.tokenizer
    ids = dm.pool("train").ids
    texts = dm.prompt_texts(ids)
    special = not dm.render["chat_template"]
    if not all(tok(t, add_special_tokens=special)["input_ids"] == list(p) for t, p in zip(texts, dm.prompt_tokens(ids))):
        raise TRLArmError("TRL's tokenizer does not give lit_rlft's prompt tokens: the comparison would not be fair")
    columns = dm.reward_columns(ids)
    names = sorted(columns)
    dataset = datasets.Dataset.from_list([{"prompt": t, **{dataset_column(k): columns[k][i] for k in names}}
                                          for i, t in enumerate(texts)])
    B, G = dm.batch_size, config.generation.num_generations
    iterations = config.optim.num_iterations
    steps = math.ceil(budget / (B * G)) * iterations
    policy, _ = build_policy(config.model, config.dtype, config.tiny, config.lora,
                             gradient_checkpointing=config.optim.gradient_checkpointing)
    args = GRPOConfig(**trl_config_kwargs(config, B, steps, seed, run_dir, cuda))
    trainer = GRPOTrainer(model=policy, reward_funcs=_reward_funcs(step.scorer, names), args=args,
                          train_dataset=dataset, processing_class=tok)
    trainer.remove_callback(transformers.PrinterCallback)
    if trainer.accelerator.mixed_precision != "no":
        raise TRLArmError(f"TRL would train under {trainer.accelerator.mixed_precision} autocast")
    step.attach(trainer.model)
    measure = _Measure(study, step, B * G, iterations, run_dir)
    trainer.add_callback(measure)
    measure.start()
    trainer.train()
    measure.finish()
    return read_json(study.out) or {}


class _Measure(transformers.TrainerCallback):
    """The StudyCallback's measurements for TRL's trainer. ``per_step``: completions per generation batch, generated
    every ``iterations`` optimizer steps (TRL's ``num_iterations``)."""

    def __init__(self, study: Any, step: GRPOStep, per_step: int, iterations: int, run_dir: Path):
        self.study, self.step, self.per_step, self.iterations = study, step, per_step, iterations
        self.evaluator = HeldOutEvaluator(study.settings)
        self.curve: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.train_s = self.eval_s = 0.0
        self.next = 0
        self.t_step: float | None = None
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tb"))

    # -- measuring -------------------------------------------------------------------------------------------------
    def _evaluate(self, global_step: int, start: bool = False) -> None:
        t0 = time.perf_counter()
        self.step.rollout_step = global_step
        point: dict[str, Any] = {"step": global_step, "completions": self.completions(global_step),
                                 "wall_s": self.train_s}
        cached = read_json(self.study.start_cache) if start and self.study.start_cache else None
        if (cached and cached.get("settings") == self.study.settings.key()
                and cached.get("probe") == policy_probe(self.step)):
            point.update(cached["metrics"], shared_start=True)
        else:
            metrics = self.evaluator.measure(self.step)
            point.update(metrics)
            if start and self.study.start_cache and not Path(self.study.start_cache).exists():
                write_json(self.study.start_cache, {"probe": policy_probe(self.step),
                                                    "settings": self.study.settings.key(), "metrics": metrics})
        point["eval_s"] = time.perf_counter() - t0
        self.eval_s += point["eval_s"]
        self.curve.append(point)
        for key, value in point.items():
            if key.startswith("val/") or key.startswith("train_pool_reward"):
                self.writer.add_scalar(key, value, global_step)
        self._write(finished=False)

    def completions(self, global_step: int) -> int:
        """Completions generated by the end of optimizer step ``global_step``."""
        return math.ceil(global_step / self.iterations) * self.per_step

    def _write(self, finished: bool) -> None:
        completions = self.completions(self.curve[-1]["step"] if self.curve else 0)
        write_result(self.study.out, {
            "curve": self.curve, "steps": self.steps, "finished": finished,
            "rollout_steps": self.curve[-1]["step"] if self.curve else 0,
            "budget": {"completions": completions, "by_purpose": {"train": completions}},
            "timings": {"train_wall_s": self.train_s, "eval_s": self.eval_s}})

    def start(self) -> None:
        self._evaluate(0, start=True)

    def finish(self) -> None:
        last = self.steps[-1]["step"] + 1 if self.steps else 0
        if not self.curve or self.curve[-1]["step"] != last:
            self._evaluate(last)
        self.writer.close()
        self._write(finished=True)

    # -- TRL's hooks -----------------------------------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.t_step = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        seconds = time.perf_counter() - (self.t_step or time.perf_counter())
        self.train_s += seconds
        done = self.completions(state.global_step)
        fresh = self.per_step if (state.global_step - 1) % self.iterations == 0 else 0
        self.steps.append({"step": state.global_step - 1, "completions": done, "step_s": seconds,
                           "zero_spread_completions": None if fresh else 0, "fresh_completions": fresh})
        self.writer.add_scalar("time/step_s", seconds, state.global_step - 1)
        self.writer.add_scalar("budget/completions", done, state.global_step - 1)
        crossed = False
        while self.next < len(self.study.marks) and done >= self.study.marks[self.next]:
            self.next, crossed = self.next + 1, True
        if crossed:
            self._evaluate(state.global_step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        for key, value in logs.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, state.global_step - 1)
        flat = logs.get("frac_reward_zero_std")
        if flat is not None and self.steps and self.steps[-1]["zero_spread_completions"] is None:
            self.steps[-1]["zero_spread_completions"] = round(float(flat) * self.per_step)


def main(argv: list[str] | None = None) -> int:
    return arm_main("lit_rlft.study.trl_arm", __doc__, lambda config, _: run(config), TRLArmError, argv)


if __name__ == "__main__":
    sys.exit(main())

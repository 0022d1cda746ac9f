"""One run of the study: train one strategy on one pool with one seed under the rollout budget, write its JSON.

    python -m benchmarks.study.run_one --config <out>/study_config.json --strategy dps --pool-size 4000 --seed 0 \
        --warm-start runs/sft/model --out-dir <out>

Writes ``<out>/runs/<strategy>-pool<N>-seed<S>.json`` atomically, also when the run fails (``status: failed``
with the traceback), and keeps its TensorBoard events under ``<out>/work/<name>/``. The JSON records the strategy's
callbacks with every argument they ran with (``callbacks``, from :func:`~benchmarks.study.strategies.strategy_settings`).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.study.config import RunSpec, StudyConfig
from benchmarks.study.jsonio import read_json, write_json
from benchmarks.study.strategies import SELECTION_NAME, settings_match, strategy_settings

#: Per-step TensorBoard series kept in the run's JSON: exact tags, then tag prefixes.
SERIES_TAGS = ("effective_ratio", "reward", "time/step_s", "time/generation_s", "budget/completions",
               "dots/pearson", "dots/reference_pearson", "dps/accuracy", "dps/cold_start_pearson",
               "dps/cold_start_reference_pearson", "frac_reward_zero_std")
SERIES_PREFIXES = ("replay/", "dynamic_sampling/", "budget/completions_", "composition/", "greso/", "mopps/",
                   "screening/", "sequential/", "allocation/", "handback/")


def run_json_path(out_dir: str | Path, spec: RunSpec) -> Path:
    return Path(out_dir) / "runs" / f"{spec.name}.json"


def is_finished(path: Path, fingerprint: str, callbacks: list[dict[str, Any]] | None = None) -> bool:
    """A run is reused when its JSON says ``ok`` and was made with the same run settings (``fingerprint``) and, when
    ``callbacks`` is given, with these callback settings (see :func:`benchmarks.study.study.retire_stale_runs`)."""
    data = read_json(path)
    return (bool(data) and data.get("status") == "ok" and data.get("fingerprint") == fingerprint
            and (callbacks is None or settings_match(data.get("callbacks"), callbacks)))


def select_series(scalars: dict[str, list[tuple[int, float]]], strategy: str) -> dict[str, list[list[float]]]:
    """The per-step series the study keeps, as ``{tag: [[step, value], ...]}``."""
    name = SELECTION_NAME[strategy]
    tags = set(SERIES_TAGS)
    if name:
        tags |= {f"{name}/overhead_s", f"{name}/reference_generation_s", f"{name}/effective_ratio"}
    keep = {t for t in scalars if t in tags or t.startswith(SERIES_PREFIXES)}
    return {t: [[int(s), float(v)] for s, v in scalars[t]] for t in sorted(keep)}


def _reward(reward: str | None) -> Any:
    """The training reward: the Countdown rule, or a learned reward model (a directory: its probability of
    "correct"). The held-out evaluation always uses the rule."""
    if not reward:
        return "lit_rlft.rewards.countdown_reward"
    from lit_rlft.rewards import RewardModel

    return RewardModel(reward, sigmoid=True, max_batch_tokens=8192, device="cpu")


def train(cfg: StudyConfig, spec: RunSpec, warm_start: str, out_dir: Path) -> dict[str, Any]:
    """Train one run and return its record (curves, series, timings)."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger

    from benchmarks.study.evaluation import EvalCallback
    from benchmarks.study.strategies import strategy_callbacks
    from benchmarks.study.tasks import datamodule, train_subset_ids
    from lit_rlft import GenerationConfig, GRPOLoss, GRPOModule, OptimConfig
    from lit_rlft.callbacks import BatchCompositionLogger, RolloutBudgetStop
    from lit_rlft.models.tiny import TinyConfig
    from lit_rlft.reporting import read_scalars

    torch.set_num_threads(cfg.threads)
    work = out_dir / "work" / spec.name
    shutil.rmtree(work, ignore_errors=True)  # stale events of an interrupted attempt would mix into the series
    L.seed_everything(spec.seed, verbose=False)
    module = GRPOModule(
        model=warm_start, tiny=TinyConfig(**(cfg.tiny or {})) if warm_start == "tiny" else None,
        reward_funcs=[_reward(cfg.reward)], scale_rewards=cfg.scale_rewards,
        generation=GenerationConfig(num_generations=cfg.num_generations, temperature=cfg.temperature,
                                    max_completion_length=cfg.max_completion_length,
                                    eval_num_generations=cfg.eval_num_generations, seed=spec.seed,
                                    async_depth=cfg.async_depth, async_threads=1),
        loss=GRPOLoss(loss_type=cfg.loss_type, epsilon=cfg.epsilon, beta=0.0),
        optim=OptimConfig(learning_rate=cfg.learning_rate, adam_betas=tuple(cfg.adam_betas),
                          warmup_steps=cfg.warmup_steps, max_grad_norm=cfg.max_grad_norm),
    )
    dm = datamodule(cfg, spec.pool_size, spec.seed)
    evaluator = EvalCallback(cfg.eval_marks(), train_subset_ids(cfg, spec.pool_size), cfg.eval_num_generations,
                             cfg.train_subset_generations, cfg.learnable_buckets, cfg.generation_chunk)
    callbacks = [*strategy_callbacks(spec.strategy, cfg, spec.seed, str(out_dir / "cache" / "embeddings")),
                 BatchCompositionLogger("difficulty"), RolloutBudgetStop(cfg.budget_completions), evaluator]
    step_completions = cfg.batch_size * cfg.num_generations
    max_steps = cfg.max_steps_factor * math.ceil(cfg.budget_completions / step_completions) + 10
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=TensorBoardLogger(str(work), name="tb", version=""),
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=str(work), callbacks=callbacks,
    )
    evaluator.start()
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    fit_s = time.perf_counter() - t0
    scalars = read_scalars(work / "tb")
    return {
        "curve": evaluator.curve,
        "series": select_series(scalars, spec.strategy),
        "eval_counts": evaluator.eval_counts,
        "steps": int(module.grpo.rollout_step),
        "budget": module.grpo.budget.state_dict(),
        "timings": {"fit_s": fit_s, "eval_s": evaluator.eval_s,
                    "train_wall_s": evaluator.curve[-1]["wall_s"] if evaluator.curve else None},
        "max_steps": max_steps,
        "selection_name": SELECTION_NAME[spec.strategy],
    }


def run_and_write(cfg: StudyConfig, spec: RunSpec, warm_start: str, out_dir: str | Path) -> dict[str, Any]:
    """Run and write the JSON; a failure is written into the JSON (and returned), never raised."""
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    record: dict[str, Any] = {"run": spec.name, "strategy": spec.strategy, "pool_size": spec.pool_size,
                              "seed": spec.seed, "warm_start": warm_start, "fingerprint": cfg.run_fingerprint()}
    try:
        record["callbacks"] = strategy_settings(spec.strategy, cfg, spec.seed)
        record.update(train(cfg, spec, warm_start, out_dir))
        record["status"] = "ok"
    except Exception as exc:  # the study goes on; the failure is reported in results.md
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    record["total_s"] = time.perf_counter() - t0
    write_json(run_json_path(out_dir, spec), record)
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="study_config.json written by the study")
    p.add_argument("--strategy", required=True)
    p.add_argument("--pool-size", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--warm-start", required=True, help="HF checkpoint directory or 'tiny'")
    p.add_argument("--out-dir", required=True)
    a = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = StudyConfig.from_dict(read_json(a.config) or {})
    record = run_and_write(cfg, RunSpec(a.strategy, a.pool_size, a.seed), a.warm_start, a.out_dir)
    if record["status"] != "ok":
        print(record.get("traceback", record.get("error")), file=sys.stderr)
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())

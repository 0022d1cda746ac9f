"""Time and completions to TRL's accuracy: TRL's ``GRPOTrainer`` and lit_rlft trained on the same warm start, pool,
held-out set and settings, evaluated by the same evaluator at equal completion marks.

    .venv/bin/python -m benchmarks.time_to_trl --out runs/time_to_trl                      # the demo's pool
    .venv/bin/python -m benchmarks.time_to_trl --out runs/time_to_trl_skewed --skewed --pool-size 1000

Per seed, one after another on the same cores (one torch thread each):

- ``trl``: TRL's ``GRPOTrainer`` from the warm start, on the study's pool (every prompt as lit_rlft renders it, checked
  token for token against lit_rlft's prompt tokens), shuffled by the seed, with the study's settings (the demo's:
  B = 32 prompts x G = 8, temperature 1, 16 new tokens, the DAPO loss, lr 1e-4 with 20 warm-up steps, AdamW betas
  (0.9, 0.99), clipping 1.0, no KL), one optimizer step per generation batch, until the study's budget of
  completions;
- ``uniform``: lit_rlft's default (the study's ``uniform`` run);
- the recipes (``--recipe``, default ``dps_c8``: DPS ranking a fresh candidate set of 8 x B prompts each step, the
  strategy that beat uniform beyond the seed spread on the skewed 1,000-prompt pool; several may be given): the
  study's run of each.

Every run is evaluated by the study's :class:`~benchmarks.study.evaluation.EvalCallback` (its ``record``): held-out
accuracy (``val/accuracy/learnable``: 3 and 4 numbers) at the start and whenever cumulative completions cross one of
the study's marks, evaluation time left out of the training wall-clock (all selection overhead left in). Reported:
TRL's final learnable accuracy (mean over seeds) and, for each lit_rlft arm and seed, the completions and the
training wall-clock at which its curve first reaches it (linear interpolation between the evaluations around the
crossing; None when it never does), against TRL's own training wall-clock. Writes ``<out>/time_to_trl.json``
and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.study.config import STRATEGIES, RunSpec, StudyConfig  # noqa: E402
from benchmarks.study.stats import crossing, mean_interval  # noqa: E402

ACCURACY = "val/accuracy/learnable"


def trl_run(cfg: StudyConfig, pool_size: int, seed: int, warm_start: str, out: Path) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on the study's pool and settings, measured at the study's marks."""
    import datasets
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.study.evaluation import EvalCallback
    from benchmarks.study.tasks import datamodule, train_subset_ids
    from lit_rlft.models.loading import load_tokenizer_for
    from lit_rlft.rewards import countdown_reward
    from lit_rlft.rollout import HFEngine
    from lit_rlft.step.config import GenerationConfig
    from lit_rlft.step.config import GRPOConfig as LitConfig

    torch.set_num_threads(cfg.threads)
    tok = load_tokenizer_for(warm_start)
    dm = datamodule(cfg, pool_size, seed)
    dm.setup("fit")
    dm.set_tokenizer(tok)
    ids = dm.pool("train").ids
    texts = dm.prompt_texts(ids)
    same_tokens = all(tok(t, add_special_tokens=False)["input_ids"] == list(p)
                      for t, p in zip(texts, dm.prompt_tokens(ids)))
    if not same_tokens:
        raise RuntimeError("TRL's tokenizer does not give lit_rlft's prompt tokens: the comparison would not be fair")
    columns = dm.reward_columns(ids)
    dataset = datasets.Dataset.from_list([{"prompt": t, "nums": n, "target": g}
                                          for t, n, g in zip(texts, columns["nums"], columns["target"])])

    def countdown(completions: list[str], nums: list[Any], target: list[Any], **kwargs: Any) -> list[float]:
        return countdown_reward(completions, nums, target)

    countdown.__name__ = "countdown_reward"
    B, G = cfg.batch_size, cfg.num_generations
    generation = GenerationConfig(num_generations=G, temperature=cfg.temperature,
                                  max_completion_length=cfg.max_completion_length,
                                  eval_num_generations=cfg.eval_num_generations)
    evaluator = EvalCallback(cfg.eval_marks(), train_subset_ids(cfg, pool_size), cfg.eval_num_generations,
                             cfg.train_subset_generations, cfg.learnable_buckets, cfg.generation_chunk)
    threshold = LitConfig(reward_funcs=["lit_rlft.rewards.countdown_reward"]).success_threshold

    class Measure(transformers.TrainerCallback):
        """The study's evaluation of TRL's policy at the start and whenever completions cross a mark."""

        def __init__(self) -> None:
            self.next = 0

        def measure(self, model: Any, step: int) -> None:
            was_training = model.training
            engine = HFEngine.bound(model, tok)
            evaluator.record(engine, tok, dm, generation.eval_sampling, generation.sampling, threshold, step,
                             step * B * G)
            model.train(was_training)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            evaluator.start()
            self.measure(model, 0)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            done, crossed = state.global_step * B * G, False
            marks = evaluator.marks
            while self.next < len(marks) and done >= marks[self.next]:
                self.next, crossed = self.next + 1, True
            if crossed:
                self.measure(model, state.global_step)

    steps = -(-cfg.budget_completions // (B * G))
    config = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=B * G, gradient_accumulation_steps=1,
        num_generations=G, max_completion_length=cfg.max_completion_length, temperature=cfg.temperature, top_p=1.0,
        top_k=0, learning_rate=cfg.learning_rate, adam_beta1=cfg.adam_betas[0], adam_beta2=cfg.adam_betas[1],
        weight_decay=0.0, optim="adamw_torch", lr_scheduler_type="constant_with_warmup",
        warmup_steps=cfg.warmup_steps, max_grad_norm=cfg.max_grad_norm, beta=0.0, epsilon=cfg.epsilon,
        num_iterations=1, loss_type=cfg.loss_type, scale_rewards=cfg.scale_rewards, use_vllm=False,
        shuffle_dataset=True, seed=seed, data_seed=seed, report_to=[], logging_steps=10**6, max_steps=steps,
        use_cpu=True, gradient_checkpointing=False, save_strategy="no", dataloader_num_workers=0,
        disable_tqdm=True, bf16=False, fp16=False,  # TRL's GRPOConfig defaults to bf16=True: autocast, even on a CPU
    )
    model = AutoModelForCausalLM.from_pretrained(warm_start, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=[countdown], args=config, train_dataset=dataset,
                          processing_class=tok, callbacks=[Measure()])
    trainer.remove_callback(transformers.PrinterCallback)
    if trainer.accelerator.mixed_precision != "no":
        raise RuntimeError(f"TRL would train under {trainer.accelerator.mixed_precision} autocast; lit_rlft trains in "
                           "float32: the comparison would not be at equal precision")
    t0 = time.perf_counter()
    trainer.train()
    fit_s = time.perf_counter() - t0
    curve = evaluator.curve
    return {"run": f"trl-pool{pool_size}-seed{seed}", "seed": seed, "status": "ok", "curve": curve,
            "steps": steps, "same_prompt_tokens": same_tokens, "mixed_precision": trainer.accelerator.mixed_precision,
            "timings": {"fit_s": fit_s, "eval_s": evaluator.eval_s, "train_wall_s": curve[-1]["wall_s"]}}


def lit_run(cfg: StudyConfig, strategy: str, pool_size: int, seed: int, warm_start: str, out: Path) -> dict[str, Any]:
    """The study's run of ``strategy`` (reused when ``out`` holds it, made with these settings)."""
    from benchmarks.study.jsonio import read_json
    from benchmarks.study.run_one import is_finished, run_and_write, run_json_path

    spec = RunSpec(strategy, pool_size, seed)
    path = run_json_path(out, spec)
    if not is_finished(path, cfg.run_fingerprint()):
        run_and_write(cfg, spec, warm_start, out)
    record = read_json(path)
    if record.get("status") != "ok":
        raise RuntimeError(f"{spec.name} failed: {record.get('error')}")
    return record


def time_to(record: dict[str, Any], target: float) -> dict[str, float | None]:
    """Completions and training wall-clock at which ``record``'s curve first reaches ``target``."""
    curve = record["curve"]
    ys = [p[ACCURACY] for p in curve]
    return {"completions": crossing([p["completions"] for p in curve], ys, target),
            "wall_s": crossing([p["wall_s"] for p in curve], ys, target)}


def summarise(trl: list[dict[str, Any]], lit: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """TRL's final accuracy (mean over seeds) and each lit_rlft arm's cost to reach it, per seed, against TRL's."""
    target = statistics.mean(r["curve"][-1][ACCURACY] for r in trl)
    trl_wall = statistics.mean(r["timings"]["train_wall_s"] for r in trl)
    trl_completions = statistics.mean(r["curve"][-1]["completions"] for r in trl)
    arms: dict[str, Any] = {}
    for name, runs in lit.items():
        reached = [time_to(r, target) for r in runs]
        walls = [x["wall_s"] for x in reached if x["wall_s"] is not None]
        comps = [x["completions"] for x in reached if x["completions"] is not None]
        arms[name] = {
            "per_seed": [{"seed": r["seed"], "final_accuracy": r["curve"][-1][ACCURACY], **x}
                         for r, x in zip(runs, reached)],
            "reached": len(walls), "seeds": len(runs),
            "median_wall_s": statistics.median(walls) if walls else None,
            "median_completions": statistics.median(comps) if comps else None,
            "final_accuracy": statistics.mean(r["curve"][-1][ACCURACY] for r in runs),
            # the arm's final accuracy minus TRL's, paired by seed [95% t-interval]
            "final_diff_vs_trl": mean_interval([r["curve"][-1][ACCURACY] - t["curve"][-1][ACCURACY]
                                                for r, t in zip(runs, trl)]),
            "train_wall_s": statistics.mean(r["timings"]["train_wall_s"] for r in runs),
        }
        if arms[name]["median_wall_s"] is not None:
            arms[name]["wall_ratio_to_trl"] = arms[name]["median_wall_s"] / trl_wall if trl_wall else None
            arms[name]["completions_ratio_to_trl"] = (arms[name]["median_completions"] / trl_completions
                                                      if trl_completions else None)
    return {"trl_final_accuracy": target, "trl_train_wall_s": trl_wall, "trl_completions": trl_completions,
            "trl_final_accuracy_per_seed": [r["curve"][-1][ACCURACY] for r in trl], "arms": arms}


def table(summary: dict[str, Any]) -> str:
    per_seed = ", ".join(f"{a:.3f}" for a in summary["trl_final_accuracy_per_seed"])
    lines = [f"TRL's final held-out accuracy (3 and 4 numbers): {summary['trl_final_accuracy']:.3f} (per seed {per_seed}) "
             f"after {summary['trl_completions']:,.0f} completions and {summary['trl_train_wall_s']:.0f} s of training.", "",
             "| lit_rlft | final accuracy | minus TRL's (paired) | reached TRL's (seeds) | completions to it "
             "(x TRL's) | training wall-clock to it (x TRL's) | training wall-clock for the budget (x TRL's) |",
             "|---|---|---|---|---|---|---|"]
    trl_wall = summary["trl_train_wall_s"]
    for name, a in summary["arms"].items():
        comps = (f"{a['median_completions']:,.0f} ({a['completions_ratio_to_trl']:.2f}x)"
                 if a["median_completions"] is not None else "never")
        wall = (f"{a['median_wall_s']:.1f} s ({a['wall_ratio_to_trl']:.2f}x)" if a["median_wall_s"] is not None
                else "never")
        d = a["final_diff_vs_trl"]
        diff = (f"{d['mean']:+.3f}" + (f" [{d['low']:+.3f}, {d['high']:+.3f}]" if d["low"] is not None else ""))
        lines.append(f"| {name} | {a['final_accuracy']:.3f} | {diff} | {a['reached']}/{a['seeds']} | {comps} | {wall} "
                     f"| {a['train_wall_s']:.0f} s ({a['train_wall_s'] / trl_wall:.2f}x) |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the runs, the warm start and time_to_trl.json")
    p.add_argument("--pool-size", type=int, default=4000, help="the study's demo pool (about half a pass)")
    p.add_argument("--skewed", action="store_true", help="the study's skewed pool composition")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--recipe", nargs="+", default=["dps_c8"],
                   help="the lit_rlft strategies beside uniform (study strategies)")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="StudyConfig fields (JSON values)")
    return p.parse_args(argv)


def config(args: argparse.Namespace) -> StudyConfig:
    cfg = StudyConfig.skewed() if args.skewed else StudyConfig()
    for item in args.set:
        key, _, value = item.partition("=")
        if not hasattr(cfg, key):
            raise SystemExit(f"--set {item}: StudyConfig has no field {key!r}")
        setattr(cfg, key, json.loads(value))
    cfg.pool_sizes = [args.pool_size]
    unknown = [name for name in args.recipe if name not in STRATEGIES or name == "uniform"]
    if unknown:
        raise SystemExit(f"--recipe {' '.join(unknown)}: not a study strategy beside uniform; choose from "
                         f"{', '.join(s for s in STRATEGIES if s != 'uniform')}")
    return cfg


def main(argv: list[str] | None = None) -> int:
    from benchmarks.study.jsonio import write_json
    from benchmarks.study.warm_start import resolve_warm_start

    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cfg = config(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warm_start = resolve_warm_start(cfg, out, cfg.sft_threads)
    trl: list[dict[str, Any]] = []
    lit: dict[str, list[dict[str, Any]]] = {name: [] for name in ["uniform", *args.recipe]}
    for seed in args.seeds:
        path = out / "runs" / f"trl-pool{args.pool_size}-seed{seed}.json"
        record = json.loads(path.read_text()) if path.exists() else None
        if (record is None or record.get("fingerprint") != cfg.run_fingerprint()
                or record.get("mixed_precision") != "no"):  # records from before bf16=False are run again
            record = {**trl_run(cfg, args.pool_size, seed, warm_start, out), "fingerprint": cfg.run_fingerprint()}
            write_json(path, record)
        trl.append(record)
        for name in lit:
            lit[name].append(lit_run(cfg, name, args.pool_size, seed, warm_start, out))
        print(f"seed {seed}: TRL {trl[-1]['curve'][-1][ACCURACY]:.3f}, "
              + ", ".join(f"{n} {lit[n][-1]['curve'][-1][ACCURACY]:.3f}" for n in lit), flush=True)
    summary = summarise(trl, lit)
    result = {"command": "python -m benchmarks.time_to_trl " + " ".join(sys.argv[1:] if argv is None else argv),
              "config": cfg.to_dict(), "pool_size": args.pool_size, "seeds": args.seeds, "recipes": args.recipe,
              "warm_start": warm_start, "summary": summary, "table_markdown": table(summary)}
    write_json(out / "time_to_trl.json", result)
    print(result["table_markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

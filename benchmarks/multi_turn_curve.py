"""The multi-turn examples' learning curves on CPU with the tiny policy: the calculator on Countdown (tool calling)
and the guessing game (configs/envs/).

    .venv/bin/python -m benchmarks.multi_turn_curve --example calculator       # warm start, then GRPO
    .venv/bin/python -m benchmarks.multi_turn_curve --example guess_number
    .venv/bin/python -m benchmarks.multi_turn_curve --example calculator --sft-steps 3 --grpo-steps 2 --out /tmp/c

Steps (the warm start is skipped when ``<out>/sft/model`` exists, e.g. after an interrupted run):
1. the warm start (the example's ``sft_*.yaml``): the call format and when to answer (calculator, continuing from
   the Countdown warm start ``configs/sft_countdown_tiny.yaml``, trained into ``<out>/base/model`` unless
   ``--base-model`` names one), or the format and the rules of the game (a random guess among the numbers still
   possible);
2. held-out accuracy of the warm start (``val/accuracy``: Countdown problems of 3 and 4 numbers solved, or games won
   within 4 turns), GRPO with the environment (the example's config), held-out accuracy again;
3. ``benchmarks/results/multi_turn_curve_<example>.json`` and ``docs/results/multi_turn_curve_<example>.png``:
   held-out accuracy, the training reward, tool calls and turns per episode against episodes generated (written only
   for a full run, not with the smoke options); for the calculator also the Countdown warm start answering without
   the tool on the same held-out set (``no_tool_reference``), the line the tool has to beat.

Guessing game: a random consistent guesser wins about half the games of 1..16 in 4 turns; bisection wins 15 of 16.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "envs"
RESULTS = REPO / "benchmarks" / "results"
FIGURES = REPO / "docs" / "results"

EXAMPLES = {
    "calculator": {"base": "sft_countdown_tiny.yaml", "sft": "sft_calculator_countdown_tiny.yaml",
                   "grpo": "calculator_countdown_tiny.yaml",
                   "accuracy": "held-out Countdown (3-4 numbers) solved",
                   "title": "Countdown with a calculator tool (3 calls and an answer), tiny policy, GRPO on CPU"},
    "guess_number": {"sft": "sft_guess_number_tiny.yaml", "grpo": "guess_number_tiny.yaml",
                     "accuracy": "held-out games won (4 turns)",
                     "title": "Guessing game (1..16, 4 turns), tiny policy, GRPO on CPU"},
}
CURVES = ("val/accuracy", "reward", "episodes/turns_mean", "episodes/tool_calls_mean", "episodes/tool_failure_rate",
          "episodes/ended_by_env", "budget/completions", "time/step_s")


def run(example: str, out: Path, threads: int, sft_steps: int | None, grpo_steps: int | None,
        base_model: Path | None = None) -> dict:
    from lit_rlft.cli.demo import warm_start_then_grpo
    from lit_rlft.records import read_scalars

    spec = EXAMPLES[example]
    sft_overrides: list[str] = []
    if "base" in spec:  # the calculator warm start continues from the Countdown one
        base_model = _base_model(spec, out, base_model, sft_steps)
        sft_overrides = ["--model.model", str(base_model)]
    cli, before, after, timings = warm_start_then_grpo(out, CONFIGS / spec["sft"], CONFIGS / spec["grpo"], "curve",
                                                       threads, sft_steps, grpo_steps, sft_overrides=sft_overrides)
    scalars = read_scalars(out / "grpo" / "tb" / "curve")
    step = cli.model.grpo
    result = {"example": example, "before": before, "after": after, "steps": step.rollout_step,
              "budget": step.budget.state_dict(), **timings, "threads": threads,
              "curves": {k: scalars.get(k, []) for k in CURVES}}
    if "base" in spec:
        result["base_model"], result["no_tool_reference"] = str(base_model), no_tool_reference(base_model)
    return result


def _base_model(spec: dict, out: Path, base_model: Path | None, sft_steps: int | None) -> Path:
    """The example's base warm start: ``base_model`` when given, else ``<out>/base/model``, trained when missing."""
    from lit_rlft.cli import sft_cli

    if base_model is not None:
        return base_model
    base_model = out / "base" / "model"
    if not (base_model / "config.json").exists():
        args = ["--config", str(REPO / "configs" / spec["base"]), "--model.output_dir", str(base_model),
                "--trainer.default_root_dir", str(out / "base"), "--trainer.logger.init_args.save_dir",
                str(out / "base")]
        sft_cli([*args, *(["--trainer.max_steps", str(sft_steps)] if sft_steps else [])])
    return base_model


def no_tool_reference(base_model: Path) -> dict[str, float]:
    """The Countdown warm start answering directly (no tool, single turn) on the calculator run's held-out set, at
    its evaluation temperature and samples: what the tool has to beat."""
    import yaml

    from lit_rlft.cli import grpo_cli

    config = yaml.safe_load((CONFIGS / EXAMPLES["calculator"]["grpo"]).read_text())
    gen, val = config["model"]["generation"], config["data"]["val"]["init_args"]
    args = ["--config", str(REPO / "configs" / "countdown_tiny.yaml"), "--model.model", str(base_model),
            "--model.generation.temperature", str(gen.get("eval_temperature") or gen["temperature"]),
            "--model.generation.eval_num_generations", str(gen["eval_num_generations"]),
            "--data.val.init_args", json.dumps(val), "--data.val_batch_size", str(config["data"]["val_batch_size"]),
            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    cli = grpo_cli(args, run=False)
    cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
    return dict(cli.model.last_eval)


def plot(result: dict, path: Path) -> Path:
    from lit_rlft.records import pyplot

    plt = pyplot()
    spec, curves = EXAMPLES[result["example"]], result["curves"]
    completions = dict(curves["budget/completions"])

    def xs(points):
        return [completions.get(s, s) for s, _ in points]

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    total = result["budget"]["completions"]  # the evaluation after the last step
    val = [(completions.get(s, total if s >= result["steps"] else s), v) for s, v in curves["val/accuracy"]]
    axes[0].plot([c for c, _ in val], [v for _, v in val], marker="o", label=spec["accuracy"])
    reference = result.get("no_tool_reference", {}).get("val/accuracy")
    if reference is not None:
        axes[0].axhline(reference, color="grey", linestyle="--", label="Countdown warm start, no tool")
    axes[0].plot(xs(curves["reward"]), [v for _, v in curves["reward"]], alpha=0.4, label="training reward")
    axes[0].set_xlabel("episodes generated")
    axes[0].set_ylim(0, 1)
    axes[0].legend()
    for key, label in (("episodes/turns_mean", "turns per episode"), ("episodes/tool_calls_mean", "tool calls per episode")):
        if curves.get(key) and any(v for _, v in curves[key]):
            axes[1].plot(xs(curves[key]), [v for _, v in curves[key]], label=label)
    axes[1].set_xlabel("episodes generated")
    axes[1].set_ylim(bottom=0)
    axes[1].legend()
    fig.suptitle(spec["title"])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--example", choices=sorted(EXAMPLES), default="calculator")
    p.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<example>_curve)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=None, help="override the warm start's max_steps (smoke runs)")
    p.add_argument("--grpo-steps", type=int, default=None, help="override GRPO's max_steps (smoke runs)")
    p.add_argument("--base-model", type=Path, default=None,
                   help="calculator: the Countdown warm start (default: <out>/base/model, trained when missing)")
    p.add_argument("--replot", action="store_true",
                   help="re-plot the example's results file; adds the no-tool reference when missing (--base-model)")
    a = p.parse_args()
    from lit_rlft.records.jsonio import write_result

    out = a.out or Path("runs") / f"{a.example}_curve"
    path = RESULTS / f"multi_turn_curve_{a.example}.json"
    if a.replot:
        result = json.loads(path.read_text())
        if "base" in EXAMPLES[a.example] and "no_tool_reference" not in result:
            result["base_model"] = str(a.base_model or out / "base" / "model")
            result["no_tool_reference"] = no_tool_reference(Path(result["base_model"]))
            write_result(path, result)  # an environment recorded with the curve is kept
        print(f"wrote {plot(result, FIGURES / f'multi_turn_curve_{a.example}.png')}")
        return
    result = run(a.example, out, a.threads, a.sft_steps, a.grpo_steps, a.base_model)
    before, after = result["before"].get("val/accuracy"), result["after"].get("val/accuracy")
    print(f"{a.example}: held-out accuracy {before:.3f} (warm start) -> {after:.3f} after {result['steps']} GRPO "
          f"steps, {result['budget']['completions']} episodes, {result['grpo_s']:.0f} s")
    if a.sft_steps is None and a.grpo_steps is None:
        write_result(path, result)
        print(f"wrote {path} and {plot(result, FIGURES / f'multi_turn_curve_{a.example}.png')}")
    else:
        print(f"smoke run: nothing written to the repository; the plot: {plot(result, out / 'curve.png')}")


if __name__ == "__main__":
    main()

"""``lit-rlft probe``: before any training, what would the config's groups teach? A sample of the training pool and of
the held-out set rolled out ``G`` times each under the config's policy and sampling, in minutes.

    lit-rlft probe --config run.yaml --prompts 64 --val-prompts 64 --out runs/probe

Writes ``probe.json`` (every group's figures, the summary, the verdict, the environment), ``probe.md`` and
``probe.png`` (the pass-rate histograms, and the share of mixed groups per task and difficulty), and prints the
verdict, e.g. "62% of training groups would give no gradient for the task at G = 8 (58% all wrong, 4% all right):
selection has little to pick from: make the pool easier, warm-start the model, or make G larger."

What it measures (:mod:`~lit_rlft.study.probe_stats`): each prompt's pass rate (completions whose reward reaches
``model.success_threshold``), the share of groups with mixed correctness (what selection picks, what GRPO learns the
task from), the share with any reward spread (a format reward's included), the share of completions in the answer
format (from the config's format reward: a reward function with ``is_format_reward``, e.g.
:class:`~lit_rlft.rewards.AnswerFormatReward` or ``gsm8k_format_reward``, or ``--format-reward``), per task
(``task`` column) and difficulty (``difficulty`` column), and the generation's time per completion (to size a study).
Sampling is seeded (``--seed``): the same config and seed give the same figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lit_rlft.records.environment import environment
from lit_rlft.records.jsonio import write_result
from lit_rlft.rewards.runner import RewardRunner
from lit_rlft.step.builder import build_models
from lit_rlft.step.context import PromptData
from lit_rlft.step.seeding import StepSeeds
from lit_rlft.study.compose import build_cli, load_config
from lit_rlft.study.evaluation import StudyContext
from lit_rlft.study.plots import plot_probe
from lit_rlft.study.probe_stats import ProbeRow, summarise_probe, verdict

__all__ = ["ProbeError", "ProbeSettings", "probe_markdown", "probe_rows", "run_probe"]

#: Where the probe's sampling seeds start (clear of the step's and the evaluation's salts).
PROBE_SALT = 5_000_000


class ProbeError(ValueError):
    """A probe that cannot run: the message names the option or key to change."""


@dataclass
class ProbeSettings:
    """What a probe rolls out.

    Attributes:
        configs: the run config file(s), merged in order (a ``lit-rlft fit`` config).
        prompts: training-pool prompts sampled (at most the pool).
        val_prompts: held-out prompts sampled (``data.val``; at most the set; 0: none).
        num_generations: completions per prompt (None: the config's ``model.generation.num_generations``).
        seed: the sampling seed, and the seed of which prompts are sampled.
        out: the folder of ``probe.json``, ``probe.md`` and ``probe.png``.
        format_reward: a reward (dotted path) that says whether a completion is in the answer format (None: the
            config's own format reward, if it has one).
        batch_prompts: prompts per generation call (None: ``data.val_batch_size``).
    """

    configs: list[str]
    prompts: int = 64
    val_prompts: int = 64
    num_generations: int | None = None
    seed: int = 0
    out: str = "runs/probe"
    format_reward: str | None = None
    batch_prompts: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # recorded as is (e.g. the study that ran it)

    def __post_init__(self) -> None:
        self.configs = [str(c) for c in self.configs]
        for name in ("prompts", "val_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ProbeError(f"--{name.replace('_', '-')} must be an integer >= 0, got {value!r}")
        if self.prompts == 0 and self.val_prompts == 0:
            raise ProbeError("--prompts and --val-prompts are both 0: nothing to probe")
        if self.num_generations is not None and self.num_generations < 1:
            raise ProbeError(f"--num-generations must be >= 1, got {self.num_generations}")

    def key(self) -> dict[str, Any]:
        """What makes a probe what it is (a cache key with the config)."""
        out = dataclasses.asdict(self)
        out.pop("out")
        out.pop("extra")
        return out


def _sample(ids: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` of ``ids`` drawn without replacement with ``seed``, in pool order (all of them when fewer)."""
    ids = np.asarray(ids, dtype=np.int64)
    if n >= len(ids):
        return ids
    return np.sort(np.random.default_rng(seed).choice(ids, size=n, replace=False))


def _format_index(names: Sequence[str], funcs: Sequence[Any]) -> str | None:
    for name, fn in zip(names, funcs):
        if getattr(fn, "is_format_reward", False):
            return name
    return None


def probe_rows(step: StudyContext, data: PromptData, ids: np.ndarray, split: str, num_generations: int, batch: int,
               format_scorer: Any = None, progress: Any = None) -> tuple[list[ProbeRow], float]:
    """Roll out ``ids`` of ``split`` (``"train"`` or ``"val"``) ``num_generations`` times each at the config's
    training sampling, on the step's seeds (re-seeded per batch); the groups as :class:`ProbeRow` and the generation
    seconds."""
    funcs, names = getattr(step.scorer, "funcs", []), getattr(step.scorer, "names", [])
    format_name = _format_index(names, funcs) if format_scorer is None else None
    columns = data.reward_columns(ids, split)
    tasks, difficulty = columns.get("task"), columns.get("difficulty")
    rows: list[ProbeRow] = []
    seconds = 0.0
    salt = PROBE_SALT + (0 if split == "train" else 500_000)
    for i, start in enumerate(range(0, len(ids), batch)):
        part = ids[start:start + batch]
        step.rollouts.seeds.reseed(0, salt=salt + i, rank=0)
        roll, record = step.rollouts.rollout(part, step.rollout_step, purpose="eval", split=split,
                                             sampling=step.generation.sampling, num_generations=num_generations,
                                             pad=True)
        seconds += float(roll.generation_s)
        formatted: np.ndarray | None = None
        if format_name is not None:
            formatted = record.reward_per_func[format_name].numpy() > 0
        elif format_scorer is not None:
            texts = roll.completions
            cols = data.reward_columns(np.repeat(part, num_generations), split)
            formatted = np.asarray(format_scorer(texts, cols), dtype=np.float64).reshape(len(part), -1) > 0
        order = {int(p): k for k, p in enumerate(record.prompt_ids.tolist())}
        for j, pid in enumerate(part.tolist()):
            k = order[int(pid)]
            at = start + j
            rows.append(ProbeRow(split=split, task=str(tasks[at]) if tasks is not None else "",
                                 difficulty=str(difficulty[at]) if difficulty is not None else "",
                                 correct=record.correct[k].tolist(), rewards=record.rewards[k].tolist(),
                                 formatted=formatted[k].tolist() if formatted is not None else None))
        if progress is not None:
            progress.update(len(part))
    return rows, seconds


def _format_scorer(path: str | None) -> Any:
    if path is None:
        return None

    try:
        runner = RewardRunner([path], timeout_s=None)
    except (ImportError, ValueError, AttributeError) as e:
        raise ProbeError(f"--format-reward: {e}") from None

    def score(texts: list[str], columns: dict[str, Any]) -> list[float]:
        return runner(texts, columns).per_func[runner.names[0]].tolist()

    return score


def run_probe(settings: ProbeSettings, progress: bool = True, key: str | None = None) -> dict[str, Any]:
    """Roll out the probe's prompts (see the module docstring); writes and returns ``probe.json``'s content (``key``:
    recorded with it, a cache key of the caller's)."""

    t0 = time.perf_counter()
    try:
        base = load_config(settings.configs)
        cli = build_cli(base)
    except ValueError as e:  # ConfigError: the file, the key
        raise ProbeError(str(e)) from None
    module, data = cli.model, cli.datamodule
    step = module.grpo
    try:
        data.setup("fit")
        if settings.val_prompts and data.val_pool is None:
            raise ProbeError("the config has no held-out data (data.val): give it, or --val-prompts 0")
        step.attach(*build_models(module.config))
        step.bind(data)
        step.rollouts.seeds = StepSeeds(settings.seed)  # the probe's own seed, whatever the config's
        step.start()
        step.policy.eval()
        g = settings.num_generations or step.generation.num_generations
        batch = settings.batch_prompts or max(1, int(getattr(data, "val_batch_size", 32)))
        scorer = _format_scorer(settings.format_reward)
        plans = [("train", _sample(data.pool("train").ids, settings.prompts, settings.seed))]
        if settings.val_prompts:
            plans.append(("val", _sample(data.pool("val").ids, settings.val_prompts, settings.seed)))
        total = sum(len(ids) for _, ids in plans)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, desc=f"lit-rlft probe: prompts x {g}", unit="prompt")
        rows: list[ProbeRow] = []
        generation_s = 0.0
        import torch

        with torch.no_grad():
            for split, ids in plans:
                got, seconds = probe_rows(step, data, ids, split, g, batch, scorer, bar)
                rows += got
                generation_s += seconds
        if bar is not None:
            bar.close()
        has_format = settings.format_reward is not None or _format_index(step.scorer.names, step.scorer.funcs)
    finally:
        step.close()
    summary = summarise_probe(rows)
    completions = sum(len(r.correct) for r in rows)

    result = {
        "settings": {**dataclasses.asdict(settings)}, "key": key, "base_config": base, "summary": summary,
        "verdict": verdict(summary), "format_measured": bool(has_format),
        "rows": [dataclasses.asdict(r) for r in rows],
        "timings": {"probe_s": time.perf_counter() - t0, "generation_s": generation_s, "completions": completions,
                    "generation_s_per_completion": generation_s / completions if completions else None},
        "environment": environment(),
    }
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / "probe.json", result)
    (out / "probe.md").write_text(probe_markdown(result), encoding="utf-8")
    with contextlib.suppress(ImportError):  # matplotlib is optional: the JSON and the markdown say everything
        plot_probe(result, out / "probe.png")
    return result


def _p(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def probe_markdown(result: dict[str, Any], heading: str = "#") -> str:
    """The probe as markdown: the verdict, then a table per split and per group."""
    s = result["summary"]
    lines = [f"{heading} Probe: what the config's groups would teach", ""]
    lines += [" ".join(result["verdict"]), ""]
    t = result.get("timings") or {}
    if t.get("completions"):
        per = t.get("generation_s_per_completion")
        lines += [f"{t['completions']} completions in {t['probe_s']:.0f} s"
                  + (f" ({per:.2f} s of generation each)" if per is not None else "") + ".", ""]
    header = "| split / group | prompts | pass rate | mixed | all wrong | all right | reward spread | in format | " \
             "prompts with k = 0..G correct |"
    lines += [header, "|" + "---|" * 9]
    for split, fig in s["splits"].items():
        rows = [(f"**{split}**", fig)] + [(f"{split} {k}", v) for k, v in s["groups"].get(split, {}).items()
                                          if len(s["groups"][split]) > 1]
        for name, f in rows:
            lines.append(f"| {name} | {f['prompts']} | {f['pass_rate']:.2f} | {_p(f['mixed'])} | {_p(f['all_wrong'])} "
                         f"| {_p(f['all_right'])} | {_p(f['reward_spread'])} | {_p(f['format'])} | "
                         f"{' '.join(map(str, f['histogram']))} |")
    if not result.get("format_measured"):
        lines += ["", "The answer format is not measured: the config has no format reward (give --format-reward, e.g. "
                      "lit_rlft.rewards.AnswerFormatReward)."]
    return "\n".join(lines) + "\n"

"""A study end to end: check everything, plan the runs, run what is not finished, summarise, report.

    from lit_rlft.study import StudySettings, run_study
    study = run_study(StudySettings(configs=["my_run.yaml"], strategies=["uniform", "dps", "mopps"],
                                    seeds=[0, 1, 2], completions=40_000, eval_every=5_000, jobs=2,
                                    out="runs/study"))

Layout of ``out``::

    study.json  report.md  accuracy_vs_completions.png  accuracy_vs_time.png   the results (rebuilt every time)
    runs/<arm>-seed<s>.json                                                     each run's record (resume reads it)
    arms/<arm>-seed<s>/config.yaml  log.txt  tb/  measurements.json             each run: `lit-rlft fit --config
                                                                                 arms/<run>/config.yaml` redoes it
    start_eval.json                                                             the shared start evaluation

A run is reused when its record says ``ok`` and was made from the same run config (the user's files merged, the
arm's callbacks, the seed, the budget, the marks and the evaluation settings: :attr:`PlannedRun.fingerprint`);
anything else runs again, so a killed study resumes where it stopped and a changed config re-runs what it changes.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_rlft.records import read_scalars
from lit_rlft.records.environment import environment
from lit_rlft.records.jsonio import read_json, write_json, write_result
from lit_rlft.rewards.runner import RewardRunner
from lit_rlft.study.compose import (
    ConfigError,
    build_cli,
    dropped_callbacks,
    fingerprint,
    load_config,
    run_config,
    write_config,
)
from lit_rlft.study.overrides import apply_overrides, parse_override
from lit_rlft.study.probe import ProbeError, ProbeSettings, run_probe
from lit_rlft.study.report import write_outputs
from lit_rlft.study.runner import PlannedRun, execute, python_command
from lit_rlft.study.settings import TRL_ARM, StudySettings, arm_name
from lit_rlft.study.strategies import Arm, ArmError, CallbackSpec, resolve_arm
from lit_rlft.study.summary import summarise

__all__ = ["TRL_ARM", "StudyError", "StudySettings", "check", "plan", "rebuild_report", "run_study",
           "summarise_study"]

#: A run's checkpoint at its last mark (while it is unfinished) and the fingerprint it belongs to.
RESUME_CKPT, RESUME_KEY = "resume.ckpt", "resume.json"
#: Per-step TensorBoard series kept in a run's record: exact tags, then tag prefixes (and ``<selection>/...``).
SERIES_TAGS = ("effective_ratio", "reward", "time/step_s", "time/generation_s", "budget/completions",
               "dots/pearson", "dots/reference_pearson", "dps/accuracy", "dps/cold_start_pearson",
               "dps/cold_start_reference_pearson", "frac_reward_zero_std", "completions/mean_length",
               "completions/clipped_ratio")
SERIES_PREFIXES = ("replay/", "dynamic_sampling/", "budget/completions_", "composition/", "greso/", "mopps/",
                   "screening/", "sequential/", "allocation/", "handback/", "auto/", "rewards/")


class StudyError(ValueError):
    """A study that cannot start: the message names the option, file or value to change."""


def cores() -> int:
    """The cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# -- checks before any run ---------------------------------------------------------------------------------------
@dataclass
class Checked:
    """What :func:`check` found: the arms, the merged base config and the facts the plan needs."""

    arms: dict[str, Arm | None]  # name -> arm (None: the TRL arm)
    base: dict[str, Any]
    step_completions: int  # B x G: one uniform step
    optimizer_steps_per_step: int
    has_difficulty: bool
    dropped: list[str]


def _instantiate(config: dict[str, Any]) -> Any:
    """The run config through LightningCLI (:func:`~lit_rlft.study.compose.build_cli`); its error as a
    :class:`StudyError`."""
    try:
        return build_cli(config)
    except ConfigError as e:
        raise StudyError(str(e)) from None


def _check_rewards(scorer: Any, data: Any) -> None:
    """Each rule reward function of ``scorer`` (a ``RewardRunner``) scores the first held-out rows (their own answer
    as the completion, or an empty one): an error, or no score for any row, means it cannot score the held-out
    data."""
    funcs, names = getattr(scorer, "funcs", None), getattr(scorer, "names", None)
    if funcs is None:
        return
    ids = data.pool("val").ids[:8]
    columns = data.reward_columns(ids, "val")
    completions = [str(a) if a is not None else "" for a in columns.get("answer", [""] * len(ids))]
    batched = set(getattr(scorer, "batched", []))
    for i, (fn, name) in enumerate(zip(funcs, names)):
        if i in batched:  # reward models and judges score any text
            continue
        try:
            scores = list(fn(completions, **columns))
        except Exception as e:  # any failure here is the user's to see, named
            raise StudyError(f"reward {name!r} cannot score the held-out rows of data.val (columns "
                             f"{sorted(columns)}): {type(e).__name__}: {e}") from None
        if all(s is None for s in scores):
            raise StudyError(f"reward {name!r} gives no score for any of the first {len(ids)} held-out rows of "
                             f"data.val (columns {sorted(columns)}): check data.answer_field and the val file")


def _eval_scorer(settings: StudySettings) -> Any:
    """The evaluation's own reward runner (``--eval-reward``), or an error naming the reward that does not resolve."""

    try:
        return RewardRunner(list(settings.eval_reward))
    except (ImportError, ValueError, AttributeError) as e:
        raise StudyError(f"--eval-reward: {e}") from None


def check(settings: StudySettings) -> Checked:
    """Everything that can be checked before a run starts; raises :class:`StudyError` naming what to change."""
    if not settings.seeds:
        raise StudyError("--seeds: give at least one seed")
    if len(set(settings.seeds)) != len(settings.seeds):
        raise StudyError(f"--seeds {settings.seeds}: a seed is repeated")
    available = cores()
    if settings.jobs < 0 or settings.jobs > available:
        raise StudyError(f"--jobs {settings.jobs}: this machine has {available} cores; give 0 (in this process) to "
                         f"{available}")
    if settings.threads is not None and settings.threads < 1:
        raise StudyError(f"--threads {settings.threads}: give at least 1")
    if settings.threads is not None and max(1, settings.jobs) * settings.threads > available:
        print(f"lit-rlft study: warning: {max(1, settings.jobs)} run(s) x {settings.threads} threads on {available} "
              "cores: the runs compete for them, and their training times say so")
    if settings.eval_every is not None and not 0 < settings.eval_every <= settings.completions:
        raise StudyError(f"--eval-every {settings.eval_every}: give a number of completions between 1 and the budget "
                         f"({settings.completions})")
    arms: dict[str, Arm | None] = {}
    for text in [settings.baseline, *settings.strategies]:
        if text == TRL_ARM:
            _require_trl()
            arms[TRL_ARM] = None
            continue
        try:
            arm = resolve_arm(text)
        except ArmError as e:
            raise StudyError(f"--strategies: {e}") from None
        if arm.name in arms and arms[arm.name] != arm:
            raise StudyError(f"--strategies: two arms are named {arm.name!r} (rename one overlay file)")
        arms[arm.name] = arm
    try:
        arms, unused = apply_overrides(arms, [parse_override(text) for text in settings.overrides])
    except ArmError as e:
        raise StudyError(str(e)) from None
    for o in unused:
        print(f"lit-rlft study: warning: --set {o.text!r} changes no arm of this study ({', '.join(arms)})")
    try:
        base = load_config(settings.configs)
    except ConfigError as e:
        raise StudyError(str(e)) from None
    first = next(a for a in arms.values() if a is not None) if any(a is not None for a in arms.values()) else None
    probe = run_config(base, [s.config() for s in (first.specs(settings.seeds[0])
                                                   if first else [])], [], settings.seeds[0], "runs/study-check", 1)
    cli = _instantiate(probe)
    try:
        module, data = cli.model, cli.datamodule
        data.setup("fit")
        data.set_tokenizer(module.tokenizer)
        if data.val_pool is None:
            raise StudyError(f"the run config ({', '.join(settings.configs)}) has no held-out data: the study measures "
                             "held-out accuracy on data.val (give data.val, e.g. a test.jsonl, and data.val_size)")
        _check_rewards(module.grpo.scorer if not settings.eval_reward else _eval_scorer(settings), data)
        step_completions = data.batch_size * module.grpo.generation.num_generations
        if settings.completions < step_completions:
            raise StudyError(f"--completions {settings.completions} is less than one step: data.batch_size "
                             f"({data.batch_size}) x model.generation.num_generations "
                             f"({module.grpo.generation.num_generations}) = {step_completions}")
        optim = module.grpo.optim
        has_difficulty = "difficulty" in data.reward_columns(data.pool("train").ids[:1], "train")
    finally:
        cli.model.grpo.close()
    return Checked(arms=arms, base=base, step_completions=step_completions,
                   optimizer_steps_per_step=optim.num_iterations * optim.num_mini_batches,
                   has_difficulty=has_difficulty, dropped=dropped_callbacks(base))


def _require_trl() -> None:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise StudyError("the trl arm (--baseline trl) needs TRL: pip install 'lit_rlft[bench]'")


# -- the plan --------------------------------------------------------------------------------------------------------
def order(arms: list[str], seeds: list[int], seeds_of: Any = None) -> list[tuple[str, int]]:
    """``(arm, seed)`` in run order: seed by seed, the arms' order rotated by one at each seed, so that no arm always
    runs first (or beside the same arm) on a shared machine; ``seeds_of(arm)``: the seeds an arm runs (all)."""
    out = []
    for i, seed in enumerate(seeds):
        k = i % len(arms)
        out += [(a, seed) for a in arms[k:] + arms[:k] if seeds_of is None or seed in seeds_of(a)]
    return out


def _study_callbacks(settings: StudySettings, checked: Checked, run_dir: Path, out: Path) -> list[dict[str, Any]]:
    ev = settings.eval_settings
    entries: list[dict[str, Any]] = []
    if checked.has_difficulty:
        entries.append({"class_path": "lit_rlft.callbacks.BatchCompositionLogger",
                        "init_args": {"column": "difficulty"}})
    entries.append({"class_path": "lit_rlft.callbacks.RolloutBudgetStop",
                    "init_args": {"max_completions": settings.completions}})
    entries.append({"class_path": "lit_rlft.study.StudyCallback", "init_args": {
        "marks": settings.marks, "out": str(run_dir / "measurements.json"), "eval_seed": ev.seed,
        "train_subset": ev.train_subset, "train_generations": ev.train_generations, "groups": ev.groups,
        "start_cache": str(out / "start_eval.json"),
        **({"eval_reward_funcs": ev.reward_funcs} if ev.reward_funcs else {}),
        **({"checkpoint": str(run_dir / RESUME_CKPT)} if settings.checkpoints else {})}})
    return entries


def plan(settings: StudySettings, checked: Checked) -> list[PlannedRun]:
    """Every run of the study, its config written to ``<out>/arms/<run>/config.yaml``."""
    out = Path(settings.out)
    uniform_steps = math.ceil(settings.completions / checked.step_completions)
    max_steps = settings.max_steps_factor * uniform_steps * checked.optimizer_steps_per_step + 10
    runs = []
    for label, seed in order(settings.arm_names, settings.seeds, settings.seeds_of):
        arm = checked.arms[label]
        name = f"{label}-seed{seed}"
        run_dir = out / "arms" / name
        cache = str(out / "cache" / "embeddings")
        specs: list[CallbackSpec] = arm.specs(seed, cache) if arm is not None else []
        callbacks = [s.settings() for s in specs]
        study_callbacks = _study_callbacks(settings, checked, run_dir, out)
        config = run_config(checked.base, [s.config() for s in specs], study_callbacks, seed, run_dir, max_steps)
        key = fingerprint(checked.base, callbacks, seed, settings.completions, settings.marks,
                          settings.eval_settings.key(), label == TRL_ARM,
                          *([settings.loop] if settings.loop != "trainer" and label != TRL_ARM else []))
        config_path = write_config(config, run_dir / "config.yaml", header=(
            f"lit_rlft study run {name} (fingerprint {key}): the run config with the arm's callbacks and the study's\n"
            f"measurement. Redo it alone: lit-rlft fit --config {run_dir / 'config.yaml'}"))
        selection = arm.selection_name() if arm is not None else None
        info = {"callbacks": callbacks, "selection_name": selection, "config": str(config_path)}
        if label == TRL_ARM:
            command = python_command("-m", "lit_rlft.study.trl_arm", "--config", str(config_path))
            in_process = _trl_in_process(config_path)
        else:
            resume = resumable(run_dir, key)
            resume_args = ["--ckpt_path", str(resume)] if resume else []
            if settings.loop == "fabric":
                command = python_command("-m", "lit_rlft.study.fabric_arm", "--config", str(config_path), *resume_args)
                in_process = _fabric_in_process(config_path, resume)
            else:
                command = python_command("-m", "lit_rlft.cli", "fit", "--config", str(config_path), *resume_args)
                in_process = _fit_in_process(config_path, resume)
            info["resumed_from"] = str(resume) if resume else None
            write_json(run_dir / RESUME_KEY, {"fingerprint": key})
        runs.append(PlannedRun(name=name, arm=label, seed=seed, run_dir=run_dir,
                               record_path=out / "runs" / f"{name}.json", fingerprint=key, command=command,
                               in_process=in_process, collect=collect, info=info,
                               progress=_progress(run_dir / "progress.json", settings.completions)))
    return runs


def _progress(path: Path, budget: int) -> Any:
    """How far a running run is: the completions of its last step (``progress.json``) over the budget."""
    def fraction() -> float:
        return ((read_json(path) or {}).get("completions") or 0) / budget

    return fraction


def resumable(run_dir: Path, key: str) -> Path | None:
    """The checkpoint an unfinished run of fingerprint ``key`` left at its last mark, if any (one of another config is
    removed)."""
    ckpt, stamp = run_dir / RESUME_CKPT, read_json(run_dir / RESUME_KEY)
    if not ckpt.exists():
        return None
    if not stamp or stamp.get("fingerprint") != key:
        ckpt.unlink()
        return None
    return ckpt


def _fit_in_process(path: Path, resume: Path | None = None) -> Any:
    def fit() -> None:
        from lit_rlft.cli.lightning_cli import grpo_cli

        grpo_cli(["fit", "--config", str(path), *(["--ckpt_path", str(resume)] if resume else [])])

    return fit


def _fabric_in_process(path: Path, resume: Path | None = None) -> Any:
    def fit() -> None:

        from lit_rlft.study.fabric_arm import run  # not at the top: ``python -m lit_rlft.study.fabric_arm`` runs it

        run(str(path), str(resume) if resume else None)

    return fit


def _trl_in_process(path: Path) -> Any:
    def fit() -> None:
        from lit_rlft.study.trl_arm import main

        if main(["--config", str(path)]) != 0:
            raise RuntimeError("the TRL arm failed")

    return fit


def select_series(scalars: dict[str, list[tuple[int, float]]], selection: str | None) -> dict[str, list[list[float]]]:
    """The per-step series a run's record keeps, as ``{tag: [[step, value], ...]}``."""
    tags = set(SERIES_TAGS)
    if selection:
        tags |= {f"{selection}/overhead_s", f"{selection}/reference_generation_s", f"{selection}/effective_ratio"}
    keep = {t for t in scalars if t in tags or t.startswith(SERIES_PREFIXES)}
    return {t: [[int(s), float(v)] for s, v in scalars[t]] for t in sorted(keep)}


def collect(run: PlannedRun, rc: int | None, error: str | None, seconds: float) -> dict[str, Any]:
    """A run's record from its files: the measurements, the TensorBoard series, the status."""
    measured = read_json(run.run_dir / "measurements.json") or {}
    record: dict[str, Any] = {"run": run.name, "strategy": run.arm, "seed": run.seed, "fingerprint": run.fingerprint,
                              **run.info, "total_s": seconds}
    record.update(curve=measured.get("curve", []), step_log=measured.get("steps", []),
                  steps=measured.get("rollout_steps"), budget=measured.get("budget"),
                  timings=measured.get("timings"), environment=measured.get("environment"))
    tb = run.run_dir / "tb"
    if tb.exists():

        record["series"] = select_series(read_scalars(tb, latest=True), run.info.get("selection_name"))
    if rc == 0 and measured.get("finished"):
        record["status"] = "ok"
        (run.run_dir / RESUME_CKPT).unlink(missing_ok=True)  # finished: nothing to resume
    else:
        record["status"] = "failed"
        record["error"] = error or (f"exit code {rc}" if rc else "the run ended before its last measurement")
        log = run.log_path.read_text(errors="replace") if run.log_path.exists() else ""
        record["log_tail"] = log[-3000:]
    return record


# -- the whole study -------------------------------------------------------------------------------------------------
def summarise_study(settings: StudySettings, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The derived figures of a study's records (:func:`~lit_rlft.study.summary.summarise`)."""
    return summarise(runs, settings.arm_names, settings.confidence, settings.marks, settings.targets(),
                     baseline=arm_name(settings.baseline))


def run_study(settings: StudySettings, progress: bool = True) -> dict[str, Any]:
    """Check, plan, run what is not finished, and write ``study.json``, ``report.md`` and the figures; returns
    ``study.json``'s content."""

    t0 = time.perf_counter()
    checked = check(settings)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "settings.json", settings.to_dict())
    probe = study_probe(settings, checked, progress) if settings.probe else None
    planned = plan(settings, checked)

    def finished(run: PlannedRun) -> bool:
        record = read_json(run.record_path)
        return bool(record) and record.get("status") == "ok" and record.get("fingerprint") == run.fingerprint

    threads = settings.threads or max(1, cores() // max(1, settings.jobs))
    executed = execute(planned, settings.jobs, threads, finished, lambda run, rec: write_json(run.record_path, rec),
                       start_file=out / "start_eval.json", timeout_s=settings.run_timeout_s, progress=progress)
    records = [read_json(r.record_path) or {"run": r.name, "strategy": r.arm, "seed": r.seed, "status": "failed",
                                             "error": "no record"} for r in planned]
    study = {
        "settings": settings.to_dict(), "configs": settings.configs, "base_config": checked.base,
        "dropped_callbacks": checked.dropped, "marks": settings.marks, "step_completions": checked.step_completions,
        "threads": threads, "runs": records, "summary": summarise_study(settings, records),
        "probe": _probe_digest(probe),
        "timings": {"study_s": time.perf_counter() - t0, "runs_executed": executed["executed"],
                    "runs_reused": executed["reused"], "runs_total_s": sum(r.get("total_s") or 0 for r in records)},
        "environment": environment(),  # the report states it too
    }
    write_result(out / "study.json", study)
    write_outputs(study, out)
    return study


def _probe_digest(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    """What ``study.json`` keeps of the probe: its summary, verdict and timings (the groups stay in probe.json)."""
    if probe is None:
        return None
    return {k: probe.get(k) for k in ("summary", "verdict", "timings", "format_measured", "key")}


def study_probe(settings: StudySettings, checked: Checked, progress: bool = True) -> dict[str, Any]:
    """``lit-rlft probe`` on the study's config (:mod:`~lit_rlft.study.probe`), its prompts ``probe_prompts`` of the
    training pool and as many held-out ones, into ``<out>/probe``; a probe recorded there for the same config and
    settings is reused."""
    import gc


    out = Path(settings.out) / "probe"
    probe_settings = ProbeSettings(configs=list(settings.configs), prompts=settings.probe_prompts,
                                   val_prompts=settings.probe_prompts, seed=settings.eval_seed, out=str(out))
    key = fingerprint(checked.base, probe_settings.key())
    previous = read_json(out / "probe.json")
    if previous and previous.get("key") == key:
        return previous
    try:
        result = run_probe(probe_settings, progress=progress, key=key)
    except ProbeError as e:
        raise StudyError(f"the probe before the runs: {e} (or --no-probe)") from None
    gc.collect()  # the probe's policy: the runs are other processes
    return result


def rebuild_report(settings: StudySettings) -> dict[str, Any]:
    """``study.json`` and the report again from the run records under ``settings.out`` (nothing runs; runs of the
    settings' arms and seeds whose record is missing are reported as such)."""

    t0 = time.perf_counter()
    out = Path(settings.out)
    previous = read_json(out / "study.json") or {}
    records = []
    for arm, seed in order(settings.arm_names, settings.seeds, settings.seeds_of):
        name = f"{arm}-seed{seed}"
        records.append(read_json(out / "runs" / f"{name}.json")
                       or {"run": name, "strategy": arm, "seed": seed, "status": "failed", "error": "no record"})
    study = {**previous, "settings": settings.to_dict(), "configs": settings.configs, "marks": settings.marks,
             "runs": records, "summary": summarise_study(settings, records),
             "timings": {"study_s": time.perf_counter() - t0, "runs_executed": 0, "runs_reused": len(records),
                         "runs_total_s": sum(r.get("total_s") or 0 for r in records)}}
    write_result(out / "study.json", study)  # the earlier study.json's environment, the runs' own, is kept
    write_outputs(study, out)
    return study

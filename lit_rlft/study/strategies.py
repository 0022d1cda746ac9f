"""The study's arms: the shipped strategies (each a list of callbacks with its settings) and a user's own overlay
file of callbacks, and the settings every arm records.

Every shipped strategy is a list of :class:`CallbackSpec` (a callback class and the keyword arguments the study
passes, from :class:`StrategySettings`); :func:`strategy_callbacks` instantiates them and :func:`strategy_settings`
resolves them against the class's signature, defaults included. The settings are recorded in every run's JSON
(``callbacks``), a finished run is reused only while they still match, and the settings block of a report is
generated from them, never typed by hand. :func:`load_overlay` reads a user's YAML overlay (``trainer.callbacks``
as ``class_path`` / ``init_args``, as in ``configs/strategies/*.yaml``) into the same specs.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lit_rlft.callbacks import (
    AllocationCallback,
    BatchCompositionLogger,
    CompletionLogger,
    DifficultyPredictorConfig,
    DOTSCallback,
    DPSCallback,
    DynamicSamplingCallback,
    GRESOCallback,
    HistoryResamplingCallback,
    MoPPSCallback,
    ReplayCallback,
    RolloutHook,
    ScreeningCallback,
    SelectionCallback,
    SequentialSamplingCallback,
    UniformHandbackCallback,
)
from lit_rlft.runtime.imports import import_object

#: Every shipped strategy, in table order.
STRATEGIES: tuple[str, ...] = (
    "uniform", "dynamic_sampling", "history", "dots", "dots_replay", "dps", "dps_c8", "dps_replay", "dps_cold_start",
    "mopps", "greso", "screening", "sequential", "allocation_dps", "allocation_mopps", "allocation_dots",
    "allocation_dps_cold", "dps_content_prior", "allocation_dots_broad", "dps_c8_handback",
)


@dataclass
class StrategySettings:
    """The shipped strategies' settings (what :func:`strategy_specs` passes their callbacks; the rest are the
    callbacks' own defaults). The defaults are the reference codes' Countdown settings, the study's since issue 19."""

    dps_decay: float = 0.5
    dps_candidate_ratio: int = 8
    # MoPPS as its reference code's Countdown scripts (recipe/ours/scripts/countdown/cd_verl_*_topk_noinit.sh:
    # tasksampler.ts_ratio=8, tasksampler.bandit_decay_ratio=0.5); the callback's defaults (16, 1.0) are its MATH ones.
    mopps_candidate_ratio: int = 8
    mopps_decay: float = 0.5
    greso_target: float = 0.25
    dots_alpha: float = 0.5
    dots_tau: float = 1e-3
    reference_size: int = 32
    update_every: int = 4
    dots_online_steps: int = 20
    replay_delta: float = 0.5
    replay_capacity: int = 256
    dynamic_max_rounds: int = 10
    screening_generations: int = 2  # ScreeningCallback's initial_generations (of num_generations)
    screening_max_rounds: int = 4
    sequential_initial_generations: int = 2  # SequentialSamplingCallback: a first round of 2, then rounds of 2
    sequential_round_generations: int = 2
    sequential_max_generations: int = 8  # at most uniform's G per prompt
    allocation_min_generations: int = 2  # AllocationCallback: 2 to 16 per prompt, in steps of 2
    allocation_max_generations: int = 16
    allocation_budget_ratio: float = 1.0  # at most uniform's B x G per step
    allocation_granularity: int = 2
    allocation_min_gain: float = 0.01
    broad_dots_tau: float = 100.0  # allocation_dots_broad: DOTS' selection temperature, so high its choice is uniform
    # dps_c8_handback: the batch handed back to uniform sampling from 2 to 4 passes over the pool (where the
    # selectors' early lead over uniform ended in the pool-1,000 and pool-200 studies)
    handback_start_passes: float = 2.0
    handback_end_passes: float = 4.0
    content_prior_reference_size: int = 256  # dps_content_prior: the last 256 observed prompts (8 steps of B=32)

    @classmethod
    def of(cls, source: Any) -> StrategySettings:
        """The settings read from ``source``'s attributes of the same names (a config that holds them)."""
        return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(cls)})


#: The names of :class:`StrategySettings`' fields.
STRATEGY_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(StrategySettings))

#: The ``SelectionCallback.name`` each strategy logs its ``<name>/overhead_s`` under (None: no selection callback).
SELECTION_NAME: dict[str, str | None] = {
    "uniform": None, "dynamic_sampling": None, "history": "history", "dots": "dots", "dots_replay": "dots",
    "dps": "dps", "dps_c8": "dps", "dps_replay": "dps", "dps_cold_start": "dps", "mopps": "mopps", "greso": "greso",
    "screening": None, "sequential": None, "allocation_dps": "dps", "allocation_mopps": "mopps",
    "allocation_dots": "dots", "allocation_dps_cold": "dps", "dps_content_prior": "dps",
    "allocation_dots_broad": "dots", "dps_c8_handback": "dps",
}

#: Arguments that say where a run keeps files, not what it does: left out of the recorded settings.
LOCATION_ARGS = frozenset({"cache_dir"})
#: Where the DOTS embedding cache goes when the study does not say (relative to the run's folder).
CACHE_DIR = ".cache/lit_rlft/embeddings"

#: MoPPS' settings that are not :class:`StrategySettings` fields, as the MoPPS reference code's Countdown scripts run them
#: (thu-rllab/MoPPS ``recipe/ours/config/our_trainer.yaml``: ``bandit_target_mean: 0.5``, ``bandit_sample_strategy:
#: topk``; ``recipe/ours/mopps.py``: ``PosteriorSampler(prior_alpha=1.0, prior_beta=1.0)``). Passed explicitly so
#: that a change of the callback's defaults cannot change the study silently.
MOPPS_TARGET = 0.5
MOPPS_PRIOR = (1.0, 1.0)


#: Arguments added to a callback (or to its settings' dataclass) after runs were recorded, each with the value that
#: does what those runs did: a recorded run that lacks one matches a current setting at that value (so adding an
#: option does not re-run, or mark stale, every run recorded before it).
ADDED_LATER: dict[str, Any] = {"reference": "rollout"}


def settings_match(recorded: Any, now: Any) -> bool:
    """Whether recorded callback settings equal the current ones, arguments of :data:`ADDED_LATER` that the record
    lacks counting as their old-behaviour value."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        if set(recorded) - set(now):
            return False
        if any(k not in ADDED_LATER or now[k] != ADDED_LATER[k] for k in set(now) - set(recorded)):
            return False
        return all(settings_match(recorded[k], now[k]) for k in recorded)
    if isinstance(recorded, list) and isinstance(now, list):
        return len(recorded) == len(now) and all(settings_match(a, b) for a, b in zip(recorded, now))
    return recorded == now


@dataclass(frozen=True)
class CallbackSpec:
    """One callback of a strategy: its class and the keyword arguments the study passes (the rest are defaults)."""

    cls: type
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        return self.cls(**self.kwargs)

    def settings(self) -> dict[str, Any]:
        """``{"callback": class name, "args": every argument, defaults included}`` (JSON-ready; no file locations)."""
        return {"callback": self.cls.__name__, "args": resolved_arguments(self.cls, self.kwargs)}

    def config(self) -> dict[str, Any]:
        """The callback as a LightningCLI config entry: ``{"class_path": ..., "init_args": {...}}`` (the arguments the
        study passes; dataclass arguments as their fields)."""
        return {"class_path": public_path(self.cls), "init_args": {k: _config_value(v) for k, v in self.kwargs.items()}}

    @property
    def is_strategy(self) -> bool:
        """Whether the callback chooses or reshapes batches (a selection callback or a rollout hook)."""
        return is_strategy_callback(self.cls)


def public_path(cls: type) -> str:
    """The shortest dotted path that names ``cls`` below its top package (``lit_rlft.callbacks.DPSCallback`` rather
    than ``lit_rlft.callbacks.dps.DPSCallback``)."""
    import importlib

    parts = cls.__module__.split(".")
    for n in range(min(2, len(parts)), len(parts) + 1):
        module = ".".join(parts[:n])
        try:
            if getattr(importlib.import_module(module), cls.__qualname__, None) is cls:
                return f"{module}.{cls.__qualname__}"
        except ImportError:
            continue
    return f"{cls.__module__}.{cls.__qualname__}"


def is_strategy_callback(cls: type) -> bool:
    """Whether callbacks of ``cls`` choose the next batch or reshape the rolled-out one: what makes an arm."""
    return issubclass(cls, (SelectionCallback, RolloutHook, UniformHandbackCallback))


def _config_value(value: Any) -> Any:
    """A constructor argument as YAML can carry it: dataclasses as their fields (all of them), tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _config_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_config_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _config_value(v) for k, v in value.items()}
    return value


def jsonable(value: Any) -> Any:
    """A JSON-ready copy: dataclasses become their fields (minus locations), tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in LOCATION_ARGS}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def resolved_arguments(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every constructor argument of ``cls`` as called with ``kwargs``: the given ones and the signature's defaults
    (``inspect.signature(cls).bind(**kwargs).apply_defaults()``), without :data:`LOCATION_ARGS`."""
    bound = inspect.signature(cls).bind(**kwargs)
    bound.apply_defaults()
    return {k: jsonable(v) for k, v in bound.arguments.items() if k not in LOCATION_ARGS}


def strategy_specs(name: str, cfg: StrategySettings, seed: int, cache_dir: str = CACHE_DIR) -> list[CallbackSpec]:
    """The callbacks of strategy ``name`` (selection first, then rollout hooks), as classes and arguments.

    - ``uniform``: none (the batch plan's uniform sampling without replacement per epoch).
    - ``dynamic_sampling``: DAPO's filter, up to ``dynamic_max_rounds`` rounds (extra rounds charged).
    - ``history``: SRPO history resampling.
    - ``dots`` / ``dots_replay``: DOTS (alpha, tau, a reference set of ``reference_size`` every ``update_every``
      steps, online-fitted adapters on the warm start's embeddings), plus replay.
    - ``dps`` / ``dps_replay``: DPS (decay ``dps_decay``) ranking the whole pool, plus replay (``replay_delta``,
      ``replay_capacity``).
    - ``dps_c8``: DPS ranking a fresh candidate set of ``dps_candidate_ratio * B`` prompts each step (the DPS
      reference code's loader; 8 in its Countdown scripts).
    - ``mopps``: MoPPS as the MoPPS reference code runs Countdown: Thompson samples of ``mopps_candidate_ratio * B``
      candidates (``ts_ratio=8``), posterior decay ``mopps_decay`` (``bandit_decay_ratio=0.5``), target
      :data:`MOPPS_TARGET`, prior :data:`MOPPS_PRIOR`.
    - ``greso``: GRESO's pre-rollout skipping, target zero-variance share ``greso_target``.
    - ``dps_cold_start``: DPS whose unseen prompts start from DOTS' predicted success rate (same reference-set
      settings as DOTS, charged to the budget).
    - ``screening``: SPEED-RL's screening, ``screening_generations`` completions per candidate, the rest only for
      prompts with both outcomes among them, up to ``screening_max_rounds`` rounds of candidates (all charged).
    - ``sequential``: Reinforce-Ada's sequential sampling: ``sequential_initial_generations`` per prompt, then rounds
      of ``sequential_round_generations`` for the prompts without both outcomes, up to
      ``sequential_max_generations``; groups of different sizes.
    - ``allocation_dps`` / ``allocation_mopps`` / ``allocation_dots`` / ``allocation_dps_cold``: per-prompt
      completions within ``allocation_budget_ratio * B * G`` per step (``allocation_min_generations`` to
      ``allocation_max_generations`` in steps of ``allocation_granularity``, no completion worth less than
      ``allocation_min_gain`` expected informative groups), from the predictions of ``dps_c8``, ``mopps``,
      ``dots`` or ``dps_cold_start`` (which choose the prompts as they do alone).
    - ``allocation_dots_broad``: the allocation from DOTS' predictions, with DOTS' selection temperature
      ``broad_dots_tau`` so high that it picks prompts uniformly: Knapsack RL's setting (the sampler's batch as it
      comes, the completions moved between its prompts), with DOTS' reference sets as the predictor.
    - ``dps_c8_handback``: ``dps_c8`` followed by :class:`~lit_rlft.callbacks.UniformHandbackCallback`, which hands
      the batch back to uniform sampling between ``handback_start_passes`` and ``handback_end_passes`` passes over
      the pool (the remedy for selection's early lead turning into a deficit over many passes).
    - ``dps_content_prior``: ``dps_c8`` whose unseen prompts start from the success rate DOTS' attention predicts from
      the last ``content_prior_reference_size`` prompts DPS observed (``reference="observed"``: no reference
      rollouts); the cheap content prior, against ``dps_cold_start``'s rolled-out reference sets.
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")

    def dots(tau: float | None = None) -> CallbackSpec:
        return CallbackSpec(DOTSCallback, dict(alpha=cfg.dots_alpha, tau=cfg.dots_tau if tau is None else tau,
                                               reference_size=cfg.reference_size,
                                               update_every=cfg.update_every,
                                               online_steps_per_update=cfg.dots_online_steps, cache_dir=cache_dir,
                                               seed=seed))

    def replay() -> CallbackSpec:
        return CallbackSpec(ReplayCallback, dict(delta=cfg.replay_delta, capacity=cfg.replay_capacity, seed=seed))

    def dps(cold: DifficultyPredictorConfig | None = None, candidate_ratio: int | None = None) -> CallbackSpec:
        return CallbackSpec(DPSCallback, dict(decay=cfg.dps_decay, cold_start=cold, candidate_ratio=candidate_ratio,
                                              seed=seed))

    if name == "uniform":
        return []
    if name == "dynamic_sampling":
        return [CallbackSpec(DynamicSamplingCallback, dict(max_rounds=cfg.dynamic_max_rounds))]
    if name == "history":
        return [CallbackSpec(HistoryResamplingCallback, dict(seed=seed))]
    if name == "dots":
        return [dots()]
    if name == "dots_replay":
        return [dots(), replay()]
    if name == "dps":
        return [dps()]
    if name == "dps_c8":
        return [dps(candidate_ratio=cfg.dps_candidate_ratio)]
    if name == "dps_replay":
        return [dps(), replay()]
    if name == "dps_c8_handback":
        return [dps(candidate_ratio=cfg.dps_candidate_ratio),
                CallbackSpec(UniformHandbackCallback, dict(start_passes=cfg.handback_start_passes,
                                                           end_passes=cfg.handback_end_passes, seed=seed))]
    if name == "mopps":
        return [CallbackSpec(MoPPSCallback, dict(candidate_ratio=cfg.mopps_candidate_ratio, decay=cfg.mopps_decay,
                                                 target=MOPPS_TARGET, prior=MOPPS_PRIOR, seed=seed))]
    if name == "greso":
        return [CallbackSpec(GRESOCallback, dict(target_zero_variance=cfg.greso_target, seed=seed))]
    if name == "screening":
        return [CallbackSpec(ScreeningCallback, dict(initial_generations=cfg.screening_generations,
                                                     max_rounds=cfg.screening_max_rounds))]
    if name == "sequential":
        return [CallbackSpec(SequentialSamplingCallback, dict(
            initial_generations=cfg.sequential_initial_generations,
            round_generations=cfg.sequential_round_generations, max_generations=cfg.sequential_max_generations))]
    cold = DifficultyPredictorConfig(reference_size=cfg.reference_size, update_every=cfg.update_every,
                                     online_steps_per_update=cfg.dots_online_steps, cache_dir=cache_dir)
    if name == "dps_content_prior":
        observed = DifficultyPredictorConfig(reference_size=cfg.content_prior_reference_size, reference="observed",
                                             update_every=cfg.update_every,
                                             online_steps_per_update=cfg.dots_online_steps, cache_dir=cache_dir)
        return [dps(observed, candidate_ratio=cfg.dps_candidate_ratio)]
    if name.startswith("allocation_"):
        allocation = CallbackSpec(AllocationCallback, dict(
            min_generations=cfg.allocation_min_generations, max_generations=cfg.allocation_max_generations,
            budget_ratio=cfg.allocation_budget_ratio, granularity=cfg.allocation_granularity,
            min_gain=cfg.allocation_min_gain))
        if name == "allocation_dots_broad":
            return [allocation, dots(tau=cfg.broad_dots_tau)]
        base = strategy_specs({"allocation_dps": "dps_c8", "allocation_mopps": "mopps", "allocation_dots": "dots",
                               "allocation_dps_cold": "dps_cold_start"}[name], cfg, seed, cache_dir)
        return [allocation, *base]  # the allocation is the first rollout hook
    return [dps(cold)]


def strategy_callbacks(name: str, cfg: StrategySettings, seed: int, cache_dir: str = CACHE_DIR) -> list[Any]:
    """The callbacks of strategy ``name`` (see :func:`strategy_specs`)."""
    return [spec.build() for spec in strategy_specs(name, cfg, seed, cache_dir)]


def strategy_settings(name: str, cfg: StrategySettings, seed: int) -> list[dict[str, Any]]:
    """What strategy ``name`` runs with at ``seed``: ``[{"callback": ..., "args": {...}}]``, every argument of every
    callback, defaults included (what a run records in its JSON as ``callbacks``)."""
    return [spec.settings() for spec in strategy_specs(name, cfg, seed)]


# -- arms: a shipped strategy or a user's overlay file ------------------------------------------------------------
#: Callbacks the study itself adds to every arm (never an arm's own): left out of an overlay's strategy.
NOT_STRATEGY = (BatchCompositionLogger, CompletionLogger)


class ArmError(ValueError):
    """A strategy name or overlay file the study cannot use (the message names it)."""


@dataclass(frozen=True)
class Arm:
    """One arm of a study: a name and how its callbacks are made for a seed.

    ``strategy``: a shipped strategy (:data:`STRATEGIES`), or None for an overlay; ``overlay``: the overlay file's
    callbacks (``CallbackSpec`` with the file's arguments); ``path``: the overlay file.
    """

    name: str
    strategy: str | None = None
    overlay: tuple[CallbackSpec, ...] = ()
    path: str | None = None

    def specs(self, settings: StrategySettings, seed: int, cache_dir: str = CACHE_DIR) -> list[CallbackSpec]:
        """The arm's callbacks at ``seed``. An overlay's callbacks that take a ``seed`` and were not given one get
        the run's seed, as the shipped strategies do."""
        if self.strategy is not None:
            return strategy_specs(self.strategy, settings, seed, cache_dir)
        out = []
        for spec in self.overlay:
            kwargs = dict(spec.kwargs)
            if "seed" in inspect.signature(spec.cls).parameters and "seed" not in kwargs:
                kwargs["seed"] = seed
            if "cache_dir" in inspect.signature(spec.cls).parameters and "cache_dir" not in kwargs:
                kwargs["cache_dir"] = cache_dir
            out.append(CallbackSpec(spec.cls, kwargs))
        return out

    def settings(self, settings: StrategySettings, seed: int) -> list[dict[str, Any]]:
        """What the arm runs with at ``seed`` (see :func:`strategy_settings`)."""
        return [spec.settings() for spec in self.specs(settings, seed)]

    def selection_name(self) -> str | None:
        """The ``SelectionCallback.name`` the arm logs its ``<name>/overhead_s`` under (None: no selection)."""
        if self.strategy is not None:
            return SELECTION_NAME[self.strategy]
        for spec in self.overlay:
            if issubclass(spec.cls, SelectionCallback):
                return getattr(spec.cls, "name", None)
        return None


def resolve_arm(text: str) -> Arm:
    """The arm a ``--strategies`` entry names: a shipped strategy, or a YAML overlay file (its stem names the arm).

    Raises:
        ArmError: neither a shipped strategy nor an existing file, or a file that is not a callbacks overlay.
    """
    if text in STRATEGIES:
        return Arm(name=text, strategy=text)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_overlay(path)
    raise ArmError(f"unknown strategy {text!r}: choose from {', '.join(STRATEGIES)}, or give a YAML overlay file "
                   "(trainer.callbacks as class_path / init_args, as in configs/strategies/*.yaml)")


def load_overlay(path: str | Path) -> Arm:
    """A user's overlay file as an arm named after the file: its ``trainer.callbacks`` that choose or reshape batches
    (selection callbacks, rollout hooks); loggers such as ``CompletionLogger`` are left to the base config.

    Raises:
        ArmError: the file is missing or unreadable, has no ``trainer.callbacks``, names a class that cannot be
            imported, or arguments its class does not take (the message names the file and the entry).
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ArmError(f"strategy overlay {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ArmError(f"strategy overlay {path}: not valid YAML ({e})") from e
    entries = (data.get("trainer") or {}).get("callbacks") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ArmError(f"strategy overlay {path}: no trainer.callbacks list (an overlay holds the arm's callbacks as "
                       "class_path / init_args, as configs/strategies/*.yaml do)")
    specs = []
    for i, entry in enumerate(entries):
        where = f"strategy overlay {path}: trainer.callbacks[{i}]"
        if not isinstance(entry, dict) or "class_path" not in entry:
            raise ArmError(f"{where}: expected a mapping with class_path (and init_args), got {entry!r}")
        try:
            cls = import_object(str(entry["class_path"]), "callback")
        except (ImportError, ValueError, AttributeError) as e:
            raise ArmError(f"{where}: {e}") from e
        if not isinstance(cls, type):
            raise ArmError(f"{where}: {entry['class_path']} is not a class")
        kwargs = dict(entry.get("init_args") or {})
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as e:
            raise ArmError(f"{where}: {cls.__name__} {e}") from e
        if not issubclass(cls, NOT_STRATEGY):
            specs.append(CallbackSpec(cls, kwargs))
    return Arm(name=path.stem, overlay=tuple(specs), path=str(path))

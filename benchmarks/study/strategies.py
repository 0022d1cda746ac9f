"""The callbacks that make each strategy of the study (settings from :class:`StudyConfig`), and the settings they
actually run with.

Every strategy is a list of :class:`CallbackSpec` (a callback class and the keyword arguments the study passes);
:func:`strategy_callbacks` instantiates them and :func:`strategy_settings` resolves them against the class's
signature, defaults included. The settings are recorded in every run's JSON (``callbacks``), a run is reused only
while they still match (``benchmarks.study.study.retire_stale_runs``), and the settings block of ``results.md`` and
``docs/results.md`` is generated from them, never typed by hand.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import lightning as L

from benchmarks.study.config import STRATEGIES, StudyConfig
from lit_rlft.callbacks import (
    AllocationCallback,
    DifficultyPredictorConfig,
    DOTSCallback,
    DPSCallback,
    DynamicSamplingCallback,
    GRESOCallback,
    HistoryResamplingCallback,
    MoPPSCallback,
    ReplayCallback,
    ScreeningCallback,
    SequentialSamplingCallback,
    UniformHandbackCallback,
)

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

#: MoPPS' settings that are not ``StudyConfig`` fields, as the MoPPS reference code's Countdown scripts run them
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
    kwargs: dict[str, Any]

    def build(self) -> L.Callback:
        return self.cls(**self.kwargs)

    def settings(self) -> dict[str, Any]:
        """``{"callback": class name, "args": every argument, defaults included}`` (JSON-ready; no file locations)."""
        return {"callback": self.cls.__name__, "args": resolved_arguments(self.cls, self.kwargs)}


def _jsonable(value: Any) -> Any:
    """A JSON-ready copy: dataclasses become their fields (minus locations), tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in LOCATION_ARGS}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def resolved_arguments(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every constructor argument of ``cls`` as called with ``kwargs``: the given ones and the signature's defaults
    (``inspect.signature(cls).bind(**kwargs).apply_defaults()``), without :data:`LOCATION_ARGS`."""
    bound = inspect.signature(cls).bind(**kwargs)
    bound.apply_defaults()
    return {k: _jsonable(v) for k, v in bound.arguments.items() if k not in LOCATION_ARGS}


def strategy_specs(name: str, cfg: StudyConfig, seed: int, cache_dir: str = ".cache/lit_rlft/embeddings"
                   ) -> list[CallbackSpec]:
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


def strategy_callbacks(name: str, cfg: StudyConfig, seed: int, cache_dir: str) -> list[L.Callback]:
    """The callbacks of strategy ``name`` (see :func:`strategy_specs`)."""
    return [spec.build() for spec in strategy_specs(name, cfg, seed, cache_dir)]


def strategy_settings(name: str, cfg: StudyConfig, seed: int) -> list[dict[str, Any]]:
    """What strategy ``name`` runs with at ``seed``: ``[{"callback": ..., "args": {...}}]``, every argument of every
    callback, defaults included (what a run records in its JSON as ``callbacks``)."""
    return [spec.settings() for spec in strategy_specs(name, cfg, seed)]

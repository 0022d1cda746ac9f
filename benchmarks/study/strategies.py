"""The callbacks that make each strategy of the study (settings from :class:`StudyConfig`)."""

from __future__ import annotations

import lightning as L

from benchmarks.study.config import STRATEGIES, StudyConfig
from lit_rlft.callbacks import (
    DifficultyPredictorConfig,
    DOTSCallback,
    DPSCallback,
    DynamicSamplingCallback,
    GRESOCallback,
    HistoryResamplingCallback,
    MoPPSCallback,
    ReplayCallback,
)

#: The ``SelectionCallback.name`` each strategy logs its ``<name>/overhead_s`` under (None: no selection callback).
SELECTION_NAME: dict[str, str | None] = {
    "uniform": None, "dynamic_sampling": None, "history": "history", "dots": "dots", "dots_replay": "dots",
    "dps": "dps", "dps_c8": "dps", "dps_replay": "dps", "dps_cold_start": "dps", "mopps": "mopps", "greso": "greso",
}


def strategy_callbacks(name: str, cfg: StudyConfig, seed: int, cache_dir: str) -> list[L.Callback]:
    """Callbacks for strategy ``name`` (selection first, then rollout hooks).

    - ``uniform``: none (the batch plan's uniform sampling without replacement per epoch).
    - ``dynamic_sampling``: DAPO's filter, up to ``dynamic_max_rounds`` rounds (extra rounds charged).
    - ``history``: SRPO history resampling.
    - ``dots`` / ``dots_replay``: DOTS (alpha, tau, a reference set of ``reference_size`` every ``update_every``
      steps, online-fitted adapters on the warm start's embeddings), plus replay.
    - ``dps`` / ``dps_replay``: DPS (decay ``dps_decay``) ranking the whole pool, plus replay (``replay_delta``,
      ``replay_capacity``).
    - ``dps_c8``: DPS ranking a fresh candidate set of ``dps_candidate_ratio * B`` prompts each step (the DPS
      reference code's loader; 8 in its Countdown scripts).
    - ``mopps``: MoPPS, Thompson samples of ``mopps_candidate_ratio * B`` candidates, target 0.5.
    - ``greso``: GRESO's pre-rollout skipping, target zero-variance share ``greso_target``.
    - ``dps_cold_start``: DPS whose unseen prompts start from DOTS' predicted success rate (same reference-set
      settings as DOTS, charged to the budget).
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")

    def dots() -> DOTSCallback:
        return DOTSCallback(alpha=cfg.dots_alpha, tau=cfg.dots_tau, reference_size=cfg.reference_size,
                            update_every=cfg.update_every, online_steps_per_update=cfg.dots_online_steps,
                            cache_dir=cache_dir, seed=seed)

    def replay() -> ReplayCallback:
        return ReplayCallback(delta=cfg.replay_delta, capacity=cfg.replay_capacity, seed=seed)

    def dps(cold: DifficultyPredictorConfig | None = None, candidate_ratio: int | None = None) -> DPSCallback:
        return DPSCallback(decay=cfg.dps_decay, cold_start=cold, candidate_ratio=candidate_ratio, seed=seed)

    if name == "uniform":
        return []
    if name == "dynamic_sampling":
        return [DynamicSamplingCallback(max_rounds=cfg.dynamic_max_rounds)]
    if name == "history":
        return [HistoryResamplingCallback(seed=seed)]
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
    if name == "mopps":
        return [MoPPSCallback(candidate_ratio=cfg.mopps_candidate_ratio, seed=seed)]
    if name == "greso":
        return [GRESOCallback(target_zero_variance=cfg.greso_target, seed=seed)]
    cold = DifficultyPredictorConfig(reference_size=cfg.reference_size, update_every=cfg.update_every,
                                     online_steps_per_update=cfg.dots_online_steps, cache_dir=cache_dir)
    return [dps(cold)]

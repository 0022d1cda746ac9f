"""A recorded Countdown study (``study.json``) read back, its pool summaries recomputed with the current code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.study.config import StudyConfig
from benchmarks.study.study import summarise_pool
from lit_rlft.records.jsonio import read_json

REPO = Path(__file__).resolve().parents[2]
STUDY_JSON = REPO / "docs" / "results" / "study.json"


def load_study(path: Path = STUDY_JSON) -> tuple[StudyConfig, dict[str, Any]]:
    """The recorded study, its pool summaries recomputed from its runs with the current derived code."""
    study = read_json(path)
    if study is None:
        raise FileNotFoundError(f"{path}: missing or unreadable")
    cfg = StudyConfig.from_dict(study["config"])
    study["pools"] = {str(size): summarise_pool([r for r in study["runs"] if r.get("pool_size") == size],
                                                 cfg.strategies_at(size), cfg.confidence, cfg.eval_marks())
                      for size in cfg.pool_sizes}
    return cfg, study

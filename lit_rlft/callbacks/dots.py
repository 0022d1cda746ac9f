"""DOTSCallback: difficulty-targeted online selection (attention over frozen embeddings of a reference set)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from lit_rlft.callbacks.difficulty import DifficultyPredictorConfig, build_dots_selector, refresh_reference
from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.selection.dots import DOTSSelector
from lit_rlft.step.context import StepContext


class DOTSCallback(SelectionCallback):
    """Train on prompts whose predicted success rate is near ``1 - alpha`` (difficulty near ``alpha``).

    Every ``update_every`` steps a reference set of ``reference_size`` prompts is rolled out under the current
    policy; every other prompt's difficulty is predicted by attention over the reference set in a learned
    projection of frozen prompt embeddings, calibrated, and the next ``update_every`` batches are drawn without
    replacement with probability proportional to ``exp(-|d - alpha| / tau)`` (Gumbel top-k in log space, so a
    tiny ``tau`` never fails). Logs ``dots/pearson`` (predicted vs observed difficulty of the fresh batch),
    ``dots/effective_ratio`` and ``dots/reference_size``.

    Example::

        trainer = L.Trainer(callbacks=[DOTSCallback(alpha=0.5, tau=1e-3, reference_size=128)])

    Args:
        alpha: target difficulty (0.5: half the completions correct).
        tau: selection temperature (> 0).
        reference_size: the predictor's settings, as are ``update_every``, ``calibration``, ``temperature_attn``,
            ``embedding_model``, ``adapters``, ``online_fit``, ``online_steps_per_update``, ``cache_dir`` and
            ``embedding_batch_size``: see :class:`DifficultyPredictorConfig`.
        seed: seed of reference draws, the predictor's initialisation and selection.
    """

    name = "dots"
    predicts_success = True  # its strategy has spread_probabilities: AllocationCallback allocates from it

    def __init__(
        self,
        alpha: float = 0.5,
        tau: float = 1e-3,
        reference_size: int = 256,
        update_every: int = 2,
        calibration: Literal["linear", "platt", "none"] = "linear",
        temperature_attn: float = 1.0,
        embedding_model: str | None = None,
        adapters: str | None = None,
        online_fit: bool = True,
        online_steps_per_update: int = 20,
        cache_dir: str = ".cache/lit_rlft/embeddings",
        embedding_batch_size: int = 64,
        seed: int = 0,
    ):
        super().__init__(seed=seed)
        if tau <= 0:
            raise ValueError(f"DOTSCallback: tau must be > 0, got {tau}")
        if not 0 <= alpha <= 1:
            raise ValueError(f"DOTSCallback: alpha must be in [0, 1], got {alpha}")
        self.alpha, self.tau = alpha, tau
        self.embedding_key: str | None = None  # cache key of the pool embeddings (checkpointed, for exact resume)
        self.config = DifficultyPredictorConfig(
            reference_size=reference_size, update_every=update_every, calibration=calibration,
            temperature_attn=temperature_attn, embedding_model=embedding_model, adapters=adapters,
            online_fit=online_fit, online_steps_per_update=online_steps_per_update, cache_dir=cache_dir,
            embedding_batch_size=embedding_batch_size,
        )

    def build(self, ctx: StepContext, num_prompts: int) -> DOTSSelector:
        resume_key = (self._pending_state or {}).get("embedding_key")
        selector, self.embedding_key = build_dots_selector(self.config, ctx, self.alpha, self.tau, self.seed,
                                                           resume_key=resume_key)
        return selector

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state:
            state["embedding_key"] = self.embedding_key
        return state

    def before_select(self, ctx: StepContext, step: int) -> None:
        self._reference_pearson = float("nan")
        if self.strategy.needs_reference(step):
            self._reference_pearson = refresh_reference(self.strategy, ctx, self.rng)

    def metrics(self, ctx: StepContext) -> dict[str, Any]:
        out = {"dots/reference_size": float(self.config.reference_size)}
        if np.isfinite(getattr(self, "_reference_pearson", float("nan"))):
            out["dots/reference_pearson"] = self._reference_pearson
        if self.strategy.last_pearson is not None and np.isfinite(self.strategy.last_pearson):
            out["dots/pearson"] = float(self.strategy.last_pearson)
        if self.strategy.last_predictions is not None and len(self.strategy.last_predictions):
            out["dots/predicted_difficulty_mean"] = float(np.mean(np.asarray(self.strategy.last_predictions)))
        return out

"""DOTSCallback: difficulty-targeted online selection (attention over frozen embeddings of a reference set)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.models.embeddings import cached_embeddings
from lit_rlft.selection.dots import DOTSSelector, load_predictor, pearson
from lit_rlft.step.context import StepContext


@dataclass
class DifficultyPredictorConfig:
    """How DOTS predicts difficulty: reference sets, embeddings and adapters.

    Args:
        reference_size: ``K`` prompts rolled out under the current policy per reference set (charged to the budget
            as ``budget/completions_reference``).
        update_every: ``mu``: steps between reference sets (and batches drawn per draw).
        calibration: ``linear`` (reference code), ``platt`` (paper) or ``none``.
        temperature_attn: attention temperature.
        embedding_model: path of a frozen HF model whose mean-pooled last hidden state embeds prompts; ``None``:
            the policy's base model as it is when training starts.
        adapters: an offline-trained predictor (``lit-rlft dots-adapters``); ``None``: fresh adapters.
        online_fit: fit the adapters from the run's own (prompt, success rate) pairs.
        online_steps_per_update: Adam steps per training step of the online fit.
        cache_dir: where pool embeddings are cached (keyed by model and pool).
        embedding_batch_size: prompts per embedding forward pass.
    """

    reference_size: int = 256
    update_every: int = 2
    calibration: Literal["linear", "platt", "none"] = "linear"
    temperature_attn: float = 1.0
    embedding_model: str | None = None
    adapters: str | None = None
    online_fit: bool = True
    online_steps_per_update: int = 20
    cache_dir: str = ".cache/lit_rlft/embeddings"
    embedding_batch_size: int = 64

    def __post_init__(self) -> None:
        if self.update_every < 1:
            raise ValueError(f"update_every (mu) must be >= 1, got {self.update_every}")
        if self.reference_size < 1:
            raise ValueError(f"reference_size must be >= 1, got {self.reference_size}")


def build_dots_selector(
    cfg: DifficultyPredictorConfig, ctx: StepContext, alpha: float, tau: float, seed: int,
    resume_key: str | None = None,
) -> tuple[DOTSSelector, str]:
    """Embed the training pool (cached) and build the Lightning-free :class:`DOTSSelector`.

    Returns the selector and the embeddings' cache key. A resumed run passes the key its checkpoint recorded as
    ``resume_key``: the policy has trained since the run started, so embedding it again would give other
    embeddings (and other selections) than the uninterrupted run's.
    """
    dm = ctx.data
    pool = dm.train_pool
    if cfg.reference_size + dm.plan.batch_size > len(pool):
        raise ValueError(
            f"reference_size ({cfg.reference_size}) + data.batch_size ({dm.plan.batch_size}) exceeds the training "
            f"pool ({len(pool)}): reference prompts are excluded from selection, so lower reference_size"
        )
    texts = dm.prompt_texts(pool.ids)
    shared = dict(device=ctx.device, batch_size=cfg.embedding_batch_size, progress=ctx.collective.rank == 0,
                  collective=ctx.collective, resume_key=resume_key, return_key=True)
    if cfg.embedding_model is None:
        model = getattr(ctx.policy, "get_base_model", lambda: ctx.policy)()
        emb, key = cached_embeddings(texts, model, cfg.cache_dir, tokenizer=ctx.tokenizer, **shared)
    else:
        emb, key = cached_embeddings(texts, cfg.embedding_model, cfg.cache_dir, **shared)
    if cfg.adapters and not Path(cfg.adapters).exists():
        raise FileNotFoundError(f"adapters: {cfg.adapters} does not exist")
    predictor = load_predictor(cfg.adapters) if cfg.adapters else None
    return DOTSSelector(
        emb, alpha=alpha, tau=tau, reference_size=cfg.reference_size, update_every=cfg.update_every,
        temperature_attn=cfg.temperature_attn, calibration=cfg.calibration, predictor=predictor,
        online_fit=cfg.online_fit, online_steps_per_update=cfg.online_steps_per_update, seed=seed,
    ), key


def refresh_reference(selector: DOTSSelector, ctx: StepContext, rng: np.random.Generator) -> float:
    """Roll out a fresh reference set under the current policy and hand its success rates to ``selector``.

    Returns the Pearson correlation between the difficulties the predictor gave the new reference prompts *before*
    seeing their labels (from the previous reference set) and the measured ones: an out-of-sample check on a
    uniform sample of the pool (NaN for the first set). The Pearson on the selected batch (``dots/pearson``) is
    range-restricted: with a small ``tau`` every selected prompt was predicted near ``alpha``.
    """
    ids = selector.reference_ids(rng)
    rates = ctx.success_rates(ids, purpose="reference")
    r = float("nan")
    if selector.reference is not None:
        r = pearson(selector.predict(ids).double().numpy(), 1.0 - rates)
    selector.set_reference(ids, rates)
    return r


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
        reference_size / update_every / calibration / temperature_attn / embedding_model / adapters / online_fit /
            online_steps_per_update / cache_dir / embedding_batch_size: see :class:`DifficultyPredictorConfig`.
        seed: seed of reference draws, the predictor's initialisation and selection.
    """

    name = "dots"

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

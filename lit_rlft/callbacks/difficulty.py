"""What DOTS and DPS' cold start share: the difficulty predictor's settings, building it over the embedded pool,
and rolling out its reference sets under the current policy (through the step context)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from lit_rlft.core.finite import check_finite
from lit_rlft.models.embeddings import cached_embeddings
from lit_rlft.selection.dots import DOTSSelector, load_predictor, pearson
from lit_rlft.step.context import StepContext

__all__ = ["DifficultyPredictorConfig", "build_dots_selector", "refresh_reference"]


@dataclass
class DifficultyPredictorConfig:
    """How DOTS predicts difficulty: reference sets, embeddings and adapters.

    Args:
        reference_size: ``K`` prompts rolled out under the current policy per reference set (charged to the budget
            as ``budget/completions_reference``).
        reference: ``rollout``: each reference set is ``K`` prompts drawn uniformly from the pool and rolled out
            (DOTS); ``observed``: the ``K`` prompts the run observed last, with the outcomes it trained on: no
            rollouts at all, but a sample chosen by the strategy, not a uniform one, and none before the first step
            (a cheaper content prior for DPS' cold start).
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
    reference: Literal["rollout", "observed"] = "rollout"
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
        check_finite(self, "predictor")
        if self.update_every < 1:
            raise ValueError(f"update_every (mu) must be >= 1, got {self.update_every}")
        if self.reference_size < 1:
            raise ValueError(f"reference_size must be >= 1, got {self.reference_size}")
        if self.reference not in ("rollout", "observed"):
            raise ValueError(f"reference must be 'rollout' or 'observed', got {self.reference!r}")


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


def refresh_reference(selector: DOTSSelector, ctx: StepContext, rng: np.random.Generator,
                      source: str = "rollout") -> float:
    """Roll out a fresh reference set under the current policy and hand its success rates to ``selector``
    (``source="observed"``: the prompts observed last instead, no rollouts; nothing before the first observation).

    Returns the Pearson correlation between the difficulties the predictor gave the new reference prompts *before*
    seeing their labels (from the previous reference set) and the measured ones: an out-of-sample check on a
    uniform sample of the pool (NaN for the first set). The Pearson on the selected batch (``dots/pearson``) is
    range-restricted: with a small ``tau`` every selected prompt was predicted near ``alpha``.
    """
    if source == "observed":
        latest = selector.latest_observations()
        if latest is None:
            return float("nan")
        ids, rates = latest
    else:
        in_flight = ctx.in_flight
        ids = selector.reference_ids(rng, in_flight) if in_flight.size else selector.reference_ids(rng)
        rates = ctx.success_rates(ids, purpose="reference")
    r = float("nan")
    if selector.reference is not None:
        r = pearson(selector.predict(ids).double().numpy(), 1.0 - rates)
    selector.set_reference(ids, rates)
    return r

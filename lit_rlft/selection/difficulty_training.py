"""Training, evaluation and persistence of DOTS' difficulty predictor
(:class:`~lit_rlft.selection.difficulty.AttentionDifficultyPredictor`). Pure torch; :func:`fit_adapters` imports
``tqdm`` lazily for its progress bar.

Notation: ``S`` labelled prompts, ``K`` references and ``Q`` queries per episode, ``D`` embedding width.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lit_rlft.selection.difficulty import (
    EPS,
    AttentionDifficultyPredictor,
    Calibration,
    pearson,
    predict_from_reference,
)

__all__ = ["episodic_bce_loss", "evaluate_predictor", "fit_adapters", "load_predictor", "save_predictor"]


def episodic_bce_loss(
    predictor: AttentionDifficultyPredictor,
    query_emb: Tensor,
    query_difficulty: Tensor,
    ref_emb: Tensor,
    ref_difficulty: Tensor,
    platt: bool = False,
) -> Tensor:
    """One training episode: BCE with soft labels between ``d_hat`` (clamped to ``[eps, 1 - eps]``) of the
    queries ``[Q, D]`` and their true difficulty ``[Q]``, given references ``[K, D]`` / ``[K]``. With ``platt``
    the prediction passes through the predictor's calibration net first (so the net is trained too)."""
    d_hat = predictor(query_emb, ref_emb, ref_difficulty)  # [Q]
    if platt:
        d_hat = predictor.calibrate(d_hat, ref_difficulty)
    return F.binary_cross_entropy(d_hat.clamp(EPS, 1.0 - EPS), query_difficulty.to(d_hat))


# ---------------------------------------------------------------------------------------------------------------
# Offline fitting, evaluation, persistence
# ---------------------------------------------------------------------------------------------------------------
def fit_adapters(
    predictor: AttentionDifficultyPredictor,
    embeddings: Tensor,
    difficulties: Tensor,
    steps: int = 500,
    lr: float = 1e-3,
    reference_size: int = 256,
    batch_size: int = 256,
    seed: int = 0,
    progress: bool = True,
    train_calibrator: bool = False,
) -> list[float]:
    """Fit the adapters offline on labelled prompts by episodic BCE (:func:`episodic_bce_loss`).

    Each step draws a random split of the ``S`` prompts: ``reference_size`` references and ``batch_size`` queries.

    Args:
        predictor: trained in place (left in eval mode).
        embeddings: ``[S, D]`` frozen prompt embeddings.
        difficulties: ``[S]`` difficulties ``1 - pass rate`` in [0, 1].
        steps / lr: Adam steps and learning rate.
        reference_size: ``K`` per episode; ``batch_size``: queries per episode (both capped by ``S``).
        seed: seeds the episode draws.
        progress: show a tqdm bar.
        train_calibrator: also train the Platt :class:`~lit_rlft.selection.difficulty.CalibrationNet` (use when
            selecting with ``"platt"``).

    Returns:
        The ``steps`` losses.
    """
    emb = torch.as_tensor(embeddings).detach().float()
    d = torch.as_tensor(difficulties).detach().float().reshape(-1)
    if emb.ndim != 2 or emb.shape[0] != d.numel() or emb.shape[0] < 2:
        raise ValueError(
            f"need [S, D] embeddings and [S] difficulties with S >= 2, got {tuple(emb.shape)}, {d.numel()}"
        )
    if (d < 0).any() or (d > 1).any():
        raise ValueError("`difficulties` must lie in [0, 1]")
    s = emb.shape[0]
    k = max(1, min(int(reference_size), s - 1))
    q = max(1, min(int(batch_size), s - k))
    params = predictor.adapter_parameters() + (list(predictor.calibrator.parameters()) if train_calibrator else [])
    if not params:
        raise ValueError("the predictor has no trainable parameters (identity adapters and train_calibrator=False)")
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    it: Any = range(int(steps))
    if progress:
        from tqdm.auto import tqdm  # lazy: selection/ depends on torch / numpy only

        it = tqdm(it, desc="fit DOTS adapters")
    predictor.train()
    losses: list[float] = []
    for _ in it:
        perm = torch.randperm(s, generator=gen)
        r, qi = perm[:k], perm[k : k + q]
        loss = episodic_bce_loss(predictor, emb[qi], d[qi], emb[r], d[r], platt=train_calibrator)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if progress:
            it.set_postfix(loss=f"{losses[-1]:.4f}")
    predictor.eval()
    return losses


def evaluate_predictor(
    predictor: AttentionDifficultyPredictor,
    embeddings: Tensor,
    difficulties: Tensor,
    reference_size: int = 256,
    seed: int = 0,
    calibration: Calibration = "linear",
) -> dict[str, float]:
    """Pearson correlation and mean absolute error of predictions for the non-reference prompts, with a random
    reference set of ``reference_size`` drawn by ``seed``. Returns ``{"pearson": ..., "mae": ...}``."""
    emb = torch.as_tensor(embeddings).detach().float()
    d = torch.as_tensor(difficulties).detach().float().reshape(-1)
    s = emb.shape[0]
    k = max(1, min(int(reference_size), s - 1))
    perm = torch.randperm(s, generator=torch.Generator().manual_seed(seed))
    r, q = perm[:k], perm[k:]
    pred = predict_from_reference(predictor, emb[q], emb[r], d[r], calibration)
    return {"pearson": pearson(pred, d[q]), "mae": float((pred - d[q]).abs().mean())}


def save_predictor(path: str | os.PathLike, predictor: AttentionDifficultyPredictor, meta: dict | None = None) -> None:
    """Write ``{"config", "state_dict", "meta"}`` with ``torch.save`` (atomically: temp file + ``os.replace``).
    ``meta`` (plain types: embedding model, data set, metrics ...) is read back by ``load_predictor(..., True)``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "config": predictor.config(),
        "state_dict": {k: v.detach().cpu().clone() for k, v in predictor.state_dict().items()},
        "meta": dict(meta or {}),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_predictor(
    path: str | os.PathLike, return_meta: bool = False, map_location: str | torch.device = "cpu"
) -> AttentionDifficultyPredictor | tuple[AttentionDifficultyPredictor, dict]:
    """Rebuild a predictor written by :func:`save_predictor` (eval mode); with ``return_meta`` also its meta."""
    payload = torch.load(path, map_location=map_location, weights_only=True)
    predictor = AttentionDifficultyPredictor(**payload["config"])
    predictor.load_state_dict(payload["state_dict"])
    predictor.eval()
    return (predictor, payload.get("meta", {})) if return_meta else predictor

"""DOTS' difficulty predictor: attention of queries over a labelled reference set, plus its calibration.

Notation (see ``docs/design.md``): ``K`` reference-set size, ``D`` embedding width, ``P`` adapter projection width
(``proj_dim``), ``Q`` prompts whose difficulty is predicted. Difficulty is ``d = 1 - p`` with ``p`` a success rate::

    s_i   = <ref_proj(z_i), query_proj(z_q)> / sqrt(P)          z = frozen prompt embedding [D]
    a     = softmax(s / temperature)                             over the K references
    d_hat = sum_i a_i d_i                                        then calibrated and clipped to [0, 1]

Pure torch / numpy. Training and persistence: :mod:`lit_rlft.selection.difficulty_training`; the selector that
uses the predictions: :class:`lit_rlft.selection.dots.DOTSSelector`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

__all__ = [
    "CALIBRATIONS",
    "EPS",
    "AttentionDifficultyPredictor",
    "Calibration",
    "CalibrationNet",
    "DifficultyAdapter",
    "apply_linear_calibration",
    "fit_linear_calibration",
    "pearson",
    "platt_calibrate",
    "predict_from_reference",
]

Calibration = Literal["platt", "linear", "none"]
CALIBRATIONS: tuple[str, ...] = ("platt", "linear", "none")
EPS = 1e-6  # clamp for logit / BCE: representable next to 1.0 in float32 (spacing 6e-8)
_CHUNK = 8192  # query rows per matmul chunk in prediction: bounds memory at Q x K floats per chunk


# ---------------------------------------------------------------------------------------------------------------
# Modules: adapters, attention predictor, calibration net
# ---------------------------------------------------------------------------------------------------------------
class DifficultyAdapter(nn.Module):
    """Small MLP ``[*, D] -> [*, P]`` (Linear-GELU-Linear) applied to frozen prompt embeddings.

    Args:
        in_dim: embedding width ``D``.
        hidden_dim: hidden width.
        out_dim: projection width ``P``.
    """

    def __init__(self, in_dim: int, hidden_dim: int = 256, out_dim: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim))

    def forward(self, z: Tensor) -> Tensor:
        """``z`` ``[*, D]`` -> ``[*, P]``."""
        return self.net(z)


class CalibrationNet(nn.Module):
    """Platt-scaling parameters from the reference labels: ``(mean, std)`` of ``d_ref`` -> ``(w, b)``.

    The last layer starts at weight 0 and bias ``(1, 0)``, so an untrained net is the identity calibration
    (``w = 1, b = 0`` for every reference set).

    Args:
        hidden_dim: hidden width of the ``2 -> hidden -> 2`` MLP.
    """

    def __init__(self, hidden_dim: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, 2))
        nn.init.zeros_(self.net[2].weight)
        with torch.no_grad():
            self.net[2].bias.copy_(torch.tensor([1.0, 0.0]))

    def forward(self, ref_difficulty: Tensor) -> tuple[Tensor, Tensor]:
        """``ref_difficulty`` ``[K]`` -> scalars ``(w, b)`` (0-d tensors)."""
        d = ref_difficulty.float()
        stats = torch.stack([d.mean(), d.std(unbiased=False)])  # [2]
        w, b = self.net(stats).unbind(-1)
        return w, b


class AttentionDifficultyPredictor(nn.Module):
    """Predict difficulty by attention of queries over a labelled reference set.

    ``d_hat_q = sum_i softmax_i(<ref_proj(z_i), query_proj(z_q)> / sqrt(P) / temperature) * d_i``. The output is a
    convex combination of the reference labels, so it lies in their range. ``forward`` is uncalibrated; Platt
    calibration through :attr:`calibrator` is applied by :meth:`calibrate`.

    Args:
        embed_dim: embedding width ``D``.
        hidden_dim: adapters' hidden width.
        proj_dim: adapters' output width ``P``.
        temperature: softmax temperature of the attention (> 0).
        identity: no adapters (the paper's "raw embeddings" baseline): projections are the embeddings themselves
            and the scores are scaled by ``sqrt(D)``. Only :attr:`calibrator` then has parameters.
    """

    def __init__(
        self,
        embed_dim: int,
        hidden_dim: int = 256,
        proj_dim: int = 128,
        temperature: float = 1.0,
        identity: bool = False,
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"`temperature` must be > 0, got {temperature!r}")
        self.embed_dim, self.hidden_dim, self.proj_dim = int(embed_dim), int(hidden_dim), int(proj_dim)
        self.temperature, self.identity = float(temperature), bool(identity)
        if identity:
            self.query_proj: nn.Module = nn.Identity()
            self.ref_proj: nn.Module = nn.Identity()
        else:
            self.query_proj = DifficultyAdapter(embed_dim, hidden_dim, proj_dim)
            self.ref_proj = DifficultyAdapter(embed_dim, hidden_dim, proj_dim)
        self.calibrator = CalibrationNet()
        self.scale = math.sqrt(embed_dim if identity else proj_dim)

    def config(self) -> dict[str, Any]:
        """Constructor arguments (plain types), for
        :func:`~lit_rlft.selection.difficulty_training.save_predictor`."""
        return {
            "embed_dim": self.embed_dim,
            "hidden_dim": self.hidden_dim,
            "proj_dim": self.proj_dim,
            "temperature": self.temperature,
            "identity": self.identity,
        }

    def adapter_parameters(self) -> list[nn.Parameter]:
        """Parameters of the two adapters (empty when ``identity``)."""
        return [*self.query_proj.parameters(), *self.ref_proj.parameters()]

    def scores(self, query_proj: Tensor, ref_proj: Tensor) -> Tensor:
        """Attention logits from projections: ``[Q, P] x [K, P] -> [Q, K]``, already divided by the temperature."""
        return (query_proj @ ref_proj.T) / (self.scale * self.temperature)

    def attention(self, query_emb: Tensor, ref_emb: Tensor) -> Tensor:
        """Attention weights ``[Q, K]`` (rows sum to 1) of ``query_emb`` ``[Q, D]`` over ``ref_emb`` ``[K, D]``."""
        return torch.softmax(self.scores(self.query_proj(query_emb), self.ref_proj(ref_emb)), dim=-1)

    def forward(self, query_emb: Tensor, ref_emb: Tensor, ref_difficulty: Tensor) -> Tensor:
        """Uncalibrated ``d_hat`` ``[Q]`` from ``query_emb`` ``[Q, D]``, ``ref_emb`` ``[K, D]``, ``ref_difficulty`` ``[K]``."""
        return self.attention(query_emb, ref_emb) @ ref_difficulty.to(query_emb)  # [Q, K] @ [K] -> [Q]

    def calibrate(self, d_hat: Tensor, ref_difficulty: Tensor) -> Tensor:
        """Platt-calibrate ``d_hat`` ``[Q]`` with ``(w, b) = calibrator(ref_difficulty [K])``."""
        w, b = self.calibrator(ref_difficulty)
        return platt_calibrate(d_hat, w, b)


# ---------------------------------------------------------------------------------------------------------------
# Calibration and correlation
# ---------------------------------------------------------------------------------------------------------------
def platt_calibrate(d_hat: Tensor, w: float | Tensor, b: float | Tensor, eps: float = EPS) -> Tensor:
    """``sigmoid(w * logit(clamp(d_hat, eps, 1 - eps)) + b)``, elementwise on ``d_hat`` ``[Q]``."""
    return torch.sigmoid(w * torch.logit(d_hat.clamp(eps, 1.0 - eps)) + b)


def fit_linear_calibration(pred_ref: Tensor | np.ndarray, true_ref: Tensor | np.ndarray) -> tuple[float, float]:
    """Least-squares line ``true ~ slope * pred + intercept`` on the reference set (the reference code's form).

    Args:
        pred_ref: ``[K]`` predicted difficulties of the reference prompts.
        true_ref: ``[K]`` their rolled-out difficulties.

    Returns:
        ``(slope, intercept)``. Degenerate case: when ``pred_ref`` has (numerically) zero variance, or ``K < 2``,
        the line is flat: ``slope = 0, intercept = mean(true_ref)`` (every prediction becomes the reference mean).
    """
    p = np.asarray(torch.as_tensor(pred_ref).detach().cpu(), dtype=np.float64).reshape(-1)
    t = np.asarray(torch.as_tensor(true_ref).detach().cpu(), dtype=np.float64).reshape(-1)
    if p.shape != t.shape or p.size == 0:
        raise ValueError(f"pred_ref and true_ref must be non-empty and of one shape, got {p.shape} and {t.shape}")
    var = float(np.mean((p - p.mean()) ** 2))
    if p.size < 2 or var < 1e-12:
        return 0.0, float(t.mean())
    slope = float(np.mean((p - p.mean()) * (t - t.mean())) / var)
    return slope, float(t.mean() - slope * p.mean())


def apply_linear_calibration(d_hat: Tensor, slope: float, intercept: float) -> Tensor:
    """``clip(slope * d_hat + intercept, 0, 1)`` on ``d_hat`` ``[Q]``."""
    return (slope * d_hat + intercept).clamp(0.0, 1.0)


def pearson(x: Tensor | np.ndarray, y: Tensor | np.ndarray) -> float:
    """Pearson correlation of two ``[n]`` vectors over their jointly finite entries; NaN when fewer than two such
    entries remain or either side has zero variance."""
    a = np.asarray(torch.as_tensor(x).detach().cpu(), dtype=np.float64).reshape(-1)
    b = np.asarray(torch.as_tensor(y).detach().cpu(), dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"pearson needs two vectors of one length, got {a.size} and {b.size}")
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 2:
        return math.nan
    a, b = a[ok] - a[ok].mean(), b[ok] - b[ok].mean()
    denom = math.sqrt(float(np.sum(a * a)) * float(np.sum(b * b)))
    if denom < 1e-12:
        return math.nan
    return float(np.clip(np.sum(a * b) / denom, -1.0, 1.0))


# ---------------------------------------------------------------------------------------------------------------
# Prediction from projections (shared by the selector, evaluation and offline fitting)
# ---------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def _attend(predictor: AttentionDifficultyPredictor, query_proj: Tensor, ref_proj: Tensor, d_ref: Tensor) -> Tensor:
    """Uncalibrated ``d_hat`` ``[Q]`` from projections ``[Q, P]``, ``[K, P]`` and labels ``[K]``, in row chunks."""
    out = [
        torch.softmax(predictor.scores(query_proj[i : i + _CHUNK], ref_proj), dim=-1) @ d_ref
        for i in range(0, query_proj.shape[0], _CHUNK)
    ]
    return torch.cat(out) if out else query_proj.new_zeros(0)


@torch.no_grad()
def calibrated_difficulty(
    predictor: AttentionDifficultyPredictor,
    query_proj: Tensor,
    ref_query_proj: Tensor,
    ref_proj: Tensor,
    d_ref: Tensor,
    calibration: str,
) -> Tensor:
    """Calibrated, clipped predictions ``[Q]``.

    ``ref_query_proj`` ``[K, P]`` is the *query* projection of the reference prompts: the linear calibration
    predicts each reference leave-one-out (attending to the other ``K - 1``) and regresses its true label on it.
    """
    d_hat = _attend(predictor, query_proj, ref_proj, d_ref)  # [Q]
    if calibration == "platt":
        d_hat = predictor.calibrate(d_hat, d_ref)
    elif calibration == "linear":
        k = d_ref.numel()
        if k >= 2:
            s = predictor.scores(ref_query_proj, ref_proj)  # [K, K]
            s = s.masked_fill(torch.eye(k, dtype=torch.bool, device=s.device), -math.inf)
            loo = torch.softmax(s, dim=-1) @ d_ref  # [K] leave-one-out predictions of the references
            slope, intercept = fit_linear_calibration(loo, d_ref)
        else:
            slope, intercept = 1.0, 0.0
        d_hat = apply_linear_calibration(d_hat, slope, intercept)
    return d_hat.clamp(0.0, 1.0)


@torch.no_grad()
def project_embeddings(module: nn.Module, emb: Tensor, chunk: int = _CHUNK) -> Tensor:
    """``module`` applied to ``emb`` ``[n, D]`` in row chunks -> ``[n, P]``."""
    out = [module(emb[i : i + chunk]) for i in range(0, emb.shape[0], chunk)]
    return torch.cat(out) if out else emb.new_zeros(0, 0)


def predict_from_reference(
    predictor: AttentionDifficultyPredictor,
    query_emb: Tensor,
    ref_emb: Tensor,
    ref_difficulty: Tensor,
    calibration: Calibration = "linear",
) -> Tensor:
    """Calibrated predictions ``[Q]`` in [0, 1] for ``query_emb`` ``[Q, D]`` from ``ref_emb`` ``[K, D]`` and
    ``ref_difficulty`` ``[K]`` (no gradient). See :class:`~lit_rlft.selection.dots.DOTSSelector` for the calibration
    forms."""
    check_choice("calibration", calibration, CALIBRATIONS)
    d_ref = ref_difficulty.to(query_emb)
    return calibrated_difficulty(
        predictor,
        project_embeddings(predictor.query_proj, query_emb),
        project_embeddings(predictor.query_proj, ref_emb),
        project_embeddings(predictor.ref_proj, ref_emb),
        d_ref,
        calibration,
    )


def check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"`{option}` must be one of {list(choices)}, got {value!r}")

"""DOTS: difficulty-targeted online selection (``docs/algorithms.md`` section 3). Pure torch / numpy.

Notation (see ``docs/design.md``): ``S`` pool size, ``K`` reference-set size, ``D`` embedding width, ``P`` adapter
projection width (``proj_dim``), ``Q`` prompts whose difficulty is predicted, ``B`` prompts per step.

A prompt's *difficulty* under the current policy is ``d = 1 - p`` with ``p`` its success rate. Every ``mu`` steps
the loop rolls out a uniformly drawn reference set of ``K`` prompts, and the difficulty of every other prompt is
predicted by attention over the reference set::

    s_i   = <ref_proj(z_i), query_proj(z_q)> / sqrt(P)          z = frozen prompt embedding [D]
    a     = softmax(s / temperature)                             over the K references
    d_hat = sum_i a_i d_i                                        then calibrated and clipped to [0, 1]

Prompts are then drawn without replacement with ``P(q) ~ exp(-|d_hat_q - alpha| / tau)`` by Gumbel-top-k in log
space, so a tiny ``tau`` never underflows. The adapters can be fitted offline (:func:`fit_adapters`) or online from
the run's own rollouts (:class:`DOTSSelector` with ``online_fit=True``).

Typical loop (what the DOTS callback does each step ``t``)::

    sel = DOTSSelector(embeddings)                     # [S, D], e.g. from lit_rlft.models.embeddings
    if sel.needs_reference(t):
        ref = sel.reference_ids(rng)                   # [K]
        sel.set_reference(ref, rollout_success_rates(ref))
    ids = sel.select(B, t, rng)                        # [B]
    sel.observe(ids, rollout_success_rates(ids), t)    # diagnostics + online adapter fit
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_rlft.selection.base import check_num_prompts, check_version, validate_batch_size, validate_observation

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
        """Constructor arguments (plain types), for :func:`save_predictor`."""
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
# Calibration, selection weights, sampling, correlation
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


def difficulty_logits(d_hat: Tensor, alpha: float = 0.5, tau: float = 1e-3) -> Tensor:
    """Selection log-weights ``-|d_hat - alpha| / tau`` ``[S]`` (log of DOTS's unnormalised probabilities)."""
    return -(d_hat - alpha).abs() / tau


def sample_without_replacement(
    log_weights: Tensor,
    k: int,
    generator: torch.Generator | None = None,
    exclude: Tensor | None = None,
) -> Tensor:
    """Draw ``k`` distinct indices with probability proportional to ``exp(log_weights)``, sequentially without
    replacement, by Gumbel-top-k: ``argtopk(log_weights + Gumbel noise)``.

    Computed in float64 log space, so it never fails for tiny temperatures: with log-weights around ``-1e9``
    (``tau = 1e-9``) the noise is still resolved and the items with the largest log-weights (closest to alpha)
    win. ``-inf`` / NaN log-weights are allowed and rank last. The noise is drawn for all ``S`` items, so a seeded
    ``generator`` gives the same draw whatever the mask.

    Args:
        log_weights: ``[S]`` unnormalised log-probabilities.
        k: number of indices to draw.
        generator: source of the Gumbel noise (``torch.Generator``, CPU).
        exclude: optional ``[S]`` bool mask of indices that must not be drawn.

    Returns:
        ``[k]`` int64 indices in draw order (the first is the first sequential draw).

    Raises:
        ValueError: if ``k`` exceeds the number of allowed (non-excluded) items, or is negative.
    """
    lw = torch.as_tensor(log_weights).detach().reshape(-1).to("cpu", torch.float64)  # [S]
    n = lw.numel()
    allowed = torch.arange(n)
    if exclude is not None:
        mask = torch.as_tensor(exclude, dtype=torch.bool).reshape(-1).cpu()
        if mask.numel() != n:
            raise ValueError(f"`exclude` has {mask.numel()} entries but there are {n} log-weights")
        allowed = allowed[~mask]
    if int(k) != k or k < 0 or k > allowed.numel():
        raise ValueError(
            f"cannot draw k={k!r} distinct items (the batch size) from {allowed.numel()} allowed items "
            f"({n} in all, {n - allowed.numel()} excluded)"
        )
    u = torch.rand(n, generator=generator, dtype=torch.float64).clamp_min(torch.finfo(torch.float64).tiny)
    keys = torch.nan_to_num(lw, nan=-math.inf) - torch.log(-torch.log(u))  # [S] log w + Gumbel(0, 1)
    top = torch.topk(keys[allowed], int(k), sorted=True).indices  # [k] positions within `allowed`
    return allowed[top].to(torch.long)


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
def _calibrated(
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
def _project(module: nn.Module, emb: Tensor, chunk: int = _CHUNK) -> Tensor:
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
    ``ref_difficulty`` ``[K]`` (no gradient). See :class:`DOTSSelector` for the calibration forms."""
    _check_choice("calibration", calibration, CALIBRATIONS)
    d_ref = ref_difficulty.to(query_emb)
    return _calibrated(
        predictor,
        _project(predictor.query_proj, query_emb),
        _project(predictor.query_proj, ref_emb),
        _project(predictor.ref_proj, ref_emb),
        d_ref,
        calibration,
    )


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
# The strategy
# ---------------------------------------------------------------------------------------------------------------
class DOTSSelector:
    """Difficulty-targeted online selection over a pool of ``S`` prompts with frozen embeddings ``[S, D]``.

    Protocol (see ``lit_rlft.selection.base.SelectionStrategy``) plus the reference-set hooks the callback calls:
    :meth:`needs_reference`, :meth:`reference_ids`, :meth:`set_reference`.

    *Queue.* The paper samples "without replacement for mu batches at a time": when the queue is empty, too short
    for the requested batch, or a fresh reference set arrived, :meth:`select` predicts the whole pool, draws
    ``batch_size * update_every`` distinct ids (fewer if the pool's allowed part is smaller, but at least
    ``batch_size``) by Gumbel-top-k with a ``torch.Generator`` seeded from ``rng.integers(2**63)``, and then serves
    them ``batch_size`` at a time, in draw order. A remainder shorter than the next batch is discarded.

    *Calibration.* ``"linear"`` (reference code): each reference prompt is predicted leave-one-out from the other
    ``K - 1``; a least-squares line from those predictions to the true labels is applied to every prediction
    (flat at the reference mean if the leave-one-out predictions have zero variance). ``"platt"`` (paper):
    ``sigmoid(w * logit(d_hat) + b)`` with ``(w, b)`` from the predictor's :class:`CalibrationNet` of the
    reference labels' mean and std (identity until trained; trained with the adapters when ``online_fit``).
    ``"none"``: raw attention output. Predictions are clipped to [0, 1]; reference prompts get their true label.

    *Online fit.* :meth:`set_reference` and :meth:`observe` add ``(prompt, d = 1 - p)`` pairs to a buffer of the
    ``online_buffer_size`` most recently labelled prompts (newest label per prompt). With ``online_fit``, each
    :meth:`observe` then runs ``online_steps_per_update`` Adam steps on episodes drawn from that buffer: a random
    ``min(K, n // 2)`` of the ``n`` labelled prompts act as references, up to ``online_query_batch`` of the others
    as queries, loss :func:`episodic_bce_loss`. No offline data is needed.

    Args:
        embeddings: ``[S, D]`` frozen prompt embeddings (row ``i`` is prompt id ``i``).
        alpha: target difficulty in [0, 1] (0.5: half the completions correct).
        tau: selection temperature (> 0); smaller is greedier.
        reference_size: ``K``, prompts rolled out per reference set, in [1, S].
        update_every: ``mu`` (>= 1), steps between reference sets; also the number of batches drawn per queue fill.
        temperature_attn: attention temperature of the default predictor (ignored when ``predictor`` is given).
        calibration: ``"linear"``, ``"platt"`` or ``"none"`` (above).
        predictor: a (possibly offline-trained) predictor; default a fresh one seeded by ``seed``.
        online_fit: fit the adapters from the run's own labelled prompts.
        online_lr: Adam learning rate of the online fit.
        online_steps_per_update: Adam steps per :meth:`observe`.
        online_buffer_size: labelled prompts kept for the online fit.
        online_query_batch: most queries per online episode.
        exclude_reference: never select the current reference prompts (their rollouts only label the pool).
        seed: seeds the default predictor's initialisation and the online fit's episode draws.

    Example::

        sel = DOTSSelector(torch.randn(1000, 64), reference_size=128)
        rng = np.random.default_rng(0)
        ref = sel.reference_ids(rng)
        sel.set_reference(ref, np.full(128, 0.5))
        ids = sel.select(32, step=0, rng=rng)  # [32] int64
    """

    VERSION = 1

    def __init__(
        self,
        embeddings: Tensor,
        alpha: float = 0.5,
        tau: float = 1e-3,
        reference_size: int = 256,
        update_every: int = 2,
        temperature_attn: float = 1.0,
        calibration: Calibration = "linear",
        predictor: AttentionDifficultyPredictor | None = None,
        online_fit: bool = True,
        online_lr: float = 1e-3,
        online_steps_per_update: int = 20,
        online_buffer_size: int = 4096,
        online_query_batch: int = 256,
        exclude_reference: bool = True,
        seed: int = 0,
    ) -> None:
        emb = torch.as_tensor(embeddings).detach()
        if emb.ndim != 2 or emb.shape[0] < 1 or emb.shape[1] < 1:
            raise ValueError(f"`embeddings` must be a non-empty [S, D] matrix, got shape {tuple(emb.shape)}")
        self.embeddings = emb.float()  # [S, D]
        num_prompts, dim = self.embeddings.shape
        if not torch.isfinite(self.embeddings).all():
            raise ValueError("`embeddings` contain NaN or infinite values")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"`alpha` must lie in [0, 1], got {alpha!r}")
        if not tau > 0:
            raise ValueError(f"`tau` must be > 0, got {tau!r}")
        if int(reference_size) != reference_size or not 1 <= reference_size <= num_prompts:
            raise ValueError(
                f"`reference_size` must be an integer in [1, {num_prompts}] (the pool size), got {reference_size!r}"
            )
        if int(update_every) != update_every or update_every < 1:
            raise ValueError(f"`update_every` (mu) must be an integer >= 1, got {update_every!r}")
        if not temperature_attn > 0:
            raise ValueError(f"`temperature_attn` must be > 0, got {temperature_attn!r}")
        _check_choice("calibration", calibration, CALIBRATIONS)
        if not online_lr > 0:
            raise ValueError(f"`online_lr` must be > 0, got {online_lr!r}")
        for name, value, low in (
            ("online_steps_per_update", online_steps_per_update, 0),
            ("online_buffer_size", online_buffer_size, 2),
            ("online_query_batch", online_query_batch, 1),
        ):
            if int(value) != value or value < low:
                raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}")
        if predictor is not None and predictor.embed_dim != dim:
            raise ValueError(f"`predictor` expects embeddings of width {predictor.embed_dim}, the pool's are {dim}")

        self.num_prompts, self.embed_dim = int(num_prompts), int(dim)
        self.alpha, self.tau = float(alpha), float(tau)
        self.reference_size, self.update_every = int(reference_size), int(update_every)
        self.calibration: str = calibration
        self.online_fit, self.online_lr = bool(online_fit), float(online_lr)
        self.online_steps_per_update = int(online_steps_per_update)
        self.online_buffer_size, self.online_query_batch = int(online_buffer_size), int(online_query_batch)
        self.exclude_reference = bool(exclude_reference)

        if predictor is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                predictor = AttentionDifficultyPredictor(dim, temperature=temperature_attn)
        self.predictor = predictor.to(self.embeddings.device)
        params = self._trainable_parameters()
        self.optimizer = torch.optim.Adam(params, lr=self.online_lr) if self.online_fit and params else None
        self._fit_rng = np.random.default_rng(seed)

        self._ref_ids: np.ndarray | None = None  # [K] int64
        self._ref_labels: np.ndarray | None = None  # [K] float64 difficulties
        self._refill = True  # a fresh reference arrived: the queue must be redrawn
        self._queue = np.empty(0, dtype=np.int64)  # ids drawn but not served yet
        self._buffer: OrderedDict[int, float] = OrderedDict()  # prompt id -> newest difficulty, oldest first
        self._pool_predictions: Tensor | None = None  # [S] predictions behind the current queue
        self._query_proj: Tensor | None = None  # [S, P] cache, valid until the weights change
        self.last_predictions = np.empty(0, dtype=np.float64)  # [B] predictions for the last observed ids
        self.last_pearson = math.nan
        self.last_fit_loss = math.nan

    # -- reference set --------------------------------------------------------------------------------------------
    def needs_reference(self, step: int) -> bool:
        """True when a reference set must be rolled out before selecting at ``step``: every ``update_every``
        steps (``step % mu == 0``) and whenever no reference labels exist yet."""
        return self._ref_ids is None or step % self.update_every == 0

    def reference_ids(self, rng: np.random.Generator) -> np.ndarray:
        """Draw ``[K]`` distinct int64 ids uniformly from the pool (the caller rolls them out)."""
        return rng.choice(self.num_prompts, size=self.reference_size, replace=False).astype(np.int64)

    def set_reference(self, ids: np.ndarray, success_rates: np.ndarray) -> None:
        """Store the reference labels ``d = 1 - p`` of ``ids`` ``[K]``; they also join the online training set.
        Invalidates the queue, so the next :meth:`select` predicts afresh."""
        ids, rates = validate_observation(ids, success_rates, self.num_prompts)
        if ids.size == 0:
            raise ValueError("the reference set is empty")
        self._ref_ids, self._ref_labels = ids, 1.0 - rates
        self._remember(ids, 1.0 - rates)
        self._refill = True

    @property
    def reference(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(ids [K], difficulties [K])`` of the current reference set, or None before the first."""
        return None if self._ref_ids is None else (self._ref_ids.copy(), self._ref_labels.copy())

    # -- prediction ------------------------------------------------------------------------------------------------
    def invalidate_cache(self) -> None:
        """Drop the cached query projections (call after changing the predictor's weights from outside)."""
        self._query_proj = None

    def _pool_query_proj(self) -> Tensor:
        if self._query_proj is None:
            self._query_proj = _project(self.predictor.query_proj, self.embeddings)  # [S, P]
        return self._query_proj

    @torch.no_grad()
    def predict(self, ids: np.ndarray | None = None) -> Tensor:
        """Calibrated difficulty predictions in [0, 1] from the current reference set.

        Args:
            ids: optional ``[n]`` prompt ids; default the whole pool.

        Returns:
            ``[S]`` (or ``[n]``) float32; reference prompts get their true label.
        """
        if self._ref_ids is None:
            raise RuntimeError("DOTSSelector has no reference set yet: call set_reference(ids, success_rates) first")
        ref = torch.from_numpy(self._ref_ids)
        d_ref = torch.from_numpy(self._ref_labels).float().to(self.embeddings.device)  # [K]
        pool_qp = self._query_proj is not None or ids is None
        if pool_qp:
            qp_all = self._pool_query_proj()
            qp = qp_all if ids is None else qp_all[torch.as_tensor(ids, dtype=torch.long)]
            ref_qp = qp_all[ref]
        else:
            sel = torch.as_tensor(np.asarray(ids, dtype=np.int64))
            qp = _project(self.predictor.query_proj, self.embeddings[sel])
            ref_qp = _project(self.predictor.query_proj, self.embeddings[ref])
        ref_p = _project(self.predictor.ref_proj, self.embeddings[ref])  # [K, P]
        out = _calibrated(self.predictor, qp, ref_qp, ref_p, d_ref, self.calibration)
        # reference prompts: their measured label beats any prediction
        if ids is None:
            out[ref] = d_ref
        else:
            pos = np.full(self.num_prompts, -1, dtype=np.int64)  # [S] position in the reference set, or -1
            pos[self._ref_ids] = np.arange(self._ref_ids.size)
            where = torch.from_numpy(pos[np.asarray(ids, dtype=np.int64).reshape(-1)]).to(out.device)  # [n]
            hit = where >= 0
            out[hit] = d_ref[where[hit]]
        return out.float()

    # -- protocol --------------------------------------------------------------------------------------------------
    def select(self, batch_size: int, step: int, rng: np.random.Generator) -> np.ndarray:
        """Return ``[batch_size]`` distinct int64 ids for ``step`` (see the class docstring for the queue)."""
        batch_size = validate_batch_size(batch_size, self.num_prompts)
        if self._refill or self._queue.size < batch_size:
            preds = self.predict()  # [S]
            self._pool_predictions = preds
            exclude = None
            if self.exclude_reference and self._ref_ids is not None:
                exclude = torch.zeros(self.num_prompts, dtype=torch.bool)
                exclude[torch.from_numpy(self._ref_ids)] = True
            allowed = self.num_prompts - (int(exclude.sum()) if exclude is not None else 0)
            k = max(batch_size, min(batch_size * self.update_every, allowed))
            gen = torch.Generator().manual_seed(int(rng.integers(2**63)))
            logw = difficulty_logits(preds, self.alpha, self.tau)  # [S]
            self._queue = sample_without_replacement(logw, k, gen, exclude).numpy().astype(np.int64)
            self._refill = False
        out, self._queue = self._queue[:batch_size].copy(), self._queue[batch_size:].copy()
        return out

    def observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> None:
        """Record a step's fresh rollouts ``[B]``: diagnostics against the predictions that chose them
        (:attr:`last_predictions`, :attr:`last_pearson`), the online buffer, and (``online_fit``) an adapter fit."""
        ids, rates = validate_observation(prompt_ids, success_rates, self.num_prompts)
        observed = 1.0 - rates
        if self._pool_predictions is not None:
            self.last_predictions = self._pool_predictions[torch.from_numpy(ids)].double().cpu().numpy()
        else:
            self.last_predictions = np.full(ids.size, np.nan)
        self.last_pearson = pearson(self.last_predictions, observed)
        self._remember(ids, observed)
        if self.online_fit:
            self.fit_online()

    def fit_online(self, steps: int | None = None) -> float:
        """Run ``steps`` (default ``online_steps_per_update``) Adam steps on episodes from the online buffer.
        Returns the mean loss (NaN when nothing was trained: no trainable parameters or < 2 labelled prompts)."""
        steps = self.online_steps_per_update if steps is None else int(steps)
        n = len(self._buffer)
        if self.optimizer is None or n < 2 or steps < 1:
            return math.nan
        ids = torch.tensor(list(self._buffer.keys()), dtype=torch.long)  # [n]
        labels = torch.tensor(list(self._buffer.values()), dtype=torch.float32)  # [n]
        n_ref = max(1, min(self.reference_size, n // 2))
        n_query = min(n - n_ref, self.online_query_batch)
        self.predictor.train()
        losses = []
        for _ in range(steps):
            perm = torch.from_numpy(self._fit_rng.permutation(n))
            r, q = perm[:n_ref], perm[n_ref : n_ref + n_query]
            loss = episodic_bce_loss(
                self.predictor,
                self.embeddings[ids[q]],
                labels[q],
                self.embeddings[ids[r]],
                labels[r],
                platt=self.calibration == "platt",
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()))
        self.predictor.eval()
        self.invalidate_cache()
        self.last_fit_loss = float(np.mean(losses))
        return self.last_fit_loss

    # -- state ----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to select exactly what an uninterrupted one would: predictor weights and
        optimiser state, reference set, queue, online buffer, the fit's RNG. Plain types and tensors (copies), so
        ``torch.load(..., weights_only=True)`` reads it back."""
        buffer_ids = list(self._buffer.keys())
        return {
            "version": self.VERSION,
            "num_prompts": self.num_prompts,
            "embed_dim": self.embed_dim,
            "predictor": {k: v.detach().clone() for k, v in self.predictor.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None,
            "ref_ids": None if self._ref_ids is None else torch.from_numpy(self._ref_ids.copy()),
            "ref_labels": None if self._ref_labels is None else torch.from_numpy(self._ref_labels.copy()),
            "refill": self._refill,
            "queue": torch.from_numpy(self._queue.copy()),
            "buffer_ids": torch.tensor(buffer_ids, dtype=torch.int64),
            "buffer_labels": torch.tensor([self._buffer[i] for i in buffer_ids], dtype=torch.float64),
            "fit_rng_state": copy.deepcopy(self._fit_rng.bit_generator.state),
            "pool_predictions": None if self._pool_predictions is None else self._pool_predictions.detach().clone(),
            "last_predictions": torch.from_numpy(self.last_predictions.copy()),
            "last_pearson": self.last_pearson,
            "last_fit_loss": self.last_fit_loss,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; missing optional keys keep their current values."""
        check_version(state, self.VERSION, "DOTSSelector")
        check_num_prompts(state, self.num_prompts, "DOTSSelector")
        if "embed_dim" in state and int(state["embed_dim"]) != self.embed_dim:
            raise ValueError(
                f"DOTSSelector checkpoint has embeddings of width {state['embed_dim']}, not {self.embed_dim}"
            )
        if "predictor" in state:
            self.predictor.load_state_dict(state["predictor"])
        if state.get("optimizer") is not None and self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if "ref_ids" in state:
            self._ref_ids = _array(state["ref_ids"], np.int64)
            self._ref_labels = _array(state.get("ref_labels"), np.float64)
        self._refill = bool(state.get("refill", self._refill))
        if "queue" in state:
            self._queue = _array(state["queue"], np.int64)
        if "buffer_ids" in state:
            ids, labels = _array(state["buffer_ids"], np.int64), _array(state["buffer_labels"], np.float64)
            self._buffer = OrderedDict(zip(ids.tolist(), labels.tolist()))
        if "fit_rng_state" in state:
            self._fit_rng.bit_generator.state = state["fit_rng_state"]
        if "pool_predictions" in state:
            pp = state["pool_predictions"]
            self._pool_predictions = None if pp is None else torch.as_tensor(pp).clone().to(self.embeddings.device)
        if "last_predictions" in state:
            self.last_predictions = _array(state["last_predictions"], np.float64)
        self.last_pearson = float(state.get("last_pearson", self.last_pearson))
        self.last_fit_loss = float(state.get("last_fit_loss", self.last_fit_loss))
        self.invalidate_cache()

    # -- internals ---------------------------------------------------------------------------------------------
    def _trainable_parameters(self) -> list[nn.Parameter]:
        params = self.predictor.adapter_parameters()
        if self.calibration == "platt":
            params += list(self.predictor.calibrator.parameters())
        return params

    def _remember(self, ids: np.ndarray, difficulties: np.ndarray) -> None:
        for i, d in zip(ids.tolist(), difficulties.tolist()):
            self._buffer.pop(i, None)
            self._buffer[i] = d
        while len(self._buffer) > self.online_buffer_size:
            self._buffer.popitem(last=False)


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
        train_calibrator: also train the Platt :class:`CalibrationNet` (use when selecting with ``"platt"``).

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


def _array(value: Any, dtype: type) -> np.ndarray | None:
    """A checkpoint value (tensor, array, list or None) as a fresh 1-D numpy array of ``dtype`` (or None)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    return np.array(value, dtype=dtype).reshape(-1)


def _check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"`{option}` must be one of {list(choices)}, got {value!r}")

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

The pieces live in their own modules and are re-exported here: the predictor and its calibration
(:mod:`lit_rlft.selection.difficulty`), its offline training and persistence
(:mod:`lit_rlft.selection.difficulty_training`) and the sampling (:mod:`lit_rlft.selection.gumbel`).

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
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lit_rlft.selection.allocation import point_spread
from lit_rlft.selection.base import (
    allowed_ids,
    check_num_prompts,
    check_version,
    excluding,
    validate_batch_size,
    validate_observation,
)
from lit_rlft.selection.difficulty import (
    CALIBRATIONS,
    EPS,
    AttentionDifficultyPredictor,
    Calibration,
    CalibrationNet,
    DifficultyAdapter,
    apply_linear_calibration,
    calibrated_difficulty,
    check_choice,
    fit_linear_calibration,
    pearson,
    platt_calibrate,
    predict_from_reference,
    project_embeddings,
)
from lit_rlft.selection.difficulty_training import (
    episodic_bce_loss,
    evaluate_predictor,
    fit_adapters,
    load_predictor,
    save_predictor,
)
from lit_rlft.selection.gumbel import difficulty_logits, sample_without_replacement

__all__ = [
    "CALIBRATIONS",
    "EPS",
    "AttentionDifficultyPredictor",
    "Calibration",
    "CalibrationNet",
    "DOTSSelector",
    "DifficultyAdapter",
    "apply_linear_calibration",
    "difficulty_logits",
    "episodic_bce_loss",
    "evaluate_predictor",
    "fit_adapters",
    "fit_linear_calibration",
    "load_predictor",
    "pearson",
    "platt_calibrate",
    "predict_from_reference",
    "sample_without_replacement",
    "save_predictor",
]


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
        check_choice("calibration", calibration, CALIBRATIONS)
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

    def reference_ids(self, rng: np.random.Generator, exclude: np.ndarray | None = None) -> np.ndarray:
        """Draw ``[K]`` distinct int64 ids uniformly from the pool, none in ``exclude`` (in flight; the caller rolls
        them out)."""
        if not excluding(exclude):
            return rng.choice(self.num_prompts, size=self.reference_size, replace=False).astype(np.int64)
        allowed = allowed_ids(self.num_prompts, exclude, self.reference_size)
        return rng.choice(allowed, size=self.reference_size, replace=False).astype(np.int64)

    def set_reference(self, ids: np.ndarray, success_rates: np.ndarray) -> None:
        """Store the reference labels ``d = 1 - p`` of ``ids`` ``[K]``; they also join the online training set.
        Invalidates the queue, so the next :meth:`select` predicts afresh."""
        ids, rates = validate_observation(ids, success_rates, self.num_prompts)
        if ids.size == 0:
            raise ValueError("the reference set is empty")
        self._ref_ids, self._ref_labels = ids, 1.0 - rates
        self._remember(ids, 1.0 - rates)
        self._refill = True

    def latest_observations(self, k: int | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """``(ids [k], success rates [k])`` of the ``k`` (default ``reference_size``) prompts observed last (newest
        outcome per prompt), or None before any: a reference set that costs no rollouts (``reference="observed"``)."""
        if not self._buffer:
            return None
        items = list(self._buffer.items())[-(k or self.reference_size):]
        return (np.array([i for i, _ in items], dtype=np.int64),
                1.0 - np.array([d for _, d in items], dtype=np.float64))

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
            self._query_proj = project_embeddings(self.predictor.query_proj, self.embeddings)  # [S, P]
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
            qp = project_embeddings(self.predictor.query_proj, self.embeddings[sel])
            ref_qp = project_embeddings(self.predictor.query_proj, self.embeddings[ref])
        ref_p = project_embeddings(self.predictor.ref_proj, self.embeddings[ref])  # [K, P]
        out = calibrated_difficulty(self.predictor, qp, ref_qp, ref_p, d_ref, self.calibration)
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

    def spread_probabilities(self, prompt_ids: np.ndarray, n_max: int, group_size: int) -> np.ndarray:
        """``[n, n_max + 1]`` probability that a group of ``0 .. n_max`` completions of each prompt has both outcomes,
        from the predicted success rate ``1 - d`` taken as known (:func:`~lit_rlft.selection.allocation.point_spread`;
        ``group_size`` unused)."""
        return point_spread(1.0 - self.predict(np.asarray(prompt_ids, dtype=np.int64)).cpu().double().numpy(), n_max)

    # -- protocol --------------------------------------------------------------------------------------------------
    def select(self, batch_size: int, step: int, rng: np.random.Generator,
               exclude: np.ndarray | None = None) -> np.ndarray:
        """Return ``[batch_size]`` distinct int64 ids for ``step`` (see the class docstring for the queue), none in
        ``exclude`` (in flight: dropped from the queue, masked when it is refilled)."""
        batch_size = validate_batch_size(batch_size, self.num_prompts)
        skip = excluding(exclude)
        if skip:
            self._queue = self._queue[~np.isin(self._queue, np.asarray(sorted(skip), dtype=np.int64))]
        if self._refill or self._queue.size < batch_size:
            preds = self.predict()  # [S]
            self._pool_predictions = preds
            masked = None
            if (self.exclude_reference and self._ref_ids is not None) or skip:
                masked = torch.zeros(self.num_prompts, dtype=torch.bool)
                if self.exclude_reference and self._ref_ids is not None:
                    masked[torch.from_numpy(self._ref_ids)] = True
                if skip:
                    masked[torch.as_tensor(sorted(skip), dtype=torch.long)] = True
            allowed = self.num_prompts - (int(masked.sum()) if masked is not None else 0)
            if allowed < batch_size:
                raise ValueError(f"DOTS: only {allowed} prompts are neither reference nor in flight, fewer than the "
                                 f"batch size {batch_size}: lower reference_size or model.asynchronous.depth")
            k = max(batch_size, min(batch_size * self.update_every, allowed))
            gen = torch.Generator().manual_seed(int(rng.integers(2**63)))
            logw = difficulty_logits(preds, self.alpha, self.tau)  # [S]
            self._queue = sample_without_replacement(logw, k, gen, masked).numpy().astype(np.int64)
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


def _array(value: Any, dtype: type) -> np.ndarray | None:
    """A checkpoint value (tensor, array, list or None) as a fresh 1-D numpy array of ``dtype`` (or None)."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    return np.array(value, dtype=dtype).reshape(-1)

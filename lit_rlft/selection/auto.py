"""How much of each batch a selector should pick: an online controller of the selected share (Lightning-free).

Each step's batch is split in two: a share ``s`` picked by a selector (DPS, MoPPS, GRESO, DOTS, ...) and the rest
drawn uniformly from the pool, the *control slice*. Both slices are trained on; the control slice is also the
measurement: a uniform sample of the pool under the current policy, which is what a uniform run would have trained
on at this step. After each step the controller compares what a completion of each slice is worth and moves ``s``
towards the slice that is worth more:

- **Informative share** ``e``: the share of a slice's groups whose rewards differ (GRPO's gradient comes only from
  them). Selection pays by raising it; it is estimated per slice from exponentially discounted counts with a
  Laplace prior, ``e = (I + 1) / (N + 2)`` (``I`` informative groups of ``N``, discounted by ``1 - 1 / horizon``
  per step), so a slice with no evidence counts 1/2.
- **Transfer** ``tau`` (:class:`Transfer`): how much of what the policy gains on the prompts it trains on it also
  gains on prompts it never trains on, ``slope(held-back success) / slope(trained-pool success)`` over the run,
  clipped to ``[0, 1]``: a held-back slice of the pool probed now and then against the control slice's success,
  the held-back slope counted at one standard error above its estimate (``tau`` stays at 1 until the evidence
  says otherwise).
  Selection concentrates the update on the prompts it picks; once the policy fits what it trains on faster than it
  generalises (``tau`` falls: the training reward rises, held-out accuracy does not), the extra signal the selector
  finds goes into memorising them.
- The **signal** ``R = tau * e_sel / e_ctrl``: the selected slice's informative completions per completion, counted
  as far as learning transfers, over the control slice's. ``R > 1``: the selector's completions teach more than
  uniform's; ``R < 1``: they do not. The selector the user chose is given the benefit of the doubt: the share
  moves by ``log R + z se(log e_sel / e_ctrl)``, the informative ratio's standard error from its discounted counts
  (``se(log e)^2 = (1 - e) / (e (N + 2))``), so a few noisy steps early in the run, before the selector has
  learned anything, do not take its share away.

The share moves in logit space, ``logit(s) += rate * clip(log R + z se, -log 2, log 2)``, bounded to
``[min_selected, 1 - min_control]``: bounded steps, no threshold in passes or steps. Both slices keep a share, so
both stay measured (the selector's probe can earn its share back; the control slice never stops measuring).

The controller also reports the selector's **coverage** ``D = 1 / (S q)``, ``q`` the collision probability of its
recent draws (``1 / S`` for uniform draws over ``S`` prompts): how concentrated the selector is (a diagnostic; the
decision does not use it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lit_rlft.selection.base import check_num_prompts, check_version, validate_num_prompts

__all__ = ["ShareController", "ShareSignal", "Transfer", "probe_variance", "split_batch"]

_LOG2 = math.log(2.0)


@dataclass(frozen=True)
class ShareSignal:
    """What the controller measured after a step and the share it chose.

    Attributes:
        share: the selected share of the next batch, in ``[min_selected, 1 - min_control]``.
        ratio: ``R = transfer * informative_selected / informative_control`` (the signal).
        informative_selected: ``e_sel``, the selected slice's discounted informative share.
        informative_control: ``e_ctrl``, the control slice's.
        transfer: ``tau`` in ``[0, 1]`` (1 until it is measured).
        coverage: ``D``, the pool's share the selector's recent draws cover (1 = uniform's; a diagnostic).
    """

    share: float
    ratio: float
    informative_selected: float
    informative_control: float
    transfer: float
    coverage: float

    def metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}/share": self.share, f"{prefix}/signal": self.ratio,
                f"{prefix}/informative_selected": self.informative_selected,
                f"{prefix}/informative_control": self.informative_control, f"{prefix}/transfer": self.transfer,
                f"{prefix}/coverage": self.coverage}


class ShareController:
    """The selected share of each batch, moved online by the selected and control slices' value per completion.

    Args:
        num_prompts: ``S``, the pool size.
        initial_share: the share before any evidence.
        min_selected: the least share the selector keeps (its probe, so it can earn its share back).
        min_control: the least share drawn uniformly (the measurement never stops).
        rate: logit change per unit of ``log R`` per step.
        horizon: steps of the discounted counts (each step's counts decay by ``1 - 1 / horizon``).
        z: standard errors of the informative ratio given to the selector (0: the point estimate).
    """

    def __init__(self, num_prompts: int, initial_share: float = 0.5, min_selected: float = 0.125,
                 min_control: float = 0.125, rate: float = 0.25, horizon: float = 32.0, z: float = 1.0):
        self.num_prompts = validate_num_prompts(num_prompts)
        if not 0.0 < min_selected < 1.0 or not 0.0 < min_control < 1.0 or min_selected + min_control >= 1.0:
            raise ValueError("`min_selected` and `min_control` must lie in (0, 1) with min_selected + min_control "
                             f"< 1, got min_selected={min_selected}, min_control={min_control}")
        if not min_selected <= initial_share <= 1.0 - min_control:
            raise ValueError(f"`initial_share` must lie in [min_selected, 1 - min_control] = [{min_selected}, "
                             f"{1.0 - min_control}], got {initial_share}")
        if not rate > 0.0:
            raise ValueError(f"`rate` must be > 0, got {rate}")
        if not horizon >= 1.0:
            raise ValueError(f"`horizon` must be >= 1 step, got {horizon}")
        if not z >= 0.0:
            raise ValueError(f"`z` must be >= 0, got {z}")
        self.z = float(z)
        self.min_selected, self.min_control = float(min_selected), float(min_control)
        self.rate, self.horizon = float(rate), float(horizon)
        self.decay = 1.0 - 1.0 / self.horizon
        self.logit = _logit(float(initial_share))
        self.informative = np.zeros(2)  # discounted informative groups: [selected, control]
        self.groups = np.zeros(2)  # discounted groups: [selected, control]
        self.counts = np.zeros(self.num_prompts)  # c: discounted draws of each prompt by the selected slice
        self.weight = 0.0  # sum w over the selected draws
        self.weight_sq = 0.0  # sum w^2 over the selected draws
        self.last: ShareSignal | None = None

    @property
    def share(self) -> float:
        """The selected share of the next batch."""
        return _sigmoid(self.logit)

    def informative_shares(self) -> tuple[float, float]:
        """``(e_sel, e_ctrl)``: the discounted informative shares with their Laplace prior."""
        e = (self.informative + 1.0) / (self.groups + 2.0)
        return float(e[0]), float(e[1])

    def ratio_error(self) -> float:
        """``se(log e_sel / e_ctrl)``: the informative ratio's standard error, from the discounted counts."""
        e = (self.informative + 1.0) / (self.groups + 2.0)
        return float(math.sqrt(np.sum((1.0 - e) / (e * (self.groups + 2.0)))))

    def coverage(self) -> float:
        """``D = min(1, 1 / (S q))``: 1 until two of the selected draws fall on the same prompt."""
        pairs = self.weight ** 2 - self.weight_sq
        if pairs <= 1e-12:
            return 1.0
        q = (float(np.dot(self.counts, self.counts)) - self.weight_sq) / pairs
        return 1.0 if q <= 0.0 else min(1.0, 1.0 / (self.num_prompts * q))

    def observe(self, selected_ids: np.ndarray, selected_rates: np.ndarray, control_rates: np.ndarray,
                transfer: float = 1.0) -> ShareSignal:
        """Take one step's outcomes and move the share.

        Args:
            selected_ids: ``[n_sel]`` int64 ids of the selected slice's prompts (distinct).
            selected_rates: ``[n_sel]`` their groups' success rates.
            control_rates: ``[n_ctrl]`` the control slice's.
            A group is informative when its rate lies strictly between 0 and 1 (its rewards differ).
            transfer: ``tau`` in ``[0, 1]`` (:attr:`Transfer.value`).

        Returns:
            The signal and the new share (also kept as :attr:`last`).
        """
        ids = np.asarray(selected_ids, dtype=np.int64).reshape(-1)
        sel = np.asarray(selected_rates, dtype=np.float64).reshape(-1)
        ctrl = np.asarray(control_rates, dtype=np.float64).reshape(-1)
        if ids.shape != sel.shape:
            raise ValueError(f"got {ids.size} selected ids but {sel.size} selected rates")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_prompts):
            raise ValueError(f"prompt ids must lie in [0, {self.num_prompts - 1}], got [{ids.min()}, {ids.max()}]")
        d = self.decay
        self.informative = d * self.informative + [_informative(sel), _informative(ctrl)]
        self.groups = d * self.groups + [sel.size, ctrl.size]
        self.counts *= d
        np.add.at(self.counts, ids, 1.0)
        self.weight = d * self.weight + ids.size
        self.weight_sq = d * d * self.weight_sq + ids.size
        e_sel, e_ctrl = self.informative_shares()
        if not 0.0 <= transfer <= 1.0:
            raise ValueError(f"`transfer` must lie in [0, 1], got {transfer}")
        coverage = self.coverage()
        ratio = max(transfer * e_sel / e_ctrl, 1e-6)
        step = self.rate * min(_LOG2, max(-_LOG2, math.log(ratio) + self.z * self.ratio_error()))
        self.logit = min(_logit(1.0 - self.min_control), max(_logit(self.min_selected), self.logit + step))
        self.last = ShareSignal(self.share, ratio, e_sel, e_ctrl, float(transfer), coverage)
        return self.last

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "num_prompts": self.num_prompts, "logit": self.logit,
                "informative": self.informative.copy(), "groups": self.groups.copy(), "counts": self.counts.copy(),
                "weight": self.weight, "weight_sq": self.weight_sq}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_version(state, 1, "ShareController")
        check_num_prompts(state, self.num_prompts, "ShareController")
        self.logit = float(state["logit"])
        self.informative = np.asarray(state["informative"], dtype=np.float64).copy()
        self.groups = np.asarray(state["groups"], dtype=np.float64).copy()
        self.counts = np.asarray(state["counts"], dtype=np.float64).copy()
        self.weight, self.weight_sq = float(state["weight"]), float(state["weight_sq"])


class Transfer:
    """``tau``: the slope of the held-back prompts' success over the slope of the trained pool's, both over the run.

    The held-back success is probed now and then (:meth:`add_probe`: a fixed set of pool prompts that is never
    trained on, rolled out under the current policy); the trained pool's comes free from the control slice (a
    uniform sample of the pool: :meth:`add_pool`, one mean success per step). Each slope is the least-squares slope
    against the step. The held-back slope is the noisy one (a few prompts, a few completions each), so it is counted
    at its upper bound, ``b_held + z * se(b_held)`` (``se`` from the probes' binomial variances): ``tau`` stays at 1
    until the evidence says the held-back prompts gain less than the trained ones::

        tau = clip((b_held + z * se(b_held)) / b_pool, 0, 1)

    1 while either has fewer than ``min_points`` points or the pool's success is not rising (nothing learned, so
    nothing that fails to transfer).

    Args:
        min_points: probes (and control slices) before ``tau`` is measured.
        z: standard errors of the held-back slope given the benefit of the doubt (0: the point estimate).
    """

    def __init__(self, min_points: int = 4, z: float = 1.0):
        if int(min_points) != min_points or min_points < 2:
            raise ValueError(f"`min_points` must be an integer >= 2 (a slope needs two), got {min_points!r}")
        if not z >= 0.0:
            raise ValueError(f"`z` must be >= 0, got {z}")
        self.min_points, self.z = int(min_points), float(z)
        self.probes: list[tuple[float, float, float]] = []  # (step, held-back success, its variance)
        self.pool: list[tuple[float, float, float]] = []  # (step, control slice success, groups)

    def add_probe(self, step: int, success: float, variance: float = 0.0) -> None:
        """One probe: the held-back prompts' mean success at ``step`` and the variance of that mean."""
        if not variance >= 0.0:
            raise ValueError(f"a probe's variance must be >= 0, got {variance}")
        self.probes.append((float(step), float(success), float(variance)))

    def add_pool(self, step: int, success: float, groups: int) -> None:
        if groups > 0:
            self.pool.append((float(step), float(success), float(groups)))

    def held_slope(self) -> tuple[float, float]:
        """``(b_held, se(b_held))``: the held-back success's slope per step and its standard error."""
        probes = np.array(self.probes)
        x, y, v = probes[:, 0], probes[:, 1], probes[:, 2]
        dx = x - x.mean()
        sxx = float(np.sum(dx * dx))
        if sxx <= 0.0:
            return 0.0, 0.0
        return float(np.sum(dx * (y - y.mean())) / sxx), float(math.sqrt(np.sum(dx * dx * v)) / sxx)

    @property
    def value(self) -> float:
        if len(self.probes) < self.min_points or len(self.pool) < self.min_points:
            return 1.0
        held, se = self.held_slope()
        pool = np.array(self.pool)
        trained = _slope(pool[:, 0], pool[:, 1], pool[:, 2])
        if not trained > 0.0:
            return 1.0
        return float(min(1.0, max(0.0, (held + self.z * se) / trained)))

    def state_dict(self) -> dict[str, Any]:
        return {"probes": [list(p) for p in self.probes], "pool": [list(p) for p in self.pool]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.probes = [tuple(float(v) for v in p) for p in state["probes"]]
        self.pool = [tuple(float(v) for v in p) for p in state["pool"]]


def probe_variance(rates: np.ndarray, num_generations: int) -> float:
    """The variance of the mean of ``K`` success rates ``[K]``, each from ``num_generations`` completions:
    ``sum r (1 - r) / (G - 1) / K^2`` (the unbiased binomial estimate; 0 for ``G = 1``)."""
    rates = np.asarray(rates, dtype=np.float64).reshape(-1)
    if rates.size == 0 or num_generations < 2:
        return 0.0
    return float(np.sum(rates * (1.0 - rates)) / (num_generations - 1) / rates.size ** 2)


def _slope(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    """Weighted least-squares slope of ``y`` on ``x`` (0 when ``x`` does not vary)."""
    w = np.ones_like(x) if w is None else w
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    var = float(np.sum(w * (x - xm) ** 2))
    return 0.0 if var <= 0.0 else float(np.sum(w * (x - xm) * (y - ym)) / var)


def split_batch(selected: np.ndarray, share: float, rng: np.random.Generator,
                draw_uniform: Any) -> tuple[np.ndarray, np.ndarray]:
    """Keep ``round(share * B)`` of the selector's batch ``[B]`` and fill the rest with uniform draws.

    Args:
        selected: the selector's batch ``[B]`` (distinct ids, best first or in any order).
        share: the selected share in ``[0, 1]``.
        rng: chooses which of the selector's ids are kept.
        draw_uniform: ``(n, used) -> ids [<= n]``: the next ids of the uniform order not in ``used``
            (:meth:`lit_rlft.data.plan.BatchPlan.draw_unused`).

    Returns:
        ``(kept [k], control [B - k])``: the selector's kept ids (in their order) and the uniform draws. When the
        uniform order has fewer unused ids than asked (a tiny pool), the selector's ids fill the rest, as kept.
    """
    selected = np.asarray(selected, dtype=np.int64)
    keep = int(round(share * selected.size))
    order = rng.permutation(selected.size)
    kept, dropped = selected[np.sort(order[:keep])], selected[np.sort(order[keep:])]
    need = selected.size - keep
    control = (np.asarray(draw_uniform(need, set(kept.tolist())), dtype=np.int64) if need > 0
               else np.zeros(0, dtype=np.int64))
    short = need - control.size
    if short > 0:
        kept = np.concatenate([kept, dropped[:short]])
    return kept, control


def _informative(rates: np.ndarray) -> float:
    return float(np.count_nonzero((rates > 0.0) & (rates < 1.0)))


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))

"""Skywork-OR1's adaptive entropy coefficient (TRL's ``use_adaptive_entropy``), as a small stateful controller.

The loss subtracts ``c * H`` (``H`` the mean entropy of the loss tokens, see :class:`lit_rlft.core.losses.GRPOLoss`).
With adaptive control ``c`` moves by ``entropy_coef_delta`` after every optimizer step, toward keeping the entropy
at ``entropy_target``, and is applied only while the entropy is at or below the target::

    after step k, with H_k the global mean entropy of that step's loss tokens:
        c <- min(c + delta, c_max)  if H_k <= target  else  max(c - delta, c_min)
    coefficient applied during step k + 1:  c  if H_k <= target  else  0      (0 before the first measurement)

``H_k`` must be global (summed over micro-batches and ranks before dividing) so that every rank holds the same
``c``: feed :meth:`AdaptiveEntropyCoef.update` the sums that :attr:`lit_rlft.core.losses.LossOutput.entropy_stats`
reports.
"""

from __future__ import annotations

import math
from typing import Any


class AdaptiveEntropyCoef:
    """The entropy coefficient ``c`` over training: constant, or adapted toward ``entropy_target``.

    Args:
        entropy_coef: the (initial) coefficient ``c``.
        adaptive: TRL's ``use_adaptive_entropy``; False keeps ``c`` constant.
        entropy_coef_min: lower bound of ``c`` (adaptive).
        entropy_coef_max: upper bound of ``c`` (adaptive).
        entropy_coef_delta: step of ``c`` per optimizer step (adaptive).
        entropy_target: target mean per-token entropy in nats (adaptive).

    Example:
        >>> ctl = AdaptiveEntropyCoef(0.01, adaptive=True, entropy_target=0.5)
        >>> ctl.apply_coef()  # no measurement yet
        0.0
        >>> ctl.update(0.4)  # below target: c grows and is applied
        >>> round(ctl.coef, 3), round(ctl.apply_coef(), 3)
        (0.015, 0.015)
    """

    def __init__(self, entropy_coef: float = 0.0, adaptive: bool = False, entropy_coef_min: float = 0.0,
                 entropy_coef_max: float = 1.0, entropy_coef_delta: float = 0.005,
                 entropy_target: float = 0.2) -> None:
        if entropy_coef_min > entropy_coef_max:
            raise ValueError(f"`entropy_coef_min` ({entropy_coef_min!r}) must be <= `entropy_coef_max` "
                             f"({entropy_coef_max!r})")
        if entropy_coef_delta < 0:
            raise ValueError(f"`entropy_coef_delta` must be >= 0, got {entropy_coef_delta!r}")
        self.coef = float(entropy_coef)
        self.adaptive = adaptive
        self.entropy_coef_min = entropy_coef_min
        self.entropy_coef_max = entropy_coef_max
        self.entropy_coef_delta = entropy_coef_delta
        self.entropy_target = entropy_target
        self.last_entropy = math.inf
        """The global mean entropy of the last step; ``inf`` before the first (no bonus then, as in TRL)."""

    @classmethod
    def from_loss(cls, loss: Any) -> AdaptiveEntropyCoef:
        """The controller configured by a :class:`lit_rlft.core.losses.GRPOLoss`'s entropy fields."""
        return cls(loss.entropy_coef, loss.use_adaptive_entropy, loss.entropy_coef_min, loss.entropy_coef_max,
                   loss.entropy_coef_delta, loss.entropy_target)

    @property
    def enabled(self) -> bool:
        """Whether the loss needs the bonus term at all (a non-zero or adaptive coefficient)."""
        return self.adaptive or self.coef != 0.0

    def apply_coef(self) -> float:
        """The coefficient to pass to the loss during the current step (``GRPOLoss(..., entropy_coef=...)``)."""
        if not self.adaptive:
            return self.coef
        return self.coef if self.last_entropy <= self.entropy_target else 0.0

    def update(self, mean_entropy: float) -> None:
        """After an optimizer step: move ``c`` from the step's *global* mean entropy (a no-op when not adaptive).

        Compute ``mean_entropy`` as ``sum(entropy_stats[0]) / max(sum(entropy_stats[1]), 1)`` over the step's
        micro-batches and ranks.
        """
        if not self.adaptive:
            return
        if mean_entropy <= self.entropy_target:
            self.coef = min(self.coef + self.entropy_coef_delta, self.entropy_coef_max)
        else:
            self.coef = max(self.coef - self.entropy_coef_delta, self.entropy_coef_min)
        self.last_entropy = float(mean_entropy)

    def state_dict(self) -> dict[str, float]:
        """Plain floats: the coefficient and the last measured entropy."""
        return {"entropy_coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore :meth:`state_dict`; a missing key keeps the current value."""
        self.coef = float(state.get("entropy_coef", self.coef))
        self.last_entropy = float(state.get("last_entropy", self.last_entropy))

    def __repr__(self) -> str:
        return (f"AdaptiveEntropyCoef(coef={self.coef}, adaptive={self.adaptive}, "
                f"last_entropy={self.last_entropy}, target={self.entropy_target})")

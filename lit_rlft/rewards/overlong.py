"""DAPO's soft overlong punishment (Eq. 13): a length penalty in the last ``L_cache`` tokens before the limit.

With ``L_max = max_completion_length``, ``L_cache = soft_punish_cache`` and ``|y|`` the completion's length in
tokens::

    R(y) = 0                                  if |y| <= L_max - L_cache
           ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max      (from 0 down to -1)
           -1                                 if |y| > L_max

It only penalises, never rewards short answers; add it to the task reward (``reward_funcs`` with weights). When to
use it: long-reasoning runs where many completions hit the limit, to teach the policy to finish in time without
the noise of a hard -1 for every truncation (DAPO: ``L_max`` 20,480 with ``L_cache`` 4,096; the same as TRL's
``get_soft_overlong_punishment``).

The length is in *tokens*, which the text alone does not give: the function reads the column ``completion_length``
(``list[int]``, one per completion) that the rollout worker passes to every reward function next to the data set's
columns. YAML::

    reward_funcs:
      - lit_rlft.rewards.countdown_reward
      - class_path: lit_rlft.rewards.SoftOverlongPunishment
        init_args: {max_completion_length: 1024, soft_punish_cache: 256}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["SoftOverlongPunishment", "soft_overlong_punishment"]


def soft_overlong_punishment(completions: list[str], completion_length: Sequence[int] | None = None, *,
                             max_completion_length: int, soft_punish_cache: int, **columns: Any) -> list[float]:
    """DAPO's soft overlong punishment of each completion (see the module doc for the formula).

    Args:
        completions: ``N`` generated texts (only their number is used).
        completion_length: ``N`` completion lengths in tokens (the ``completion_length`` column).
        max_completion_length: ``L_max``, the generation length limit.
        soft_punish_cache: ``L_cache``, the length of the penalty ramp before the limit; 0 gives no ramp (only
            ``|y| > L_max`` is punished).
        **columns: other data set columns, ignored.

    Returns:
        ``N`` rewards in ``[-1, 0]``.

    Example:
        >>> soft_overlong_punishment(["a", "b", "c"], [70, 90, 100], max_completion_length=100,
        ...                          soft_punish_cache=20)
        [0.0, -0.5, -1.0]
    """
    if completion_length is None:
        raise ValueError("soft_overlong_punishment needs the `completion_length` column (completion lengths in "
                         "tokens), which the rollout worker passes to reward functions")
    if len(completion_length) != len(completions):
        raise ValueError(f"`completion_length` has {len(completion_length)} entries for {len(completions)} "
                         "completions")
    start = max_completion_length - soft_punish_cache  # L_max - L_cache: the ramp starts after it
    rewards = []
    for length in completion_length:
        if length <= start:
            rewards.append(0.0)
        elif length <= max_completion_length:
            rewards.append((start - length) / soft_punish_cache)
        else:
            rewards.append(-1.0)
    return rewards


class SoftOverlongPunishment:
    """:func:`soft_overlong_punishment` with fixed ``L_max`` and ``L_cache``, for YAML (``class_path`` + ``init_args``).

    Args:
        max_completion_length: ``L_max``; use the module's ``max_completion_length``.
        soft_punish_cache: ``L_cache`` (DAPO: a fifth of ``L_max``); 0 punishes only ``|y| > L_max``.
        name: name under which the runner logs this reward.
    """

    def __init__(self, max_completion_length: int, soft_punish_cache: int,
                 name: str = "soft_overlong_punishment") -> None:
        if max_completion_length <= 0:
            raise ValueError(f"`max_completion_length` must be > 0, got {max_completion_length!r}")
        if not 0 <= soft_punish_cache <= max_completion_length:
            raise ValueError(f"`soft_punish_cache` must be in [0, max_completion_length={max_completion_length}], "
                             f"got {soft_punish_cache!r}")
        self.max_completion_length = int(max_completion_length)
        self.soft_punish_cache = int(soft_punish_cache)
        self.name = name

    def __call__(self, completions: list[str], completion_length: Sequence[int] | None = None,
                 **columns: Any) -> list[float]:
        """Score ``completions`` from their ``completion_length`` column."""
        return soft_overlong_punishment(completions, completion_length,
                                        max_completion_length=self.max_completion_length,
                                        soft_punish_cache=self.soft_punish_cache)

    def __repr__(self) -> str:
        return (f"SoftOverlongPunishment(max_completion_length={self.max_completion_length}, "
                f"soft_punish_cache={self.soft_punish_cache}, name={self.name!r})")

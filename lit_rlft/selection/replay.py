"""Rollout Replay (RR): a FIFO buffer of whole, effective groups, replayed next to fresh rollouts.

Each step rolls out fresh completions for a fraction ``delta`` of the batch's ``B`` prompts and draws the other
groups uniformly at random from this buffer (algorithms.md, section 2). The buffer

- holds whole groups (prompt, ``G`` completions, behaviour log-probs per token, rewards, correctness, the step that
  generated them): :class:`StoredGroup`;
- admits only *effective* groups, ``0 < success_rate < 1`` (only those give GRPO a non-zero gradient);
- keeps at most one group per prompt, the newest: re-adding a prompt replaces its group and moves it to the back;
- drops the oldest group when full (FIFO);
- samples uniformly without replacement with its own ``numpy`` generator, whose state is part of
  :meth:`ReplayBuffer.state_dict`, so a resumed run samples exactly what an uninterrupted one would.

Notation: ``B`` groups in a rollout batch, ``G`` completions per prompt, ``P`` prompt tokens (unpadded here),
``L_i`` tokens of completion ``i`` (unpadded here), ``C`` buffer capacity.

Pure torch / numpy: no Lightning. The Lightning adapter is ``lit_rlft.callbacks`` (``ReplayCallback``).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["ReplayBuffer", "StoredGroup", "validate_replay_config"]

_STATE_VERSION = 1


@dataclass
class StoredGroup:
    """One prompt's whole group of ``G`` completions, as generated.

    Tensors carry no padding; ``P`` is the prompt length and ``L_i`` the length of completion ``i``.
    """

    prompt_id: int
    """Id of the prompt in the data set's pool."""
    prompt_tokens: torch.Tensor
    """``[P]`` long: the prompt's token ids, no padding."""
    completion_tokens: list[torch.Tensor]
    """``G`` tensors ``[L_i]`` long: completion token ids, no padding (EOS included if generated)."""
    behaviour_logprobs: list[torch.Tensor]
    """``G`` tensors ``[L_i]`` float32: log-prob of each completion token under the policy that generated it."""
    rewards: torch.Tensor
    """``[G]`` float32: total reward of each completion (shaped rewards allowed)."""
    correct: torch.Tensor
    """``[G]`` bool: whether each completion is correct (reward >= success threshold)."""
    step: int
    """Training step that generated the group."""
    policy_masks: list[torch.Tensor] | None = None
    """``G`` tensors ``[L_i]`` long: 1 on the policy's own tokens of each completion, 0 on observations inside it
    (multi-turn episodes); None: every completion token is the policy's."""

    @property
    def num_generations(self) -> int:
        """``G``, the number of completions in the group."""
        return int(self.rewards.shape[0])

    @property
    def success_rate(self) -> float:
        """Fraction of correct completions, ``mean(correct)``; 0.0 for an empty group."""
        if self.correct.numel() == 0:
            return 0.0
        return float(self.correct.float().mean().item())

    @property
    def is_effective(self) -> bool:
        """True when ``0 < success_rate < 1``: the group gives GRPO a non-zero gradient."""
        return 0.0 < self.success_rate < 1.0

    def validate(self) -> None:
        """Check shapes and dtypes; raise ``ValueError`` / ``TypeError`` naming the offending field."""
        pid = self.prompt_id
        if not isinstance(self.prompt_tokens, torch.Tensor) or self.prompt_tokens.dim() != 1:
            raise ValueError(
                f"prompt {pid}: `prompt_tokens` must be a 1-D tensor [P], got {_describe(self.prompt_tokens)}"
            )
        if not isinstance(self.rewards, torch.Tensor) or self.rewards.dim() != 1 or self.rewards.numel() == 0:
            raise ValueError(
                f"prompt {pid}: `rewards` must be a non-empty 1-D tensor [G], got {_describe(self.rewards)}"
            )
        g = self.rewards.shape[0]
        if not self.rewards.is_floating_point():
            raise TypeError(f"prompt {pid}: `rewards` must be a float tensor, got dtype {self.rewards.dtype}")
        if not isinstance(self.correct, torch.Tensor) or tuple(self.correct.shape) != (g,):
            raise ValueError(
                f"prompt {pid}: `correct` must have shape [G]=[{g}] like `rewards`, got {_describe(self.correct)}"
            )
        if self.correct.dtype != torch.bool:
            raise TypeError(f"prompt {pid}: `correct` must be a bool tensor, got dtype {self.correct.dtype}")
        for name in ("completion_tokens", "behaviour_logprobs"):
            seq = getattr(self, name)
            if not isinstance(seq, (list, tuple)) or len(seq) != g:
                length = len(seq) if isinstance(seq, (list, tuple)) else type(seq).__name__
                raise ValueError(
                    f"prompt {pid}: `{name}` must be a list of G={g} tensors (one per reward), got {length}"
                )
        for i, (tokens, logprobs) in enumerate(zip(self.completion_tokens, self.behaviour_logprobs)):
            if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1:
                raise ValueError(
                    f"prompt {pid}: `completion_tokens[{i}]` must be a 1-D tensor [L_i], got {_describe(tokens)}"
                )
            if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 1:
                raise ValueError(
                    f"prompt {pid}: `behaviour_logprobs[{i}]` must be a 1-D tensor [L_i], got {_describe(logprobs)}"
                )
            if logprobs.shape[0] != tokens.shape[0]:
                raise ValueError(
                    f"prompt {pid}: `behaviour_logprobs[{i}]` has {logprobs.shape[0]} entries but "
                    f"`completion_tokens[{i}]` has {tokens.shape[0]} tokens; they must match"
                )
            if not logprobs.is_floating_point():
                raise TypeError(f"prompt {pid}: `behaviour_logprobs[{i}]` must be float, got dtype {logprobs.dtype}")
        masks = self.policy_masks
        if masks is not None and (len(masks) != g or any(m.shape != t.shape
                                                         for m, t in zip(masks, self.completion_tokens))):
            raise ValueError(f"prompt {pid}: `policy_masks` must be G={g} tensors shaped like `completion_tokens`")

    def to_cpu(self) -> StoredGroup:
        """A copy whose tensors are detached and on the CPU (no data copy for tensors already there)."""
        return dataclasses.replace(
            self,
            prompt_id=int(self.prompt_id),
            prompt_tokens=self.prompt_tokens.detach().cpu(),
            completion_tokens=[t.detach().cpu() for t in self.completion_tokens],
            behaviour_logprobs=[t.detach().cpu() for t in self.behaviour_logprobs],
            rewards=self.rewards.detach().cpu(),
            correct=self.correct.detach().cpu(),
            step=int(self.step),
            policy_masks=None if self.policy_masks is None else [t.detach().cpu() for t in self.policy_masks],
        )

    def state_dict(self) -> dict[str, Any]:
        """Plain types and a few packed tensors: completions are concatenated, ``[sum_i L_i]``, plus ``[G]`` lengths."""
        return {
            "prompt_id": int(self.prompt_id),
            "prompt_tokens": self.prompt_tokens,  # [P]
            "completion_lengths": torch.tensor([t.shape[0] for t in self.completion_tokens], dtype=torch.long),  # [G]
            "completion_tokens": torch.cat(list(self.completion_tokens)),  # [sum_i L_i]
            "behaviour_logprobs": torch.cat(list(self.behaviour_logprobs)),  # [sum_i L_i]
            "rewards": self.rewards,  # [G]
            "correct": self.correct,  # [G]
            "step": int(self.step),
            **({} if self.policy_masks is None else {"policy_masks": torch.cat(list(self.policy_masks))}),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> StoredGroup:
        """Inverse of :meth:`state_dict`."""
        lengths = [int(n) for n in state["completion_lengths"].tolist()]  # G lengths L_i
        return cls(
            prompt_id=int(state["prompt_id"]),
            prompt_tokens=state["prompt_tokens"],
            completion_tokens=[t.clone() for t in torch.split(state["completion_tokens"], lengths)],
            behaviour_logprobs=[t.clone() for t in torch.split(state["behaviour_logprobs"], lengths)],
            rewards=state["rewards"],
            correct=state["correct"],
            step=int(state["step"]),
            policy_masks=[t.clone() for t in torch.split(state["policy_masks"], lengths)]
            if "policy_masks" in state else None,
        )


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {list(x.shape)}"
    return type(x).__name__


class ReplayBuffer:
    """FIFO buffer of at most ``capacity`` effective groups, one per prompt, sampled uniformly.

    Args:
        capacity: maximum number of groups ``C`` held (256 or 512 in the RR paper); the oldest is dropped first.
        seed: seed of the buffer's own ``numpy`` generator used by :meth:`sample`.

    Example::

        buffer = ReplayBuffer(capacity=256, seed=0)
        buffer.add_many(fresh_groups)                        # only effective groups are admitted
        replayed = buffer.sample(num_replay, exclude_prompt_ids={g.prompt_id for g in fresh_groups})

    Stored tensors are detached CPU tensors; :meth:`sample` returns the stored objects themselves, which callers
    must not modify in place.
    """

    def __init__(self, capacity: int, seed: int = 0) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"`capacity` must be an integer >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.seed = int(seed)
        self._rng = np.random.default_rng(self.seed)
        self._groups: OrderedDict[int, StoredGroup] = OrderedDict()  # prompt_id -> group, oldest first
        # Running counters, for logging; part of the state.
        self.num_admitted = 0  # groups admitted by add()
        self.num_rejected = 0  # groups refused as not effective
        self.num_replaced = 0  # admissions that replaced an older group of the same prompt
        self.num_evicted = 0  # groups dropped because the buffer was full

    # ----------------------------------------------------------------------------------------------------------
    # Adding
    # ----------------------------------------------------------------------------------------------------------
    def add(self, group: StoredGroup) -> bool:
        """Store ``group`` if it is effective (``0 < success_rate < 1``); return whether it was admitted.

        A prompt already stored has its group replaced by this one, which moves to the back of the FIFO (it is now
        the newest). When the buffer is over capacity, the oldest group is dropped. A non-effective group is refused
        and leaves any group already stored for its prompt in place.

        Raises:
            ValueError / TypeError: if the group's tensors have inconsistent shapes or wrong dtypes.
        """
        group.validate()
        if not group.is_effective:
            self.num_rejected += 1
            return False
        group = group.to_cpu()
        pid = group.prompt_id
        if pid in self._groups:
            del self._groups[pid]
            self.num_replaced += 1
        self._groups[pid] = group
        self.num_admitted += 1
        while len(self._groups) > self.capacity:
            self._groups.popitem(last=False)
            self.num_evicted += 1
        return True

    def add_many(self, groups: Iterable[StoredGroup]) -> int:
        """:meth:`add` each group in order; return how many were admitted."""
        return sum(self.add(group) for group in groups)

    # ----------------------------------------------------------------------------------------------------------
    # Sampling
    # ----------------------------------------------------------------------------------------------------------
    def sample(
        self, k: int, exclude_prompt_ids: Iterable[int] | np.ndarray | torch.Tensor | None = None
    ) -> list[StoredGroup]:
        """Draw ``min(k, available)`` groups uniformly at random, without replacement.

        Args:
            k: number of groups wanted (``>= 0``).
            exclude_prompt_ids: prompts not to draw, typically those rolled out fresh in the same batch, so that
                no prompt appears twice in one batch.

        Returns:
            The drawn groups, in the random order drawn (not FIFO order). Fewer than ``k`` when fewer are available;
            the caller decides how to fill the batch.

        Deterministic given the buffer's state: candidates are taken in FIFO order, then chosen with the buffer's
        generator. The generator is not advanced when nothing can be drawn.
        """
        if k < 0:
            raise ValueError(f"`k` must be >= 0, got {k}")
        excluded = _as_id_set(exclude_prompt_ids)
        candidates = [pid for pid in self._groups if pid not in excluded]  # FIFO order
        n = min(int(k), len(candidates))
        if n == 0:
            return []
        chosen = self._rng.choice(len(candidates), size=n, replace=False)
        return [self._groups[candidates[int(i)]] for i in chosen]

    # ----------------------------------------------------------------------------------------------------------
    # Inspection
    # ----------------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._groups

    def get(self, prompt_id: int) -> StoredGroup | None:
        """The stored group of ``prompt_id``, or None."""
        return self._groups.get(int(prompt_id))

    def prompt_ids(self) -> list[int]:
        """Stored prompt ids in FIFO order, oldest first."""
        return list(self._groups)

    def ages(self, step: int) -> np.ndarray:
        """``[len(self)]`` int64: ``step - group.step`` for each stored group, oldest first."""
        return np.fromiter((step - g.step for g in self._groups.values()), dtype=np.int64, count=len(self._groups))

    def stats(self, step: int) -> dict[str, float]:
        """Metrics for logging (e.g. under ``replay/``); age and success-rate entries are 0.0 when empty.

        Keys: ``size``, ``capacity``, ``fill`` (size / capacity), ``age_mean``, ``age_max``, ``age_min``,
        ``success_rate_mean``, and the running counters ``admitted``, ``rejected``, ``replaced``, ``evicted``.
        """
        ages = self.ages(step)
        rates = [g.success_rate for g in self._groups.values()]
        return {
            "size": float(len(self)),
            "capacity": float(self.capacity),
            "fill": len(self) / self.capacity,
            "age_mean": float(ages.mean()) if ages.size else 0.0,
            "age_max": float(ages.max()) if ages.size else 0.0,
            "age_min": float(ages.min()) if ages.size else 0.0,
            "success_rate_mean": float(np.mean(rates)) if rates else 0.0,
            "admitted": float(self.num_admitted),
            "rejected": float(self.num_rejected),
            "replaced": float(self.num_replaced),
            "evicted": float(self.num_evicted),
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, size={len(self)}, seed={self.seed})"

    # ----------------------------------------------------------------------------------------------------------
    # Checkpointing
    # ----------------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain python values and tensors (``torch.save``-able, loadable with ``weights_only=True``).

        Holds the version, capacity, seed, generator state, counters and the groups in FIFO order.
        """
        return {
            "version": _STATE_VERSION,
            "capacity": self.capacity,
            "seed": self.seed,
            "rng_state": self._rng.bit_generator.state,
            "counters": {
                "admitted": self.num_admitted,
                "rejected": self.num_rejected,
                "replaced": self.num_replaced,
                "evicted": self.num_evicted,
            },
            "groups": [group.state_dict() for group in self._groups.values()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore contents, FIFO order, generator state and counters exactly.

        This buffer keeps its own ``capacity``: when the saved buffer holds more groups than that, the oldest are
        dropped, and any capacity change is reported with a warning.
        """
        version = int(state.get("version", 1))
        if version > _STATE_VERSION:
            raise ValueError(
                f"replay buffer state has version {version}, newer than this code supports ({_STATE_VERSION})"
            )
        groups = [StoredGroup.from_state_dict(g) for g in state["groups"]]
        for group in groups:
            group.validate()
        saved_capacity = int(state.get("capacity", self.capacity))
        if saved_capacity != self.capacity:
            dropped = max(0, len(groups) - self.capacity)
            warnings.warn(
                f"replay buffer restored with `capacity`={self.capacity} but saved with {saved_capacity}: "
                f"dropping the {dropped} oldest of {len(groups)} stored groups",
                UserWarning,
                stacklevel=2,
            )
        if len(groups) > self.capacity:
            groups = groups[len(groups) - self.capacity :]
        self._groups = OrderedDict((g.prompt_id, g) for g in groups)
        self.seed = int(state.get("seed", self.seed))
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng_state"]
        counters = state.get("counters", {})
        self.num_admitted = int(counters.get("admitted", 0))
        self.num_rejected = int(counters.get("rejected", 0))
        self.num_replaced = int(counters.get("replaced", 0))
        self.num_evicted = int(counters.get("evicted", 0))


def _as_id_set(ids: Iterable[int] | np.ndarray | torch.Tensor | None) -> set[int]:
    if ids is None:
        return set()
    if isinstance(ids, (np.ndarray, torch.Tensor)):
        return {int(i) for i in ids.reshape(-1).tolist()}
    return {int(i) for i in ids}


def validate_replay_config(delta: float, capacity: int, batch_size: int) -> tuple[int, int]:
    """Check a rollout-replay setting and split a batch of ``B`` groups into fresh and replayed parts.

    Args:
        delta: fraction of the batch rolled out fresh each step, in ``(0, 1]`` (0.5 in the RR paper).
        capacity: replay buffer capacity ``C``.
        batch_size: ``B``, groups (prompts) per rollout batch.

    Returns:
        ``(num_fresh, num_replay)`` with ``num_fresh = max(1, ceil(delta * B))`` and ``num_replay = B - num_fresh``.
        Rounding goes towards fresh rollouts (never fewer fresh prompts than ``delta`` asks for, and at least one,
        since only fresh rollouts feed the buffer); ``delta * B`` is rounded to 9 decimals first so that float
        noise (``0.3 * 10 = 3.0000000000000004``) does not add a prompt.

    Raises:
        ValueError: ``delta`` outside ``(0, 1]``, ``batch_size < 1``, or ``capacity`` below ``max(1, num_replay)``,
            the number of groups one step draws from the buffer.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"`batch_size` must be an integer >= 1, got {batch_size!r}")
    if not (0.0 < delta <= 1.0):  # also rejects NaN
        raise ValueError(f"`delta` (fraction of fresh rollouts per batch) must be in (0, 1], got {delta!r}")
    num_fresh = min(batch_size, max(1, math.ceil(round(delta * batch_size, 9))))
    num_replay = batch_size - num_fresh
    needed = max(1, num_replay)
    if capacity < needed:
        raise ValueError(
            f"`capacity`={capacity} is too small: with delta={delta} and batch_size={batch_size}, each step replays "
            f"{num_replay} groups, so `capacity` must be at least {needed}"
        )
    return num_fresh, num_replay

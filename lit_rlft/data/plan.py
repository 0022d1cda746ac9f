"""The batch plan: which prompt ids the next training step rolls out.

Lightning reads one batch ahead (and loader workers more), so the train loader does not carry prompts: it yields a
lightweight step token, and the module asks the plan for the prompt ids when the step *runs*. Selection callbacks
write the next step's ids with :meth:`BatchPlan.schedule` from ``on_train_batch_end``; without one, batches are
uniform without replacement per epoch. The plan lives in the datamodule, whose ``state_dict`` is part of every
checkpoint, so a resumed run trains exactly on what the uninterrupted run would have.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.selection.uniform import UniformSampler


class BatchPlan:
    """Prompt ids for upcoming steps over a pool of ``num_prompts`` prompts with ids ``0..S-1``.

    Args:
        num_prompts: pool size ``S``.
        batch_size: prompts per step when nobody scheduled anything.
        seed: seed of the default uniform sampler.
    """

    def __init__(self, num_prompts: int, batch_size: int, seed: int = 0):
        if batch_size < 1 or batch_size > num_prompts:
            raise ValueError(
                f"data.batch_size ({batch_size}) must be between 1 and the training pool size ({num_prompts})"
            )
        self.num_prompts = num_prompts
        self.batch_size = batch_size
        self.uniform = UniformSampler(num_prompts, seed=seed)
        self._scheduled: np.ndarray | None = None
        self._scheduled_by: str | None = None
        self.last_scheduled_by = "uniform"
        self.in_flight: set[int] = set()  # asynchronous rollouts: dispatched, outcome not yet observed (not drawn)

    def schedule(self, prompt_ids: np.ndarray | list[int], by: str) -> None:
        """Make ``prompt_ids`` ``[b]`` the next step's prompts (replaces anything scheduled before)."""
        ids = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError(f"{by}: scheduled an empty batch")
        if ids.min() < 0 or ids.max() >= self.num_prompts:
            raise ValueError(f"{by}: prompt id out of range [0, {self.num_prompts})")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"{by}: scheduled duplicate prompt ids")
        self._scheduled, self._scheduled_by = ids, by

    @property
    def scheduled(self) -> np.ndarray | None:
        """What the next :meth:`next_batch` will return, if a callback scheduled it."""
        return self._scheduled

    @property
    def scheduled_by(self) -> str | None:
        """Who (``by``) scheduled :attr:`scheduled` (None when nothing is scheduled)."""
        return self._scheduled_by

    def next_batch(self) -> np.ndarray:
        """Ids ``[b]`` for the step that is starting: the scheduled ones, else a uniform batch."""
        if self._scheduled is not None:
            ids, self.last_scheduled_by = self._scheduled, self._scheduled_by or "scheduled"
            self._scheduled = self._scheduled_by = None
            return ids
        self.last_scheduled_by = "uniform"
        if not self.in_flight:
            return self.uniform.select(self.batch_size, step=0)
        ids = self.draw_unused(self.batch_size, set())  # skips what is in flight
        if ids.size < self.batch_size:
            raise RuntimeError(f"the training pool ({self.num_prompts} prompts, {len(self.in_flight)} in flight) has "
                               f"too few prompts left for a batch of {self.batch_size}: lower "
                               "model.asynchronous.depth or data.batch_size")
        return ids

    def draw_unused(self, n: int, used: set[int], max_tries: int = 4) -> np.ndarray:
        """Up to ``n`` extra ids ``[<=n]`` from the uniform order that are not in ``used`` nor in flight
        (dynamic-sampling rounds, replay fill-ins). Advances the uniform sampler, so it is part of the checkpointed
        state."""
        used = used | self.in_flight if self.in_flight else used
        out: list[int] = []
        for _ in range(max_tries):
            for i in self.uniform.select(n, step=0).tolist():
                if i not in used and i not in out:
                    out.append(i)
            if len(out) >= n:
                break
        return np.asarray(out[:n], dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "num_prompts": self.num_prompts,
            "uniform": self.uniform.state_dict(),
            "scheduled": None if self._scheduled is None else self._scheduled.tolist(),
            "scheduled_by": self._scheduled_by,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("num_prompts", self.num_prompts) != self.num_prompts:
            raise ValueError(
                f"checkpoint was made with a training pool of {state['num_prompts']} prompts, this run has "
                f"{self.num_prompts}: resume with the same data"
            )
        self.uniform.load_state_dict(state["uniform"])
        sched = state.get("scheduled")
        self._scheduled = None if sched is None else np.asarray(sched, dtype=np.int64)
        self._scheduled_by = state.get("scheduled_by")

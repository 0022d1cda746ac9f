"""BatchCompositionLogger: what a selection strategy actually trains on, bucket by bucket.

A selection strategy changes *which* prompts a step trains on; this callback makes that visible in TensorBoard by
splitting every trained batch by one column of the training pool (``difficulty``, a MATH ``level``, a data
``source``...). Per bucket ``v`` of column ``c`` it logs, after every step:

- ``composition/<c>_<v>/share``: fraction of the trained groups (fresh and replayed) from bucket ``v``;
- ``composition/<c>_<v>/effective_share``: fraction of the trained groups that are from bucket ``v`` *and*
  informative (``0 < success rate < 1``). Summed over buckets this is the batch's effective ratio.
- ``composition/<c>_<v>/success_rate``: mean success rate of the bucket's groups (only when it has any).

and, whatever the column: ``composition/distinct_prompts`` (distinct prompts trained on so far, fresh or replayed)
and ``composition/repeat_share`` (fraction of this step's fresh prompts that were trained on before): a strategy
that keeps re-selecting the same prompts trains on fewer distinct ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.step.context import StepContext, StepOutput

#: More distinct values than this means the column is not a bucket (an id, a free-text field).
MAX_BUCKETS = 32


class BatchCompositionLogger(StepCallback):
    """Log the trained batch's share of each value of a pool column (see the module docstring for the tags).

    Example::

        trainer = L.Trainer(callbacks=[DOTSCallback(...), BatchCompositionLogger("difficulty")])

    Args:
        column: a column of the training pool (the datamodule's ``reward_columns``), with at most
            :data:`MAX_BUCKETS` distinct values.
        prefix: the tag prefix.
    """

    def __init__(self, column: str = "difficulty", prefix: str = "composition"):
        self.column, self.prefix = column, prefix
        self.buckets: list[Any] = []
        self._seen: set[int] = set()  # prompt ids trained on so far

    def setup_step(self, ctx: StepContext) -> None:
        pool = ctx.data.train_pool
        values = self._column(ctx.data.reward_columns(pool.ids, "train"))
        self.buckets = sorted(set(values), key=str)
        if len(self.buckets) > MAX_BUCKETS:
            raise ValueError(f"BatchCompositionLogger(column={self.column!r}): the training pool has "
                             f"{len(self.buckets)} distinct values (at most {MAX_BUCKETS}); pick a bucket column")

    def _column(self, rows: dict[str, list[Any]]) -> list[Any]:
        if self.column not in rows:
            raise KeyError(f"BatchCompositionLogger(column={self.column!r}): the training pool has no such column; "
                           f"it has {', '.join(sorted(rows))}")
        return rows[self.column]

    def composition(self, values: list[Any], success_rates: np.ndarray) -> dict[str, float]:
        """The metrics for one batch: ``values[b]`` is group ``b``'s bucket, ``success_rates[b]`` its rate."""
        p = np.asarray(success_rates, dtype=np.float64)
        n = max(1, len(values))
        informative = (p > 0.0) & (p < 1.0)
        out: dict[str, float] = {}
        for v in self.buckets:
            mask = np.array([x == v for x in values], dtype=bool)
            tag = f"{self.prefix}/{self.column}_{v}"
            out[f"{tag}/share"] = float(mask.sum() / n)
            out[f"{tag}/effective_share"] = float((mask & informative).sum() / n)
            if mask.any():
                out[f"{tag}/success_rate"] = float(p[mask].mean())
        return out

    def recurrence(self, prompt_ids: list[int], is_replay: list[bool]) -> dict[str, float]:
        """Update the set of trained prompts with one batch; ``repeat_share`` counts fresh groups only."""
        fresh = [int(i) for i, rep in zip(prompt_ids, is_replay, strict=True) if not rep]
        repeat = sum(i in self._seen for i in fresh) / len(fresh) if fresh else 0.0
        self._seen.update(int(i) for i in prompt_ids)
        return {f"{self.prefix}/distinct_prompts": float(len(self._seen)), f"{self.prefix}/repeat_share": repeat}

    def state_dict(self) -> dict[str, Any]:
        return {"seen": sorted(self._seen)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._seen = {int(i) for i in state_dict.get("seen", [])}

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        r = output.record.trained_batch()  # the global batch, every rank's groups
        values = self._column(ctx.data.reward_columns(r.prompt_ids.numpy(), "train"))
        metrics = self.composition(values, r.success_rates.numpy())
        metrics.update(self.recurrence(r.prompt_ids.tolist(), r.is_replay.tolist()))
        ctx.log(metrics)

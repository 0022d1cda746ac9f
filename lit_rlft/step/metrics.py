"""Metrics that must be right on any number of ranks.

- :class:`ValidationMetrics`: held-out mean@k, pass@k and reward, overall and per difficulty, as torchmetrics
  ``MeanMetric`` states that each rank updates with its own share of the validation prompts and that are summed
  across ranks when computed (the padding rows of an uneven split are never counted).
- :func:`rollout_metrics`: the TRL-named statistics of a training batch, from the gathered record (rewards, success)
  and this rank's rollouts (lengths, reduced across ranks).
- :func:`step_metrics`: every scalar a step logs (those, the loss's, the budget, reward failures, episodes, times),
  and :class:`NoSignalWarning`, said when a batch carries no learning signal.

Notation: ``b`` prompts on this rank, ``k`` samples per prompt, ``G`` completions per group.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lit_rlft.core.advantages import effective_ratio, keep_mask, masked_std
from lit_rlft.core.types import OutcomeRecord, Rollouts
from lit_rlft.runtime.distributed import Collective
from lit_rlft.step.reward_failures import episode_metrics

if TYPE_CHECKING:
    from lit_rlft.step.sharded import ShardedRollouts


class ValidationMetrics(nn.Module):
    """Mean@k accuracy, pass@k and mean reward of validation prompts, overall and per difficulty bucket.

    Every rank calls :meth:`update` with its own prompts; :meth:`compute` syncs the states across ranks (torchmetrics
    sums the weighted totals), so the result is the mean over all prompts whatever the number of ranks.

    Args:
        k: samples per prompt (``eval_num_generations``), for the ``pass@k`` name.
        buckets: the difficulty values of the validation pool (the same list on every rank: a metric is synced by
            position, so every rank must hold the same metrics).
    """

    def __init__(self, k: int, buckets: list[Any]):
        super().__init__()
        self.k = k
        self.buckets = list(buckets)
        names = ["accuracy", f"pass@{k}", "reward"] + [f"accuracy/difficulty_{b}" for b in self.buckets]
        self.names = names
        self.means = nn.ModuleList([MeanMetric(nan_strategy="error").set_dtype(torch.float64) for _ in names])
        self.counts = torch.zeros(len(names), dtype=torch.long)  # local prompts per metric (for val/n/...)

    def update(self, correct: Tensor, rewards: Tensor, difficulty: list[Any] | None = None) -> None:
        """Add ``b`` prompts: ``correct`` ``[b, k]`` bool, ``rewards`` ``[b, k]``, ``difficulty`` ``[b]`` (or None)."""
        if correct.shape[0] == 0:
            return
        acc = correct.float().mean(dim=1)  # [b] mean@k
        values = [acc, correct.any(dim=1).float(), rewards.float().mean(dim=1)]
        for i, v in enumerate(values):
            self._add(i, v)
        if difficulty is not None:
            for j, bucket in enumerate(self.buckets):
                mask = torch.tensor([d == bucket for d in difficulty], dtype=torch.bool)
                if mask.any():
                    self._add(3 + j, acc[mask])

    def _add(self, i: int, values: Tensor) -> None:
        metric = self.means[i]
        metric.update(values.to(metric.device))
        self.counts[i] += values.numel()

    def compute(self) -> dict[str, float]:
        """``{name: mean}`` over all ranks' prompts, plus ``n/accuracy...`` counts; names nobody updated are left out."""
        counts = self._global_counts()
        out: dict[str, float] = {}
        for name, metric, n in zip(self.names, self.means, counts):
            if n == 0:
                continue
            out[name] = float(metric.compute())
            if name.startswith("accuracy"):
                out[f"n/{name}"] = float(n)
        return out

    def _global_counts(self) -> list[int]:
        import torch.distributed as dist

        counts = self.counts.clone()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = self.means[0].device
            counts = counts.to(device)
            dist.all_reduce(counts)  # every rank calls compute at the same point
        return [int(c) for c in counts.cpu()]

    def reset(self) -> None:
        for metric in self.means:
            metric.reset()
        self.counts.zero_()


def rollout_metrics(rollouts: Rollouts, trained: OutcomeRecord, collective: Collective) -> dict[str, float]:
    """TRL-named statistics of the batch trained on: rewards from the global ``trained`` record, completion lengths
    from every rank's ``rollouts`` (this rank's, reduced across ranks)."""
    r, members = trained.rewards, trained.members  # [B_global, G] each (members: None when every group is full)
    lengths = rollouts.completion_mask[rollouts.member_rows()].sum(dim=1).float()  # [N_local] real completions
    local = {"sum": float(lengths.sum()), "n": float(lengths.numel()), "min": float(lengths.min()),
             "max": float(lengths.max()), "clipped": float(rollouts.truncated.float().sum())}
    parts = collective.all_gather(local)
    n = sum(p["n"] for p in parts)
    if members is None and r.shape[1] > 1:
        reward, reward_std = float(r.mean()), float(r.std(dim=1).mean())
        accuracy = float(trained.correct.float().mean())
    else:  # over real completions; each group's std over its own members (0 for a group of one)
        members = trained.member_mask()
        m = members.float()
        reward, accuracy = float((r * m).sum() / m.sum()), float((trained.correct.float() * m).sum() / m.sum())
        reward_std = float(masked_std(r.float(), members, dim=1).mean())
    return {
        "reward": reward,
        "reward_std": reward_std,
        "accuracy": accuracy,
        # max == min rather than std == 0: the float std of equal rewards such as 0.1 need not be exactly 0
        "frac_reward_zero_std": float(1.0 - keep_mask(r.numpy(), None if members is None else
                                                      members.numpy()).mean()),
        "effective_ratio": effective_ratio(trained.success_rates.numpy()),
        "completions/mean_length": float(sum(p["sum"] for p in parts) / max(n, 1.0)),
        "completions/min_length": float(min(p["min"] for p in parts)),
        "completions/max_length": float(max(p["max"] for p in parts)),
        "completions/clipped_ratio": float(sum(p["clipped"] for p in parts) / max(n, 1.0)),
        "batch/groups": float(trained.num_groups),
        "batch/replayed_groups": float(trained.is_replay.sum()),
    }



def step_metrics(rollouts: Rollouts, record: OutcomeRecord, trained: OutcomeRecord, loss_metrics: dict[str, float],
                 sharded: ShardedRollouts, sync_s: float, seconds: float) -> dict[str, float]:
    """The scalars of one step: :func:`rollout_metrics` of the ``trained`` batch, the loss's statistics (reduced over
    ranks), the budget, each reward function's mean over the fresh groups of ``record`` and the failure totals, the
    episodes' means, the generation / weight-sync / step times, and ``batch/no_signal``."""
    coll = sharded.collective
    metrics = rollout_metrics(rollouts, trained, coll)
    metrics.update(coll.reduce_metrics(loss_metrics))
    metrics.update(sharded.budget.metrics())
    fresh = record.fresh()
    metrics.update({f"rewards/{k}/mean": float(np.nanmean(v.numpy())) for k, v in fresh.reward_per_func.items()
                    if v.numel() and not bool(torch.isnan(v).all())})
    metrics.update({f"rewards/{k}": float(v) for k, v in sharded.reward_failures.totals.items()})
    metrics.update(episode_metrics(sharded.costs.episodes))
    metrics["time/generation_s"] = sharded.costs.generation_s
    metrics["time/weight_sync_s"] = sync_s
    if sharded.source.last_sync_bytes is not None:  # sources with weights of their own (vLLM)
        metrics["perf/weight_sync_mib"] = sharded.source.last_sync_bytes / 2**20
    metrics.update(sharded.source.metrics())
    metrics["time/step_s"] = seconds
    metrics["time/generation_share"] = sharded.costs.generation_s / max(seconds, 1e-9)
    if coll.is_distributed:
        metrics["dist/world_size"] = float(coll.world_size)
    metrics["batch/no_signal"] = float(metrics["frac_reward_zero_std"] == 1.0)
    return metrics


class NoSignalWarning:
    """Says (rank 0, at most once per ``interval_s``) that a batch had no group with reward variance."""

    def __init__(self, interval_s: float = 60.0):
        self.interval_s = interval_s
        self._last = -math.inf

    def __call__(self, trained: OutcomeRecord, step: int, rank: int) -> None:
        now = time.monotonic()
        if rank != 0 or now - self._last < self.interval_s:
            return
        self._last = now
        rates = trained.success_rates.numpy()
        warnings.warn(
            f"step {step}: no group of the {len(rates)} trained has reward variance "
            f"({int((rates >= 1).sum())} all solved, {int((rates <= 0).sum())} all unsolved): the batch carries no "
            "learning signal (every advantage is 0). Logged as batch/no_signal; if it persists, the data are too "
            "easy or too hard for the policy, or the reward never fires (check rewards/<name>/mean).",
            UserWarning, stacklevel=3)

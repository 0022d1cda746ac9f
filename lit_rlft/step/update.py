"""The policy update of a GRPO step, without Lightning: the clipped loss over iterations, mini- and micro-batches.

Notation: ``N`` sequences on this rank (``B_local * G``), ``L`` completion length, ``W`` ranks.

:class:`PolicyUpdater` runs ``num_iterations`` passes; each pass shuffles this rank's ``N`` rows (when there are
several mini-batches), splits them into ``num_mini_batches`` mini-batches and makes one optimizer step per
mini-batch, accumulating gradients over micro-batches of ``micro_batch_size`` rows. What differs between the
Trainer, Fabric and plain PyTorch (how to backward, skip gradient sync, clip, step) sits behind
:class:`UpdateBackend`; how ranks agree on normalisation goes through a :class:`~lit_rlft.step.distributed.Collective`.

Global normalisation. A mini-batch's loss is normalised by the *global* weight of that mini-batch (its tokens for
``loss_type="dapo"``, its sequences otherwise), summed over ranks, and every rank multiplies its share by ``W``
because data-parallel strategies average gradients over ranks. So ``W`` ranks each holding a slice of a global batch
compute the gradient that one rank holding the whole batch computes (up to float rounding)::

    grad = sum_r  W * sum_{micro in rank r} loss_micro * w_micro / w_global   /  W      (DDP/FSDP's mean)
         = sum_{all micro-batches} loss_micro * w_micro / w_global                    (one rank, same batch)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import numpy as np
import torch
from torch import Tensor, nn

from lit_rlft.core.logprobs import completion_logprobs
from lit_rlft.core.losses import GRPOLoss, LossOutput
from lit_rlft.core.types import Rollouts
from lit_rlft.step.distributed import Collective, LocalCollective

RefLogprobs = Callable[[Rollouts, Tensor], "Tensor | None"]
"""``(rollouts, rows [n]) -> [n, L]`` reference log-probs (or None without a KL penalty)."""


class NonFiniteUpdateError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient; training stops."""


class UpdateBackend(Protocol):
    """What the updater asks of the training loop (Trainer glue, Fabric loop or plain PyTorch)."""

    @property
    def model(self) -> nn.Module:
        """The module whose forward computes training log-probs (the policy, or its data-parallel wrapper)."""
        ...

    @property
    def device(self) -> torch.device: ...

    def backward(self, loss: Tensor) -> None:
        """``loss.backward()`` the loop's way (mixed-precision scaling, DDP's reducer...)."""
        ...

    def no_sync(self) -> AbstractContextManager:
        """A context in which backward accumulates gradients locally, without syncing them across ranks."""
        ...

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip the global gradient norm to ``max_norm``; return the norm before clipping (the same on every rank:
        the gradients are synced). ``max_norm=inf`` only measures."""
        ...

    def optimizer_step(self) -> None:
        """Step the optimizer and the learning-rate scheduler."""
        ...

    def zero_grad(self) -> None: ...

    def learning_rate(self) -> float: ...


def sequence_logprobs(
    model: nn.Module, rollouts: Rollouts, rows: Tensor, temperature: float, device: torch.device | str,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs ``[n, L]`` (and entropy ``[n, L]``) of the completions at ``rows`` ``[n]`` under ``model``.

    Positions are computed as ``generate`` computes them under left padding, so these match the sampling log-probs.
    """
    prompt, comp = rollouts.prompt_tokens[rows], rollouts.completion_tokens[rows]
    attn = torch.cat([rollouts.prompt_mask[rows], rollouts.completion_mask[rows]], dim=1).to(device)  # [n, P+L]
    input_ids = torch.cat([prompt, comp], dim=1).to(device)  # [n, P+L]
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)  # [n, P+L]
    length = comp.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids,
                   logits_to_keep=length + 1).logits[:, :-1]  # [n, L, V]
    logprobs, entropy = completion_logprobs(logits, comp.to(device), temperature)
    return logprobs, (entropy if with_entropy else None)


class PolicyUpdater:
    """``num_iterations x num_mini_batches`` optimizer steps of the GRPO loss over one rollout batch.

    Args:
        loss_fn: the per-micro-batch loss (clipped surrogate, KL, off-policy correction).
        temperature: sampling temperature, applied to training logits as well (TRL does the same).
        num_iterations: passes over the batch (PPO epochs).
        num_mini_batches: optimizer steps per pass.
        micro_batch_size: rows per forward/backward (``None``: the whole mini-batch).
        max_grad_norm: clip the global gradient norm (0 = off).
        max_nonfinite_skips: stop (:class:`NonFiniteUpdateError`) after this many consecutive optimizer steps with
            a non-finite loss or gradient (0 = never stop).

    Numerical faults: when the global gradient norm of a mini-batch is NaN or infinite (a NaN loss gives one), its
    gradient is dropped before the optimizer step: the optimizer steps over no gradient (torch optimizers leave such
    parameters and their state untouched), so step counts and the learning-rate schedule stay on plan and no
    non-finite value reaches the weights. The norm is computed on synced gradients, so every rank decides alike.
    Under a fp16 ``GradScaler`` (backend attribute ``scaler_skips_nonfinite``) infinite gradients are the scaler's
    business (it skips the step and lowers its scale) and are left to it.
    """

    def __init__(self, loss_fn: GRPOLoss, temperature: float, num_iterations: int = 1, num_mini_batches: int = 1,
                 micro_batch_size: int | None = None, max_grad_norm: float = 1.0, max_nonfinite_skips: int = 3):
        if max_nonfinite_skips < 0:
            raise ValueError(f"max_nonfinite_skips must be >= 0 (0 = never stop), got {max_nonfinite_skips}")
        self.loss_fn = loss_fn
        self.temperature = temperature
        self.num_iterations = num_iterations
        self.num_mini_batches = num_mini_batches
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm
        self.max_nonfinite_skips = max_nonfinite_skips
        self.skips_in_a_row = 0
        self.skips_total = 0
        self.optimizer_steps = 0  # over the updater's life (what trainer.max_steps counts)

    def weight(self, rollouts: Rollouts, rows: Tensor) -> float:
        """A micro-batch's share of its mini-batch's loss: tokens for ``dapo``, sequences otherwise."""
        if self.loss_fn.loss_type == "dapo":
            return float(rollouts.completion_mask[rows].sum().clamp(min=1))
        return float(len(rows))

    def update(
        self, rollouts: Rollouts, advantages: Tensor, backend: UpdateBackend,
        collective: Collective | None = None, ref_logprobs: RefLogprobs | None = None,
    ) -> dict[str, float]:
        """Train on this rank's ``N`` rows with ``advantages`` ``[N]``; return this rank's mean statistics.

        pi_old is the policy that generated the fresh rows: with one optimizer step per batch it equals the current
        policy, so its log-probs come from the same forward pass; otherwise a no-grad pass computes them first.
        ``rollouts.old_logprobs`` holds them afterwards (the replay buffer stores them as the behaviour policy mu).
        """
        collective = collective or LocalCollective()
        world = collective.world_size
        N = rollouts.completion_tokens.shape[0]
        single_update = self.num_iterations == 1 and self.num_mini_batches == 1
        old = None if single_update else self.old_logprobs(rollouts, backend)
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.num_iterations):
            perm = torch.randperm(N) if self.num_mini_batches > 1 else torch.arange(N)
            mini_batches = list(perm.chunk(self.num_mini_batches))
            local = [self.weight(rollouts, mb) for mb in mini_batches]
            totals = local if world == 1 else _sum_lists(collective.all_gather(local))  # global weight per mini-batch
            for mb, total in zip(mini_batches, totals):
                backend.zero_grad()
                micro = list(mb.split(self.micro_batch_size or len(mb)))
                for i, rows in enumerate(micro):
                    with nullcontext() if i == len(micro) - 1 else backend.no_sync():
                        out, entropy = self._loss(rollouts, rows, advantages, old, backend, ref_logprobs)
                        backend.backward(out.loss * (self.weight(rollouts, rows) / total * world))
                    for k, v in out.metrics.items():
                        stats[k].append(float(v))
                    stats["entropy"].append(float(entropy))
                    stats["loss"].append(float(out.loss.detach()))
                norm = backend.clip_grad_norm(self.max_grad_norm if self.max_grad_norm > 0 else math.inf)
                if math.isfinite(norm) or getattr(backend, "scaler_skips_nonfinite", False):
                    self.skips_in_a_row = 0
                    if self.max_grad_norm > 0:
                        stats["grad_norm"].append(norm)
                else:
                    self._skip(backend, stats, norm)
                backend.optimizer_step()
                self.optimizer_steps += 1
        skipped = len(stats.pop("nonfinite_skips", []))
        reduce = {"/min": np.min, "/max": np.max}
        metrics = {k: float(reduce.get(k[k.rfind("/"):], np.mean)(v)) for k, v in stats.items()}
        metrics["nonfinite_skips"] = float(skipped)
        metrics["learning_rate"] = backend.learning_rate()
        return metrics

    def _skip(self, backend: UpdateBackend, stats: dict[str, list[float]], norm: float) -> None:
        """Drop a non-finite gradient (the optimizer then steps over nothing); stop after too many in a row."""
        backend.zero_grad()
        self.skips_in_a_row += 1
        self.skips_total += 1
        stats["nonfinite_skips"].append(norm)
        if self.max_nonfinite_skips and self.skips_in_a_row >= self.max_nonfinite_skips:
            raise NonFiniteUpdateError(
                f"{self.skips_in_a_row} optimizer steps in a row had a non-finite loss or gradient (norm {norm}); "
                "their updates were skipped and the weights are still finite. Lower model.optim.learning_rate, check the "
                "rewards and the precision (bf16-mixed rather than 16-mixed), or raise model.optim.max_nonfinite_skips"
            )

    @torch.no_grad()
    def old_logprobs(self, rollouts: Rollouts, backend: UpdateBackend) -> Tensor:
        """``[N, L]`` log-probs of every row under the policy before this update (no gradient)."""
        N = rollouts.completion_tokens.shape[0]
        micro = self.micro_batch_size or N
        return torch.cat([self.logprobs(backend, rollouts, rows)[0] for rows in torch.arange(N).split(micro)])

    def logprobs(self, backend: UpdateBackend, rollouts: Rollouts, rows: Tensor,
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        return sequence_logprobs(backend.model, rollouts, rows, self.temperature, backend.device, with_entropy)

    def _loss(self, rollouts: Rollouts, rows: Tensor, advantages: Tensor, old: Tensor | None,
              backend: UpdateBackend, ref_logprobs: RefLogprobs | None) -> tuple[LossOutput, Tensor]:
        device = backend.device
        logprobs, entropy = self.logprobs(backend, rollouts, rows, with_entropy=True)  # [n, L] each
        mask = rollouts.completion_mask[rows].to(device)  # [n, L]
        old_rows = logprobs.detach() if old is None else old[rows].to(device)  # [n, L]
        behaviour = replay_rows = None
        engine = rollouts.engine_logprobs  # mu of fresh rows, when the engine reported it
        if bool(rollouts.is_replay.any()) or engine is not None:
            replay_rows = rollouts.is_replay.repeat_interleave(rollouts.group_size)[rows].to(device)  # [n]
            fresh_mu = engine[rows].to(device) if engine is not None else old_rows  # [n, L]
            behaviour = fresh_mu
            if bool(replay_rows.any()):
                if rollouts.behaviour_logprobs is None:
                    raise RuntimeError("replayed groups need behaviour_logprobs (set by the replay callback)")
                behaviour = torch.where(replay_rows[:, None], rollouts.behaviour_logprobs[rows].to(device), fresh_mu)
        if rollouts.old_logprobs is None:
            rollouts.old_logprobs = torch.zeros(rollouts.completion_tokens.shape, dtype=torch.float32)
        rollouts.old_logprobs[rows] = old_rows.detach().float().cpu()
        ref = ref_logprobs(rollouts, rows) if ref_logprobs is not None else None
        # Without engine log-probs, fresh rows carry mu = pi_old (a ratio of exactly 1): no replay mask is needed.
        out = self.loss_fn(logprobs, old_rows, advantages[rows].to(device), mask, ref_logprobs=ref,
                           behaviour_logprobs=behaviour, replay_mask=replay_rows if engine is not None else None)
        ent = (entropy.detach() * mask).sum() / mask.sum().clamp(min=1)
        return out, ent


def _sum_lists(parts: list[list[float]]) -> list[float]:
    return [float(sum(values)) for values in zip(*parts)]


class TorchBackend:
    """:class:`UpdateBackend` for a plain PyTorch loop on one process (no data parallelism).

    Example::

        backend = TorchBackend(policy, torch.optim.AdamW(policy.parameters(), lr=1e-6))
        PolicyUpdater(GRPOLoss(), temperature=1.0).update(rollouts, advantages, backend)
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: object | None = None,
                 device: torch.device | str | None = None):
        self._model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self._device = torch.device(device) if device is not None else next(model.parameters()).device

    @property
    def model(self) -> nn.Module:
        return self._model

    @property
    def device(self) -> torch.device:
        return self._device

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def no_sync(self) -> AbstractContextManager:
        return nullcontext()

    def clip_grad_norm(self, max_norm: float) -> float:
        params = [p for p in self._model.parameters() if p.grad is not None]
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0

    def optimizer_step(self) -> None:
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

"""The policy update of a GRPO step, without Lightning: the clipped loss over iterations, mini- and micro-batches.

Notation: ``N`` sequences on this rank (``B_local * G``), ``L`` completion length, ``W`` ranks.

Groups of different sizes (``Rollouts.members``): only the real rows are trained on (``Rollouts.member_rows``); the
padding rows never reach the model, so every aggregation's ``N`` counts real completions (see
``docs/losses.md``). Ranks may then hold different numbers of rows: mini-batches and micro-batches are brought to
the same count on every rank, and a rank with nothing left in one makes a pass whose loss is multiplied by 0.

:class:`PolicyUpdater` runs ``num_iterations`` passes; each pass shuffles this rank's ``N`` rows (when there are
several mini-batches), splits them into ``num_mini_batches`` mini-batches and makes one optimizer step per
mini-batch, accumulating gradients over micro-batches of ``micro_batch_size`` rows. What differs between the
Trainer, Fabric and plain PyTorch (how to backward, skip gradient sync, clip, step) sits behind
:class:`UpdateBackend`; how ranks agree on normalisation goes through a :class:`~lit_rlft.runtime.distributed.Collective`.

Global normalisation. A mini-batch's loss is normalised by the *global* weight of that mini-batch (its tokens for
``loss_type="dapo"``, its sequences otherwise), summed over ranks, and every rank multiplies its share by ``W``
because data-parallel strategies average gradients over ranks. So ``W`` ranks each holding a slice of a global batch
compute the gradient that one rank holding the whole batch computes (up to float rounding)::

    grad = sum_r  W * sum_{micro in rank r} loss_micro * w_micro / w_global   /  W      (DDP/FSDP's mean)
         = sum_{all micro-batches} loss_micro * w_micro / w_global                    (one rank, same batch)
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from lit_rlft.core.entropy_control import AdaptiveEntropyCoef
from lit_rlft.core.loss_masks import entropy_threshold
from lit_rlft.core.losses import GRPOLoss, LossOutput
from lit_rlft.core.types import Rollouts
from lit_rlft.runtime.distributed import Collective, LocalCollective, split_to
from lit_rlft.step.batching import padding_share, teaching_rows, token_budget_micro_batches
from lit_rlft.step.config import OptimConfig
from lit_rlft.step.passes import grouped_attention_supported, grouping_pays, sequence_logprobs

__all__ = ["NonFiniteUpdateError", "PolicyUpdater", "TorchBackend", "UpdateBackend", "UpdateOutput", "clip_grad_norm",
           "reference_logprobs", "sequence_logprobs"]

RefLogprobs = Callable[[Rollouts, Tensor], "Tensor | None"]
"""``(rollouts, rows [n]) -> [n, L]`` reference log-probs (or None without a KL penalty)."""


class NonFiniteUpdateError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient; training stops."""


@dataclasses.dataclass(frozen=True)
class UpdateOutput:
    """What :meth:`PolicyUpdater.update` produces."""

    metrics: dict[str, float]
    """This rank's mean statistics of the update (loss, clip ratios, entropy, grad norm, learning rate...)."""
    behaviour_logprobs: Tensor
    """``[N, L]`` float32 on the CPU: mu of every row of the rollouts trained on (the rule:
    :class:`~lit_rlft.core.types.Rollouts`): replayed rows' as they came, fresh rows' completed by the update (the
    engine's sampling log-probs, or pi_old). The step puts it on the rollouts it returns; the replay buffer stores it."""


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

    @property
    def scaler_skips_nonfinite(self) -> bool:
        """A gradient scaler (fp16 mixed precision) skips steps with infinite gradients itself: the updater then
        leaves them to it instead of counting them as non-finite skips."""
        ...


class PolicyUpdater:
    """``num_iterations x num_mini_batches`` optimizer steps of the GRPO loss over one rollout batch.

    Args:
        loss_fn: the per-micro-batch loss (:class:`~lit_rlft.core.losses.GRPOLoss`).
        temperature: sampling temperature, applied to training logits as well (TRL does the same).
        optim: how the batch is split and stepped (:class:`~lit_rlft.step.config.OptimConfig`: ``num_iterations``,
            ``num_mini_batches``, ``micro_batch_size`` or ``micro_batch_tokens``, ``padding_free``, ``max_grad_norm``,
            ``max_nonfinite_skips``; the optimizer's own settings are the backend's business).
        **options: those fields given one by one instead (``PolicyUpdater(loss, 1.0, micro_batch_size=4)``), or
            overriding ``optim``'s; checked by ``OptimConfig``.

    Everything computed over the batch is global, so ``W`` ranks equal one rank holding the whole batch: the loss
    normaliser (:meth:`GRPOLoss.micro_batch_weight` summed over micro-batches and ranks), the threshold of
    ``top_entropy_quantile`` and the entropy bonus's token count (a no-grad pre-pass over the mini-batch when the
    quantile is below 1), and the adaptive entropy coefficient (:attr:`entropy_control`, from the global mean).

    Numerical faults: when the global gradient norm of a mini-batch is NaN or infinite (a NaN loss gives one), its
    gradient is dropped before the optimizer step: the optimizer steps over no gradient (torch optimizers leave such
    parameters and their state untouched), so step counts and the learning-rate schedule stay on plan and no
    non-finite value reaches the weights. The norm is computed on synced gradients, so every rank decides alike.
    Under a fp16 ``GradScaler`` (``UpdateBackend.scaler_skips_nonfinite``) infinite gradients are the scaler's
    business (it skips the step and lowers its scale) and are left to it.
    """

    def __init__(self, loss_fn: GRPOLoss, temperature: float, optim: OptimConfig | None = None, **options: Any):
        o = dataclasses.replace(optim or OptimConfig(), **options)
        self.optim = o
        self.loss_fn = loss_fn
        self.temperature = temperature
        self.num_iterations, self.num_mini_batches = o.num_iterations, o.num_mini_batches
        self.micro_batch_size, self.micro_batch_tokens = o.micro_batch_size, o.micro_batch_tokens
        self.padding_free, self.max_grad_norm, self.max_nonfinite_skips = (o.padding_free, o.max_grad_norm,
                                                                           o.max_nonfinite_skips)
        self.shared_prompt = o.shared_prompt
        self.logprob_chunk_tokens = o.logprob_chunk_tokens
        self._grouped: dict[int, bool] = {}  # id(model) -> whether its passes are shared-prompt ones
        self.entropy_control = AdaptiveEntropyCoef.from_loss(loss_fn)
        self.skips_in_a_row = 0
        self.skips_total = 0
        self.optimizer_steps = 0  # over the updater's life (what trainer.max_steps counts)
        self._seconds_per_token = 0.0  # the update's time per trained token (time/update_saved_s)

    # -- batching ----------------------------------------------------------------------------------------------
    def micro_batches(self, rollouts: Rollouts, rows: Tensor) -> list[Tensor]:
        """The micro-batches ``[n_k]`` of a mini-batch's ``rows`` ``[m]``: by row count or by token budget (an
        empty mini-batch gives one empty micro-batch)."""
        if len(rows) == 0:
            return [rows]
        if self.micro_batch_tokens is None:
            return list(rows.split(self.micro_batch_size or len(rows)))
        return token_budget_micro_batches(rows, rollouts.prompt_mask[rows].sum(1),
                                          rollouts.completion_mask[rows].sum(1), self.micro_batch_tokens,
                                          self.padding_free)

    def split(self, rollouts: Rollouts, mini_batches: list[Tensor], collective: Collective) -> list[list[Tensor]]:
        """Each mini-batch's micro-batches, as many on every rank: a token budget, or groups of different sizes
        (ranks then hold different numbers of rows), can split ranks' rows into different numbers, and every rank
        must make the same number of forward passes (FSDP2 gathers in each; an empty one is a dummy pass)."""
        micro = [self.micro_batches(rollouts, mb) for mb in mini_batches]
        if not collective.is_distributed:
            return micro
        counts = np.max(np.asarray(collective.all_gather([len(m) for m in micro])), axis=0)
        return [split_to(m, int(k)) for m, k in zip(micro, counts)]

    def mini_batches(self, rollouts: Rollouts) -> list[Tensor]:
        """This rank's real rows (:meth:`Rollouts.member_rows`), shuffled when there are several mini-batches, cut
        into ``num_mini_batches`` mini-batches ``[m_k]`` (some empty when there are fewer rows than that)."""
        rows = rollouts.member_rows()  # [N_real]
        perm = rows[torch.randperm(len(rows))] if self.num_mini_batches > 1 else rows
        return split_to(list(perm.chunk(self.num_mini_batches)), self.num_mini_batches)

    @property
    def skips_zero_advantage(self) -> bool:
        """Whether the update leaves out the rows of groups whose advantages are all 0: ``skip_zero_advantage`` and
        exact (no loss term gives such a row a gradient: :attr:`GRPOLoss.zero_advantage_rows_matter`)."""
        return self.optim.skip_zero_advantage and not self.loss_fn.zero_advantage_rows_matter

    def teaching_plans(self, rollouts: Rollouts, mini_batches: list[list[Tensor]], keep: Tensor,
                       collective: Collective) -> list[list[tuple[Tensor, float]]]:
        """Each mini-batch's passes over its teaching rows (``keep`` ``[N]``), with the weights that scale each
        pass's loss to its share of the mini-batch's loss over *every* row (the normaliser stays the mini-batch's).

        With an additive aggregation (a micro-batch's weight is its own denominator: every loss type but bnpo) a
        row's share does not depend on its micro-batch, so the teaching rows are cut into micro-batches afresh (the
        same rule: ``micro_batch_size`` or ``micro_batch_tokens``), fewer passes. bnpo normalises each micro-batch by
        its own tokens, so its teaching rows stay in their micro-batches, each pass weighted by its share of that
        micro-batch's tokens. Ranks agree on the number of passes per mini-batch (a rank with fewer makes passes that
        add nothing); a mini-batch with no teaching row on any rank gets none.
        """
        agg = self.loss_fn.aggregation
        plans: list[list[tuple[Tensor, float]]] = []
        for micro in mini_batches:
            if agg.additive:
                rows = torch.cat(micro)
                rows = rows[keep[rows]]
                plans.append([(part, self.weight(rollouts, part)) for part in
                              (self.micro_batches(rollouts, rows) if len(rows) else [])])
                continue
            plan = []
            for m in micro:
                part = m[keep[m]]
                if len(part):
                    whole = agg.units(self.loss_fn.token_mask(rollouts.loss_mask[m], rollouts.truncated[m]))
                    share = agg.units(self.loss_fn.token_mask(rollouts.loss_mask[part], rollouts.truncated[part]))
                    plan.append((part, self.weight(rollouts, m) * share / whole if whole else 0.0))
            plans.append(plan)
        if collective.is_distributed:
            counts = np.max(np.asarray(collective.all_gather([len(p) for p in plans])), axis=0)
            empty = rollouts.member_rows()[:0]
            plans = [p + [(empty, 0.0)] * (int(k) - len(p)) for p, k in zip(plans, counts)]
        return plans

    def _complete_skipped(self, rollouts: Rollouts, keep: Tensor, mu: Tensor, stats: dict[str, list[float | Tensor]],
                          update_s: float) -> None:
        """After an update that left rows out: their behaviour log-probs (the engine's where it gave them; NaN
        otherwise, as no pass computed pi_old for them: the replay buffer does not store such groups) and what the
        skip saved: ``perf/skipped_rows`` and ``perf/skipped_rows_share`` of this rank's real rows, and
        ``time/update_saved_s``, the update's time per trained token (the last update that trained any) times the
        tokens left out (an estimate: a pass's cost grows with its tokens)."""
        real = rollouts.member_mask().reshape(-1)  # [N]
        skipped = real & ~keep  # [N]
        fresh = ~rollouts.is_replay.repeat_interleave(rollouts.group_size)  # [N]
        left = skipped & fresh
        if bool(left.any()):
            engine = rollouts.engine_logprobs
            mu[left] = engine[left].float().cpu() if engine is not None else float("nan")
        tokens = rollouts.prompt_mask.sum(1) + rollouts.completion_mask.sum(1)  # [N] a row's pass cost
        trained_tokens, skipped_tokens = float(tokens[keep].sum()), float(tokens[skipped].sum())
        stats["perf/skipped_rows"].append(float(skipped.sum()))
        stats["perf/skipped_rows_share"].append(float(skipped.sum()) / max(int(real.sum()), 1))
        if trained_tokens:
            self._seconds_per_token = update_s / trained_tokens
        stats["time/update_saved_s"].append(self._seconds_per_token * skipped_tokens)

    def weight(self, rollouts: Rollouts, rows: Tensor) -> float:
        """A micro-batch's share of its mini-batch's loss (:meth:`GRPOLoss.micro_batch_weight`; 0 when empty)."""
        if len(rows) == 0:
            return 0.0
        return self.loss_fn.micro_batch_weight(rollouts.loss_mask[rows], rollouts.truncated[rows])

    def logprobs(self, backend: UpdateBackend, rollouts: Rollouts, rows: Tensor, with_entropy: bool = False,
                 entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """``[n, L]`` log-probs (and entropy) of ``rows`` under the backend's model."""
        return self.model_logprobs(backend.model, rollouts, rows, backend.device, with_entropy, entropy_grad)

    def model_logprobs(self, model: nn.Module, rollouts: Rollouts, rows: Tensor, device: torch.device,
                       with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """``[n, L]`` log-probs (and entropy) of ``rows`` under ``model``, passed as the training passes are (the
        temperature, padded or packed, trimmed): also what the reference model's pass uses."""
        return sequence_logprobs(model, rollouts, rows, self.temperature, device, with_entropy,
                                 packed=self.padding_free, trim=self.micro_batch_tokens is not None,
                                 entropy_grad=entropy_grad, logprob_chunk_tokens=self.logprob_chunk_tokens,
                                 grouped=self.grouped(model) and (
                                     self.shared_prompt is True or grouping_pays(model, rollouts, rows, packed=self.padding_free,
                                                                              trim=self.micro_batch_tokens is not None)))

    def grouped(self, model: nn.Module) -> bool:
        """Whether ``model``'s passes share each group's prompt (``shared_prompt``, decided once per model: a model
        whose attention takes no 4-D mask falls back to the per-row pass, with one warning)."""
        if not self.shared_prompt:
            return False
        key = id(model)
        if key not in self._grouped:
            ok, why = grouped_attention_supported(model, verified_only=self.shared_prompt == "auto")
            if not ok:
                warnings.warn(f"model.optim.shared_prompt={self.shared_prompt!r}: {type(model).__name__} runs per-row "
                              f"passes: {why}", UserWarning, stacklevel=3)
            self._grouped[key] = ok
        return self._grouped[key]

    # -- the update --------------------------------------------------------------------------------------------
    def update(
        self, rollouts: Rollouts, advantages: Tensor, backend: UpdateBackend,
        collective: Collective | None = None, ref_logprobs: RefLogprobs | None = None,
    ) -> UpdateOutput:
        """Train on this rank's ``N`` rows with ``advantages`` ``[N]``; this rank's mean statistics and every row's mu.

        pi_old is the policy before this update: with one optimizer step per batch it equals the current policy, so
        its log-probs come from the same forward pass; otherwise a no-grad pass computes them first. The update
        completes the fresh rows' mu (``UpdateOutput.behaviour_logprobs``, a new tensor: ``rollouts`` is not
        written), which the replay buffer stores.
        """
        t0 = time.perf_counter()
        collective = collective or LocalCollective()
        world = collective.world_size
        single_update = self.num_iterations == 1 and self.num_mini_batches == 1
        keep = teaching_rows(rollouts, advantages) if self.skips_zero_advantage else None  # [N] bool
        old = None if single_update else self.old_logprobs(rollouts, backend, collective, keep)
        if ref_logprobs is not None and self.num_iterations > 1:  # the frozen reference's pass once, not per pass
            ref_all = self._every_row(ref_logprobs, rollouts, collective)
            ref_logprobs = None if ref_all is None else (lambda _rollouts, rows: ref_all[rows.to(ref_all.device)])
        stats: dict[str, list[float | Tensor]] = defaultdict(list)  # tensors stay on the device until the end
        mu = torch.zeros(rollouts.completion_tokens.shape, dtype=torch.float32) if rollouts.behaviour_logprobs is None \
            else rollouts.behaviour_logprobs.clone()  # [N, L]: replayed rows' as they came, fresh rows' filled in
        for _ in range(self.num_iterations):
            mini_batches = self.split(rollouts, self.mini_batches(rollouts), collective)
            local = [[self.weight(rollouts, rows) for rows in micro] for micro in mini_batches]
            sums = [sum(w) for w in local]
            totals = sums if world == 1 else _sum_lists(collective.all_gather(sums))  # global weight per mini-batch
            plans = ([list(zip(micro, weights)) for micro, weights in zip(mini_batches, local)] if keep is None
                     else self.teaching_plans(rollouts, mini_batches, keep, collective))
            for micro, plan, total in zip(mini_batches, plans, totals):
                self._optimizer_step(rollouts, micro, plan, total or 1.0,
                                     advantages, old, backend, collective, ref_logprobs, stats, mu)
            stats["perf/padding_share"].append(padding_share(rollouts, [r for m in mini_batches for r in m if len(r)],
                                                             self.padding_free, self.micro_batch_tokens is not None))
        if keep is not None:
            self._complete_skipped(rollouts, keep, mu, stats, time.perf_counter() - t0)
        skipped = len(stats.pop("nonfinite_skips", []))
        reduce = {"/min": np.min, "/max": np.max}
        metrics = {k: float(reduce.get(k[k.rfind("/"):], np.mean)(v)) for k, v in _to_host(stats).items()}
        metrics["nonfinite_skips"] = float(skipped)
        metrics["learning_rate"] = backend.learning_rate()
        if self.entropy_control.enabled:
            metrics["entropy_coef"] = self.entropy_control.apply_coef()
        return UpdateOutput(metrics, mu)

    def _optimizer_step(self, rollouts: Rollouts, micro: list[Tensor], plan: list[tuple[Tensor, float]], total: float,
                        advantages: Tensor, old: Tensor | None, backend: UpdateBackend, collective: Collective,
                        ref_logprobs: RefLogprobs | None, stats: dict[str, list[float | Tensor]], mu: Tensor) -> None:
        """One mini-batch: the backward passes of its ``plan`` (micro-batches ``[n_k]`` and weights ``w_k``, each
        loss scaled by ``w_k / total``; gradient sync on the last), clipping, one step. ``micro``: the mini-batch's
        micro-batches of every row (the entropy quantile's pre-pass). A plan without passes (no teaching row on any
        rank, :meth:`teaching_plans`) makes no backward: zero gradients, and the optimizer still steps. ``loss`` is
        logged once per mini-batch: its loss (the sum of its passes' scaled losses), whatever its micro-batches.

        The micro-batches' statistics stay on the device (``stats``; :func:`_to_host` reads them back once per
        update): on an accelerator every ``float(tensor)`` waits for the queued work, ~10 waits per micro-batch."""
        world = collective.world_size
        threshold, bonus_tokens = self._entropy_globals(rollouts, micro, backend, collective)
        entropy_sums: Tensor | None = None  # [2] on the device: sum and count of the bonus tokens' entropy
        mini_batch_loss: Tensor | float = 0.0
        backend.zero_grad()
        if not plan:  # no teaching row on any rank: the gradient every row would give is exactly 0
            _zero_gradients(backend.model)
        for i, (rows, w) in enumerate(plan):
            with nullcontext() if i == len(plan) - 1 else backend.no_sync():
                if len(rows) == 0:  # fewer rows here than on another rank: a pass that adds nothing (collectives)
                    out, _ = self._loss(rollouts, rollouts.member_rows()[:1], advantages, old, backend, ref_logprobs,
                                        threshold, 0.0 if bonus_tokens is not None else None)
                    backend.backward(out.loss * 0.0)
                    continue
                normaliser = bonus_tokens * w / total if bonus_tokens is not None else None
                out, entropy = self._loss(rollouts, rows, advantages, old, backend, ref_logprobs, threshold,
                                          normaliser, mu)
                backend.backward(out.loss * (w / total * world))
            for k, v in out.metrics.items():
                stats[k].append(v.detach() if isinstance(v, Tensor) else float(v))
            stats["entropy"].append(entropy)
            mini_batch_loss = mini_batch_loss + out.loss.detach() * (w / total * world)
            if out.entropy_stats is not None:
                part = out.entropy_stats.detach().double()
                entropy_sums = part if entropy_sums is None else entropy_sums + part
        stats["loss"].append(mini_batch_loss)  # the mini-batch's loss, however it was cut (this rank's share x W)
        norm = backend.clip_grad_norm(self.max_grad_norm if self.max_grad_norm > 0 else math.inf)
        if math.isfinite(norm) or backend.scaler_skips_nonfinite:
            self.skips_in_a_row = 0
            if self.max_grad_norm > 0:
                stats["grad_norm"].append(norm)
        else:
            self._skip(backend, stats, norm)
        backend.optimizer_step()
        self.optimizer_steps += 1
        if self.entropy_control.adaptive:  # the global mean entropy of this step's bonus tokens
            sums = torch.zeros(2, dtype=torch.float64) if entropy_sums is None else entropy_sums.cpu()
            total_sum, count = (sums if world == 1 else torch.stack(collective.all_gather(sums)).sum(0)).tolist()
            self.entropy_control.update(total_sum / max(count, 1.0))

    def _entropy_globals(self, rollouts: Rollouts, micro: list[Tensor], backend: UpdateBackend,
                         collective: Collective) -> tuple[float | None, float | None]:
        """``(threshold, bonus tokens)`` over the whole mini-batch and every rank: the ``top_entropy_quantile``
        threshold (a no-grad entropy pass over the mini-batch first) and the entropy bonus's global token count."""
        loss = self.loss_fn
        threshold = None
        if loss.top_entropy_quantile < 1.0:
            with torch.no_grad():
                parts = [torch.zeros(0)]
                for rows in micro:
                    entropy = self.logprobs(backend, rollouts, rows if len(rows) else rollouts.member_rows()[:1],
                                            with_entropy=True)[1].cpu()  # an empty micro-batch: a dummy pass
                    if len(rows):
                        parts.append(entropy[loss.token_mask(rollouts.loss_mask[rows], rollouts.truncated[rows])])
                local = torch.cat(parts)  # [this rank's loss tokens]
            values = local if not collective.is_distributed else torch.cat(collective.all_gather(local))
            threshold = entropy_threshold(values, loss.top_entropy_quantile)
            count = float((values >= threshold).sum())
        elif loss.entropy_bonus:
            count = float(sum(int(loss.token_mask(rollouts.loss_mask[rows], rollouts.truncated[rows]).sum())
                              for rows in micro))
            if collective.is_distributed:
                count = float(sum(collective.all_gather(count)))
        return threshold, (count if loss.entropy_bonus else None)

    def _skip(self, backend: UpdateBackend, stats: dict[str, list[float | Tensor]], norm: float) -> None:
        """Drop a non-finite gradient (the optimizer then steps over nothing); stop after too many in a row."""
        backend.zero_grad()
        self.skips_in_a_row += 1
        self.skips_total += 1
        stats["nonfinite_skips"].append(norm)
        if self.max_nonfinite_skips and self.skips_in_a_row >= self.max_nonfinite_skips:
            raise NonFiniteUpdateError(
                f"{self.skips_in_a_row} optimizer steps in a row had a non-finite loss or gradient (norm {norm}); "
                "their updates were skipped and the weights are still finite. Lower model.optim.learning_rate, check "
                "the rewards and the precision (bf16-mixed rather than 16-mixed), or raise "
                "model.optim.max_nonfinite_skips"
            )

    @torch.no_grad()
    def old_logprobs(self, rollouts: Rollouts, backend: UpdateBackend, collective: Collective | None = None,
                     keep: Tensor | None = None) -> Tensor:
        """``[N, L]`` log-probs of every row (of the rows ``keep`` ``[N]`` marks) under the policy before this
        update (no gradient; 0 for the rows left out)."""
        out = self._every_row(lambda r, rows: self.logprobs(backend, r, rows)[0], rollouts,
                              collective or LocalCollective(), torch.float32, keep)
        return out if out is not None else torch.zeros(rollouts.completion_tokens.shape, device=backend.device)

    def _every_row(self, per_rows: RefLogprobs, rollouts: Rollouts, collective: Collective,
                   dtype: torch.dtype | None = None, keep: Tensor | None = None) -> Tensor | None:
        """``[N, L]``: ``per_rows(rollouts, rows)`` ``[n, L]`` over this rank's micro-batches of its real rows (those
        ``keep`` marks), as many on every rank (a sharded model's forwards are collectives); None when ``per_rows``
        gives None (or there are no rows)."""
        out = None
        rows_here = rollouts.member_rows()
        if keep is not None:
            rows_here = rows_here[keep[rows_here]]
            if not collective.is_distributed and len(rows_here) == 0:
                return None
        for rows in self.split(rollouts, [rows_here], collective)[0]:
            if len(rows) == 0:  # a pass that adds nothing: the other ranks' forwards are collectives
                per_rows(rollouts, rollouts.member_rows()[:1])
                continue
            part = per_rows(rollouts, rows)  # [n, L]
            if part is None:
                return None
            if out is None:
                out = torch.zeros(rollouts.completion_tokens.shape, dtype=dtype or part.dtype, device=part.device)
            out[rows.to(out.device)] = part
        return out

    def _loss(self, rollouts: Rollouts, rows: Tensor, advantages: Tensor, old: Tensor | None,
              backend: UpdateBackend, ref_logprobs: RefLogprobs | None, threshold: float | None,
              normaliser: float | None, mu: Tensor | None = None) -> tuple[LossOutput, Tensor]:
        """The loss of ``rows`` ``[n]`` and their mean entropy; the fresh rows' mu written into ``mu`` ``[N, L]`` (None:
        a dummy pass that records nothing)."""
        device = backend.device
        loss_fn = self.loss_fn
        logprobs, entropy = self.logprobs(backend, rollouts, rows, with_entropy=True,
                                          entropy_grad=loss_fn.entropy_bonus)  # [n, L] each
        mask = rollouts.loss_mask[rows].to(device)  # [n, L] the policy's own tokens
        old_rows = logprobs.detach() if old is None else old[rows].to(device)  # [n, L]
        engine = rollouts.engine_logprobs
        replay_host = rollouts.is_replay.repeat_interleave(rollouts.group_size)[rows]  # [n]
        replay_rows = replay_host.to(device)  # [n]
        fresh_mu = engine[rows].to(device) if engine is not None else old_rows  # [n, L] mu of fresh rows (the rule)
        behaviour = None  # without replayed groups or engine log-probs, mu = pi_old: TRL's loss, no weights
        if bool(rollouts.is_replay.any()) or engine is not None:
            behaviour = fresh_mu
            if bool(replay_host.any()):
                if rollouts.behaviour_logprobs is None:
                    raise RuntimeError("replayed groups need behaviour_logprobs (the mu stored when they were fresh)")
                behaviour = torch.where(replay_rows[:, None], rollouts.behaviour_logprobs[rows].to(device), fresh_mu)
        if mu is not None:
            fresh = rows[~replay_host]
            mu[fresh] = fresh_mu.detach()[~replay_rows].float().cpu()
        ref = ref_logprobs(rollouts, rows) if ref_logprobs is not None else None
        extra: dict[str, object] = {}
        if loss_fn.mask_truncated_completions:
            extra["truncated"] = rollouts.truncated[rows].to(device)
        if loss_fn.needs_entropy:
            extra.update(entropy=entropy, entropy_threshold=threshold)
        if loss_fn.entropy_bonus:
            extra.update(entropy_coef=self.entropy_control.apply_coef(), entropy_normalizer=normaliser)
        # Without engine log-probs, fresh rows carry mu = pi_old (a ratio of exactly 1): no replay mask is needed.
        out = loss_fn(logprobs, old_rows, advantages[rows].to(device), mask, ref_logprobs=ref,
                      behaviour_logprobs=behaviour, replay_mask=replay_rows if engine is not None else None, **extra)
        entropy = entropy.detach()
        ent = (entropy * mask).sum() / mask.sum().clamp(min=1)
        return out, ent

    def state_dict(self) -> dict[str, float]:
        """What a resumed run needs: the adaptive entropy coefficient."""
        return self.entropy_control.state_dict()

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.entropy_control.load_state_dict(state)


def reference_logprobs(updater: PolicyUpdater, reference: nn.Module | None, policy: nn.Module,
                       device: torch.device) -> RefLogprobs | None:
    """The KL term's reference log-probs as :meth:`PolicyUpdater.update` asks for them, ``(rollouts, rows [n]) ->
    [n, L]``, passed as the training passes are: under the frozen copy ``reference``, or (LoRA) under ``policy`` with
    its adapters disabled; None without a KL term (``beta == 0``)."""
    if updater.loss_fn.beta == 0:
        return None

    @torch.no_grad()
    def logprobs(rollouts: Rollouts, rows: Tensor) -> Tensor:
        if reference is not None:
            return updater.model_logprobs(reference, rollouts, rows, device)[0]
        with policy.disable_adapter():
            return updater.model_logprobs(policy, rollouts, rows, device)[0]

    return logprobs


def _to_host(stats: dict[str, list[float | Tensor]]) -> dict[str, list[float]]:
    """``stats`` with every tensor read back as a float, in one device-to-host copy (values keep their order)."""
    tensors = [v for values in stats.values() for v in values if isinstance(v, Tensor)]
    if not tensors:
        return {k: [float(v) for v in values] for k, values in stats.items()}
    host = iter(torch.stack([t.reshape(()).to(tensors[0].device, torch.float64) for t in tensors]).cpu().tolist())
    return {k: [next(host) if isinstance(v, Tensor) else float(v) for v in values] for k, values in stats.items()}


def _sum_lists(parts: list[list[float]]) -> list[float]:
    return [float(sum(values)) for values in zip(*parts)]


class TorchBackend:
    """:class:`UpdateBackend` for a plain PyTorch loop on one process (no data parallelism).

    The optimizer side every backend shares (Lightning's ``LightningBackend`` subclasses it): step, ``zero_grad``,
    clipping with :func:`clip_grad_norm` (over :meth:`_grad_params`, at :meth:`_grad_scale`).

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
        # Gradients held scaled (a fp16 GradScaler's, unscaled inside optimizer.step) are clipped at the scaled
        # threshold, which is exactly clipping the unscaled gradients at `max_norm`; the norm is returned unscaled.
        scale = self._grad_scale()
        params = [p for p in self._grad_params() if p.grad is not None]
        return clip_grad_norm(params, max_norm * scale) / scale

    def _grad_params(self) -> Iterable[nn.Parameter]:
        """The parameters whose gradients are clipped (those without a gradient are left out)."""
        return self._model.parameters()

    def _grad_scale(self) -> float:
        """The factor the gradients are held at when clipped (1: unscaled)."""
        return 1.0

    def optimizer_step(self) -> None:
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def scaler_skips_nonfinite(self) -> bool:
        return False


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over ``params``; the global norm before clipping, also for FSDP2's sharded
    (DTensor) gradients. Every backend clips with it."""
    if not params:
        return 0.0
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    return float(total)


def _zero_gradients(model: nn.Module) -> None:
    """Every trainable parameter's gradient set to zeros (what a backward of a loss that is 0 for every row gives):
    the optimizer then steps as it would have (Adam's moments decay, weight decay applies), with no pass run."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)

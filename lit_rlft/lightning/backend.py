"""How the policy updater optimises under Lightning's Trainer (manual optimisation), for ``GRPOModule``.

The Fabric loop has its own backend (``lit_rlft.lightning.fabric.FabricBackend``), plain PyTorch ``lit_rlft.step.update.TorchBackend``;
all three implement :class:`lit_rlft.step.update.UpdateBackend`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from lit_rlft.models.sharding import fsdp_no_sync, is_sharded


class TrainerBackend:
    """How the updater optimises under Lightning's Trainer (manual optimisation)."""

    def __init__(self, module: L.LightningModule):
        self.module = module
        self.trainer = module.trainer
        self.opt = module.optimizers()
        self.sched = module.lr_schedulers()

    @property
    def model(self) -> nn.Module:
        return self.module.policy

    @property
    def device(self) -> torch.device:
        return self.module.device

    @property
    def world_size(self) -> int:
        return self.module.collective.world_size

    def backward(self, loss: Tensor) -> None:
        self.module.manual_backward(loss)  # DDP: Lightning prepares the reducer; AMP: the scaler scales

    def no_sync(self) -> AbstractContextManager:
        return _no_sync(self.trainer.strategy, self.module.policy)

    def clip_grad_norm(self, max_norm: float) -> float:
        # Lightning's `clip_gradients` clips the *scaled* gradients under 16-mixed in manual optimisation (it
        # unscales only inside optimizer.step) and returns no norm; clip the same parameters here, at the scaled
        # threshold, which is exactly clipping the unscaled gradients at `max_norm`.
        plugin = self.trainer.precision_plugin
        scale = _grad_scale(plugin)
        params = [p for p in plugin.main_params(self.opt.optimizer) if p.grad is not None]
        return clip_grad_norm(params, max_norm * scale) / scale

    @property
    def scaler_skips_nonfinite(self) -> bool:
        """Under 16-mixed the GradScaler skips steps with infinite gradients itself (and lowers its scale)."""
        return getattr(self.trainer.precision_plugin, "scaler", None) is not None

    def optimizer_step(self) -> None:
        self.opt.step()
        self.sched.step()

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def learning_rate(self) -> float:
        return float(self.sched.get_last_lr()[0])


@contextmanager
def _no_sync(strategy: Any, policy: nn.Module) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter of one backward (DDP's ``no_sync``, FSDP2's gradient sync)."""
    if is_sharded(policy):
        with fsdp_no_sync(policy):
            yield
    elif hasattr(strategy, "block_backward_sync"):
        with strategy.block_backward_sync():
            yield
    else:
        yield


def _grad_scale(precision_plugin: Any) -> float:
    scaler = getattr(precision_plugin, "scaler", None)
    return float(scaler.get_scale()) if scaler is not None else 1.0


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` over ``params``; the global norm before clipping, also for FSDP2's sharded
    (DTensor) gradients."""
    if not params:
        return 0.0
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    return float(total)

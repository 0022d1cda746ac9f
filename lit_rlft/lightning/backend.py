"""How the policy updater optimises under Lightning: one :class:`~lit_rlft.step.update.UpdateBackend` for the
Trainer (manual optimisation) and for Fabric, which differ only in how backward runs and how DDP's gradient sync is
skipped. Plain PyTorch uses :class:`~lit_rlft.step.update.TorchBackend`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlft.models.sharding import data_parallel_mesh, fsdp_no_sync, is_sharded
from lit_rlft.step.update import clip_grad_norm

__all__ = ["LightningBackend", "fsdp2_mesh", "no_gradient_sync"]


class LightningBackend:
    """The updater's backend under the Trainer or Fabric (build it with :meth:`for_trainer` / :meth:`for_fabric`).

    Args:
        model: what the training forward calls: the policy (Trainer: DDP wraps the LightningModule, whose
            ``training_step`` runs inside its forward), or Fabric's wrapper of the policy.
        policy: the policy itself (FSDP2's gradient sync is switched on it).
        optimizer / scheduler: Lightning's (or Fabric's) optimizer wrapper and the learning-rate scheduler.
        precision: the precision plugin (its ``scaler`` under 16-mixed, its ``main_params``).
        backward: ``loss -> None`` the strategy's way (mixed-precision scaling, DDP's reducer).
        ddp_no_sync: a context that skips DDP's gradient all-reduce for one backward (None: one rank).
        device: where the training forward runs.
    """

    def __init__(self, model: nn.Module, policy: nn.Module, optimizer: Any, scheduler: Any, precision: Any,
                 backward: Callable[[Tensor], None], ddp_no_sync: Callable[[], AbstractContextManager] | None,
                 device: torch.device):
        self._model, self.policy, self.optimizer, self.scheduler = model, policy, optimizer, scheduler
        self.precision, self._backward, self._ddp_no_sync, self._device = precision, backward, ddp_no_sync, device

    @classmethod
    def for_trainer(cls, module: Any) -> LightningBackend:
        """Inside ``training_step`` of a LightningModule whose ``policy`` trains (manual optimisation)."""
        trainer = module.trainer
        strategy = trainer.strategy
        sync = strategy.block_backward_sync if hasattr(strategy, "block_backward_sync") else None
        return cls(module.policy, module.policy, module.optimizers(), module.lr_schedulers(),
                   trainer.precision_plugin, module.manual_backward, sync, module.device)

    @classmethod
    def for_fabric(cls, fabric: Any, model: nn.Module, policy: nn.Module, optimizer: Any,
                   scheduler: Any) -> LightningBackend:
        """Under ``fabric`` with ``model = fabric.setup_module(policy)`` and ``optimizer`` set up by Fabric."""
        sync = (lambda: fabric.no_backward_sync(model, enabled=True)) if fabric.world_size > 1 else None
        return cls(model, policy, optimizer, scheduler, fabric.strategy.precision,
                   lambda loss: fabric.backward(loss, model=model), sync, fabric.device)

    @property
    def model(self) -> nn.Module:
        return self._model

    @property
    def device(self) -> torch.device:
        return self._device

    def backward(self, loss: Tensor) -> None:
        self._backward(loss)

    def no_sync(self) -> AbstractContextManager:
        return no_gradient_sync(self.policy, self._ddp_no_sync)

    def clip_grad_norm(self, max_norm: float) -> float:
        # Under 16-mixed the gradients are still scaled here (the scaler unscales inside optimizer.step): clipping
        # them at the scaled threshold is exactly clipping the unscaled gradients at `max_norm`.
        scale = self._grad_scale()
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        params = [p for p in self.precision.main_params(inner) if p.grad is not None]
        return clip_grad_norm(params, max_norm * scale) / scale

    @property
    def scaler_skips_nonfinite(self) -> bool:
        """Under 16-mixed the GradScaler skips steps with infinite gradients itself (and lowers its scale)."""
        return getattr(self.precision, "scaler", None) is not None

    def _grad_scale(self) -> float:
        scaler = getattr(self.precision, "scaler", None)
        return float(scaler.get_scale()) if scaler is not None else 1.0

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def learning_rate(self) -> float:
        return float(self.scheduler.get_last_lr()[0])


@contextmanager
def no_gradient_sync(policy: nn.Module, ddp_no_sync: Callable[[], AbstractContextManager] | None) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter of one backward: FSDP2's gradient sync on a sharded policy,
    else DDP's ``no_sync`` (nothing on one rank)."""
    if is_sharded(policy):
        with fsdp_no_sync(policy):
            yield
    else:
        with ddp_no_sync() if ddp_no_sync is not None else nullcontext():
            yield


def fsdp2_mesh(strategy: Any) -> Any:
    """The mesh to shard the policy over under a Trainer's ``strategy`` (None: no sharding). FSDP1 is refused with a
    pointer to FSDP2 (``ModelParallelStrategy``)."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    if isinstance(strategy, FSDPStrategy):
        raise ValueError(
            "trainer.strategy: FSDPStrategy (FSDP1) is not supported: GRPO calls the policy outside the strategy's "
            "root module (generate, log-probs, reference and embedding passes), which FSDP1's flat parameters do not "
            "allow. Shard with FSDP2 instead, on GPU as on CPU: strategy: {class_path: "
            "lightning.pytorch.strategies.ModelParallelStrategy, init_args: {data_parallel_size: <devices x nodes>, "
            "tensor_parallel_size: 1}} (see configs/parallel/)"
        )
    return data_parallel_mesh(strategy.device_mesh) if isinstance(strategy, ModelParallelStrategy) else None

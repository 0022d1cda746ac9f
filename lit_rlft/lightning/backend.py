"""How the policy updater optimises under Lightning: one :class:`~lit_rlft.step.update.UpdateBackend` for the
Trainer (manual optimisation) and for Fabric, which differ only in how backward runs and how DDP's gradient sync is
skipped. It is a :class:`~lit_rlft.step.update.TorchBackend` (plain PyTorch's backend, which steps, zeroes and clips)
that backpropagates and skips the gradient sync the strategy's way and clips the precision plugin's gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlft.models.sharding import data_parallel_mesh, fsdp_no_sync, is_sharded
from lit_rlft.step.update import TorchBackend

__all__ = ["LightningBackend", "fsdp2_mesh", "no_gradient_sync"]


class LightningBackend(TorchBackend):
    """The updater's backend under the Trainer or Fabric (build it with :meth:`for_trainer` / :meth:`for_fabric`).

    Stepping, ``zero_grad`` and clipping are :class:`~lit_rlft.step.update.TorchBackend`'s; backward, the gradient
    sync, which gradients are clipped at which scale and the learning rate are the strategy's and the plugin's.

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
        super().__init__(model, optimizer, scheduler, device)
        self.policy, self.precision, self._backward, self._ddp_no_sync = policy, precision, backward, ddp_no_sync

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

    def backward(self, loss: Tensor) -> None:
        self._backward(loss)

    def no_sync(self) -> AbstractContextManager:
        return no_gradient_sync(self.policy, self._ddp_no_sync)

    def _grad_params(self) -> Iterable[nn.Parameter]:
        """The precision plugin's main parameters of the optimizer Lightning's wrapper holds."""
        return self.precision.main_params(getattr(self.optimizer, "optimizer", self.optimizer))

    def _grad_scale(self) -> float:
        """Under 16-mixed the gradients are still scaled when clipped (the scaler unscales inside
        ``optimizer.step``): the scaler's scale, else 1."""
        scaler = getattr(self.precision, "scaler", None)
        return float(scaler.get_scale()) if scaler is not None else 1.0

    @property
    def scaler_skips_nonfinite(self) -> bool:
        """Under 16-mixed the GradScaler skips steps with infinite gradients itself (and lowers its scale)."""
        return getattr(self.precision, "scaler", None) is not None

    def learning_rate(self) -> float:
        """The scheduler's last learning rate (the first param group's)."""
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

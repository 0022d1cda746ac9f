"""What lit_rlft's callbacks share: the step context they work on, and the Lightning hooks that reach it.

Every lit_rlft callback is written against :class:`~lit_rlft.step.context.StepContext` (never against
``GRPOModule``'s members or the Trainer) through three context-level methods, which work the same under the Trainer,
Fabric or a plain PyTorch loop:

- :meth:`StepCallback.setup_step` (``on_fit_start``): the policy and the data exist; build state.
- :meth:`StepCallback.before_first_step` (``on_train_start``): every callback is set up; plan the first batch.
- :meth:`StepCallback.after_step` (``on_train_batch_end``): observe the step's :class:`StepOutput`, plan the next.

Callbacks that reshape a step's batch also implement :class:`~lit_rlft.step.context.RolloutHook` (``on_rollouts``),
which the step calls between scoring and advantages; ``RolloutHook`` is re-exported here for them to subclass.
``FabricLoop`` and a plain loop call the three methods themselves; only the Trainer goes through the hooks below.

Under the Trainer a step's :class:`StepOutput` travels from ``training_step`` to ``on_train_batch_end`` as a dict of
its fields (:func:`as_trainer_output`): Lightning's manual optimisation accepts only a mapping (or a tensor) there.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import lightning as L

from lit_rlft.step.context import RolloutHook, StepContext, StepOutput

__all__ = ["RolloutHook", "StepCallback", "as_trainer_output", "from_trainer_output", "step_context"]


def step_context(pl_module: Any) -> StepContext:
    """The :class:`StepContext` of the module a hook receives (``GRPOModule.grpo``)."""
    ctx = getattr(pl_module, "grpo", None)
    if ctx is None:
        raise TypeError(f"lit_rlft callbacks need a GRPOModule (or a module whose `grpo` is a StepContext), got "
                        f"{type(pl_module).__name__}")
    return ctx


class StepCallback(L.Callback):
    """A Lightning callback whose work is done by three context-level methods (see the module docstring)."""

    def setup_step(self, ctx: StepContext) -> None:
        """Once the policy and the data exist (``on_fit_start``, after a checkpoint's state was loaded)."""

    def before_first_step(self, ctx: StepContext) -> None:
        """After every callback's :meth:`setup_step` (``on_train_start``)."""

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        """After each rollout step (``on_train_batch_end``); ``ctx.rollout_step - 1`` is the step that ran."""

    # -- Lightning hooks -------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.setup_step(step_context(pl_module))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.before_first_step(step_context(pl_module))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.after_step(step_context(pl_module), from_trainer_output(outputs))


def as_trainer_output(output: StepOutput) -> dict[str, Any]:
    """What ``training_step`` returns: ``output``'s fields as a dict (``outputs["rollouts"]`` in any callback)."""
    return {f.name: getattr(output, f.name) for f in fields(output)}


def from_trainer_output(outputs: Any) -> StepOutput:
    """The :class:`StepOutput` of ``on_train_batch_end``'s ``outputs`` (a dict of its fields under the Trainer)."""
    return outputs if isinstance(outputs, StepOutput) else StepOutput(**{f.name: outputs[f.name]
                                                                         for f in fields(StepOutput)})

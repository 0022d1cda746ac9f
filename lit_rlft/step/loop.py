"""The one driver loop of a GRPO step, written out where it can be read (as litgpt's ``fit`` and torchtune's recipes
show theirs): what ``FabricLoop``, the plain PyTorch loop of ``docs/design.md`` and the tests run.

    step = build_step(config)                         # or build_step(config, models=False) + step.attach(...)
    data.setup("fit")
    step.bind(data, callbacks=callbacks)              # add ends=lambda: ... for a limit of your own
    backend = TorchBackend(step.policy, optimizer, scheduler)
    for out in train(step, backend, callbacks):       # one StepOutput per rollout step, after the callbacks saw it
        print(out.step, out.metrics["reward"])

Under the Trainer, Lightning's own loop calls the same three callback methods through its hooks
(:class:`~lit_rlft.callbacks.base.StepCallback`: ``on_fit_start``, ``on_train_start``, ``on_train_batch_end``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lit_rlft.step.context import StepOutput
from lit_rlft.step.grpo import GRPOStep
from lit_rlft.step.update import UpdateBackend

__all__ = ["train"]


def train(step: GRPOStep, backend: UpdateBackend, callbacks: Sequence[Any] = (), *,
          on_output: Callable[[StepOutput], None] | None = None) -> Iterator[StepOutput]:
    """Run ``step`` until training ends, yielding each step's output.

    Args:
        step: a step bound to its data (:meth:`GRPOStep.bind`) with a policy attached.
        backend: how the update backpropagates and steps the optimizer (:class:`~lit_rlft.step.update.TorchBackend`,
            Fabric's ``LightningBackend``).
        callbacks: lit_rlft callbacks (anything with ``setup_step``, ``before_first_step`` and ``after_step``), in the
            order they were bound to the step.
        on_output: called with each step's output before the callbacks' ``after_step`` (a driver's counters and
            logging: a callback asking ``ctx.ends_after_this_step()`` must see them).

    The loop::

        step.start()                                       # the source on the current weights, training mode
        every callback's setup_step, then every callback's before_first_step
        while not step.ends_after_this_step():             # a stop requested, a StopCondition met, bind's ends
            out = step.run(backend)
            on_output(out); every callback's after_step(step, out)
            yield out

    The step is closed (its reward and environment workers, a generation process) when the loop ends, raises or is
    left early (``break``); a later :func:`train` starts them again.
    """
    try:
        step.start()
        for cb in callbacks:
            cb.setup_step(step)
        for cb in callbacks:
            cb.before_first_step(step)
        while not step.ends_after_this_step():
            out = step.run(backend)
            if on_output is not None:
                on_output(out)
            for cb in callbacks:
                cb.after_step(step, out)
            yield out
    finally:
        step.close()

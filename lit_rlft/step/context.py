"""The declared seams of a GRPO step: what callbacks may use of it (:class:`StepContext`), how they reshape a
batch (:class:`RolloutHook`) or end training (:class:`StopCondition`, :meth:`StepContext.request_stop`), and what a
step returns (:class:`StepOutput`).

:class:`~lit_rlft.step.grpo.GRPOStep` implements :class:`StepContext`; lit_rlft's callbacks are typed against the
Protocol and tested against a minimal fake of it, never against ``GRPOModule``'s members. Lightning-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn

    from lit_rlft.core.types import OutcomeRecord, Rollouts
    from lit_rlft.data.plan import BatchPlan
    from lit_rlft.data.pool import PromptPool
    from lit_rlft.runtime.distributed import Collective
    from lit_rlft.step.budget import RolloutBudget

__all__ = ["PromptData", "RolloutHook", "StepContext", "StepOutput", "StopCondition", "planned_generations"]


class PromptData(Protocol):
    """The prompt data a step binds (``PromptDataModule`` is one): the batch plan, the pools, and rendering."""

    plan: BatchPlan | None
    """Which prompts the next training step rolls out (None until the training pool is set up)."""
    train_pool: PromptPool | None
    val_pool: PromptPool | None
    """The held-out pool (None: no validation)."""
    batch_size: int

    def prompt_tokens(self, ids: np.ndarray, split: str = "train") -> list[list[int]]: ...

    def prompt_texts(self, ids: np.ndarray, split: str = "train") -> list[str]: ...

    def reward_columns(self, ids: np.ndarray, split: str = "train") -> dict[str, list[Any]]: ...

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Render prompts with the policy's tokenizer (and its chat template)."""
        ...

    def set_tools(self, schemas: list[dict[str, Any]]) -> None:
        """Describe these tools (JSON schemas) in chat-template prompts."""
        ...


@runtime_checkable
class StepContext(Protocol):
    """What a callback may use of the running step.

    ``rollout_step`` counts completed rollout steps: inside :meth:`RolloutHook.on_rollouts` it is the index of the
    step being run; after a step (``on_train_batch_end``) the step that just ran is ``rollout_step - 1`` and the one
    being planned is ``rollout_step``.
    """

    @property
    def rollout_step(self) -> int: ...

    @property
    def num_generations(self) -> int:
        """``G``, completions per prompt."""
        ...

    @property
    def collective(self) -> Collective:
        """The ranks of the run (decisions must be the same on each)."""
        ...

    @property
    def budget(self) -> RolloutBudget:
        """Cumulative rollout cost of the run (global)."""
        ...

    @property
    def data(self) -> PromptData: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids that end a completion (a stored completion without one was cut at the length limit)."""
        ...

    @property
    def policy(self) -> nn.Module:
        """The policy (DOTS embeds prompts with its base model)."""
        ...

    @property
    def device(self) -> torch.device: ...

    def rollout(self, prompt_ids: np.ndarray, purpose: str = "train",
                num_generations: int | None = None) -> tuple[Rollouts, OutcomeRecord]:
        """Roll out the global prompt ids ``[b]`` (a collective call: every rank, the same ids), ``num_generations``
        completions each (default ``G``): this rank's :class:`Rollouts` and every rank's :class:`OutcomeRecord`,
        charged to the budget under ``purpose``."""
        ...

    def success_rates(self, prompt_ids: np.ndarray, purpose: str = "reference",
                      num_generations: int | None = None) -> np.ndarray:
        """Roll out ``prompt_ids`` ``[K]`` (any ``K``, a collective call), ``num_generations`` completions each
        (default ``G``), and return their success rates ``[K]``."""
        ...

    def log(self, metrics: Mapping[str, float]) -> None:
        """Scalars at the current rollout step (TensorBoard under the Trainer and Fabric)."""
        ...

    def log_text(self, tag: str, text: str) -> None:
        """A text (markdown) at the current rollout step, written by rank 0."""
        ...

    def ends_after_this_step(self) -> bool:
        """Whether training stops after the step that just ran (``max_steps``, a stop request, a spent budget):
        planning a next step would be wasted work."""
        ...

    def request_stop(self, reason: str) -> None:
        """End training after the step that just ran, under the Trainer, ``FabricLoop`` or a plain loop (which asks
        :meth:`ends_after_this_step`). ``reason`` is said when the run ends; every rank must request it alike."""
        ...

    def save_checkpoint(self, path: str) -> None:
        """Write the run's checkpoint (weights, optimizer, every callback's state) to ``path`` now, through the
        driver; every rank must call it alike. A driver that binds no checkpoint writer raises."""
        ...

    @property
    def log_dir(self) -> str:
        """Where the run writes its files."""
        ...

    @property
    def callbacks(self) -> Sequence[Any]:
        """The callbacks the step was bound with (a rollout hook that uses another callback's predictions finds it
        here: ``AllocationCallback``)."""
        ...

    @property
    def async_depth(self) -> int:
        """``k``, batches generated ahead of training (``model.asynchronous.depth``; 0: synchronous). After step
        ``t`` (``rollout_step == t + 1``) the batches of steps ``t + 1 .. t + k`` are in flight, and what a callback
        plans is the batch of step ``t + 1 + k``: its observations lag by ``k`` steps."""
        ...

    @property
    def in_flight(self) -> np.ndarray:
        """``[n]`` global prompt ids dispatched and not yet observed (empty when synchronous): selection must not draw
        them (the plan's uniform draws skip them)."""
        ...


@runtime_checkable
class RolloutHook(Protocol):
    """Reshapes a step's batch after scoring and before advantages (dynamic sampling refills, replay mixes in).

    ``rollouts`` are this rank's, ``record`` every rank's outcomes. A hook returns both, consistent
    (``record.trained_batch()`` is the global batch whose slice on this rank is ``rollouts``), with the same number of
    groups on every rank, ``G`` completions each; more generation goes through ``ctx.rollout(ids)``, which every rank
    calls with the same ids.

    A hook that allocates completions per prompt declares ``initial_generations`` (an int attribute): the step then
    rolls out its planned batch with that many completions per prompt instead of ``G``, and the hook completes the
    groups it keeps (``ScreeningCallback``). At most one bound hook may declare it.
    """

    def on_rollouts(self, ctx: StepContext, rollouts: Rollouts,
                    record: OutcomeRecord) -> tuple[Rollouts, OutcomeRecord]: ...


def planned_generations(hooks: Sequence[RolloutHook], num_generations: int) -> int:
    """Completions per prompt of a step's planned batch: ``num_generations`` (``G``), or the ``initial_generations``
    that one of ``hooks`` declares (it must be the first hook: it completes the planned batch's groups)."""
    hooks = list(hooks)
    declared = [(i, type(h).__name__, h.initial_generations) for i, h in enumerate(hooks)
                if getattr(h, "initial_generations", None) is not None]
    if len(declared) > 1:
        raise ValueError(f"{' and '.join(name for _, name, _ in declared)} both set how many completions the "
                         "planned batch gets (initial_generations): bind at most one of them")
    if declared and declared[0][0] != 0:
        raise ValueError(f"{declared[0][1]} must be the first rollout hook (it completes the planned batch's "
                         f"groups; {type(hooks[0]).__name__} comes before it): list it before the others")
    return declared[0][2] if declared else num_generations


@runtime_checkable
class StopCondition(Protocol):
    """A callback that ends training when a condition holds (``RolloutBudgetStop``: the budget is spent).

    The step asks every bound condition whenever anyone asks whether training ends (:meth:`StepContext.
    ends_after_this_step`), so a selection callback that runs first in a step's after-step hooks already knows not to
    plan a step that will not run; the first reason met becomes a :meth:`StepContext.request_stop`.
    """

    def stop_reason(self, ctx: StepContext) -> str | None:
        """Why training should end after the step that just ran, or None to go on."""
        ...


@dataclass(frozen=True)
class StepOutput:
    """What one rollout step returns; the callbacks' ``after_step`` receives it (under the Trainer,
    ``on_train_batch_end``'s ``outputs`` holds its fields as a dict: ``outputs["rollouts"]``)."""


    step: int
    """The rollout step that ran (0-based)."""
    rollouts: Rollouts
    """This rank's trained rollouts (fresh and replayed), with every row's ``behaviour_logprobs`` (the update's)."""
    record: OutcomeRecord
    """Every rank's outcomes: the global batch and every group rolled out but not trained on."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The step's scalars (also logged): rewards, loss statistics, budget, times."""
    optimizer_steps: int = 0
    """Optimizer steps this rollout step made (``num_iterations * num_mini_batches``)."""

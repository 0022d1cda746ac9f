"""CompletionLogger: sample completions (prompt, completion, reward) as TensorBoard text every N steps."""

from __future__ import annotations

from typing import Any

from lit_rlft.callbacks.base import StepCallback
from lit_rlft.step.context import StepContext, StepOutput


class CompletionLogger(StepCallback):
    """Write a markdown table of ``num_samples`` completions to the logger every ``every_n_steps`` steps.

    Example::

        trainer = L.Trainer(callbacks=[CompletionLogger(every_n_steps=20, num_samples=8)])

    Args:
        every_n_steps: rollout steps between two tables (the first step is always logged).
        num_samples: rows per table: the first completion of each of the first groups.
        max_chars: completions are cut to this many characters.
    """

    def __init__(self, every_n_steps: int = 20, num_samples: int = 8, max_chars: int = 400):
        if every_n_steps < 1:
            raise ValueError(f"CompletionLogger: every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps, self.num_samples, self.max_chars = every_n_steps, num_samples, max_chars

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        step = ctx.rollout_step - 1
        if step % self.every_n_steps == 0 and ctx.collective.rank == 0:  # only rank 0 writes text
            ctx.log_text("completions", self.table(output.rollouts))

    def table(self, rollouts: Any) -> str:
        G = rollouts.group_size
        rows = ["| prompt | completion | reward | replayed |", "|---|---|---|---|"]
        for b in range(min(self.num_samples, rollouts.num_groups)):  # the first completion of each group
            i = b * G
            prompt = _cell(rollouts.prompts[b], self.max_chars) if rollouts.prompts else ""
            rows.append(
                f"| {prompt} | {_cell(rollouts.completions[i], self.max_chars)} | "
                f"{float(rollouts.rewards.view(-1)[i]):.3f} | {bool(rollouts.is_replay[b])} |"
            )
        return "\n".join(rows)


def _cell(text: str, limit: int) -> str:
    text = text if len(text) <= limit else text[:limit] + "..."
    return "`" + text.replace("|", "\\|").replace("\n", " ⏎ ").replace("`", "'") + "`"

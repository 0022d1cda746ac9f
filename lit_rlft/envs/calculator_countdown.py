"""Countdown with a calculator tool: demonstrations for a warm start that calls the tool, reads its result and answers.

The tool-calling example (``configs/envs/sft_calculator_countdown_tiny.yaml`` then
``configs/envs/calculator_countdown_tiny.yaml``): the policy proposes an expression by calling the calculator,
``<tool_call>{"name": "calculator", "arguments": {"expression": "8*11+11-12"}}</tool_call>``, the
:class:`~lit_rlft.envs.ToolEnvironment` answers with its value inside ``<tool_response>`` tags, and the policy either
calls again (the value missed the target) or answers ``<answer>8*11+11-12</answer>`` (a turn without a tool call,
which ends the episode); the Countdown reward scores the answer. A policy that uses the tool well gets several
checked attempts per episode; one that answers blindly gets one unchecked attempt.

A tiny policy trained on plain Countdown has never seen a tool call, so it would never make one:
:class:`CalculatorCountdownDemonstrations` are supervised pairs laid out exactly as the episodes are (the text the
:class:`~lit_rlft.rollout.episodes.EpisodeRunner` builds with :class:`~lit_rlft.envs.formats.TextFormat`), from which
the warm start learns the call format, when to call again and when to answer.
"""

from __future__ import annotations

import json
import random

from lit_rlft.data.loading import Record
from lit_rlft.data.tasks import CountdownTask, Task, random_countdown_expression

__all__ = ["CalculatorCountdownDemonstrations", "tool_call_text"]

_RETRIES = 20
"""Random expressions tried for a wrong attempt before the demonstration goes without one."""


def tool_call_text(name: str, arguments: dict) -> str:
    """One call in the Hermes / Qwen format that :func:`~lit_rlft.envs.parse_tool_calls` reads.

    >>> tool_call_text("calculator", {"expression": "2+3"})
    '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    """
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _response(value: str) -> str:
    """The calculator's answer as :class:`~lit_rlft.envs.formats.TextFormat` renders a ``tool`` message."""
    return f"\n<tool_response>\n{value}\n</tool_response>\n"


class CalculatorCountdownDemonstrations(Task):
    """Supervised pairs for the calculator-on-Countdown warm start, each a state of an episode and its next turn.

    Every pair comes from one :class:`~lit_rlft.data.CountdownTask` instance (the RL run's generator, same options):
    the ``prompt`` field is the instance's prompt followed by ``k`` wrong attempts (``k`` uniform in
    ``0 .. max_calls - 1``), each a calculator call with a random expression over the numbers whose value misses the
    target, the call's end of turn (``eos``, the tokenizer's EOS as text: ``"<eos>"`` for the tiny policy) and the
    tool's answer; the ``solution`` field (the next turn) is, with equal chance, either a call with the instance's
    solution expression, or, after that call and its answer (the target), ``<answer>`` with the same expression. The
    warm start thus learns the call format, to call again after a miss and to answer after a hit; which expression to
    propose is the RL run's to improve. Use with ``lit-rlft sft`` (``target_field: solution``).

    Args:
        size: Number of pairs.
        num_numbers / weights / max_number / max_target / split / held_out_fraction: as
            :class:`~lit_rlft.data.CountdownTask`.
        max_calls: Most calculator calls of a demonstrated episode (the RL run's ``max_turns`` minus the answer).
        tool: The tool's name, as the environment knows it.
        eos: The EOS token as text.
        seed: Random seed (the instances', and the attempts').
    """

    def __init__(self, size: int = 50000, num_numbers: list[int] = [2, 3, 4],  # noqa: B006 (copied; shows in the CLI)
                 weights: list[float] | None = None, max_number: int = 15, max_target: int = 99,
                 split: str = "train", held_out_fraction: float = 0.2, max_calls: int = 3,
                 tool: str = "calculator", eos: str = "<eos>", seed: int = 0) -> None:
        if max_calls < 1:
            raise ValueError(f"CalculatorCountdownDemonstrations: max_calls must be >= 1, got {max_calls}")
        self.tasks = CountdownTask(size=size, num_numbers=list(num_numbers), weights=weights, max_number=max_number,
                                   max_target=max_target, split=split, held_out_fraction=held_out_fraction, seed=seed)
        self.size, self.max_calls, self.tool, self.eos, self.seed = size, max_calls, tool, eos, seed

    def _call(self, expression: str) -> str:
        return tool_call_text(self.tool, {"expression": expression})

    def records(self) -> list[Record]:
        rng = random.Random(f"calculator_countdown:{self.seed}")
        out: list[Record] = []
        for i, task in enumerate(self.tasks.records()):
            nums, target, solution = task.data["nums"], task.data["target"], task.data["solution"]
            text = task.data["prompt"]
            for _ in range(rng.randint(0, self.max_calls - 1)):
                wrong = self._miss(nums, target, rng)
                if wrong is None:  # every expression tried hits the target: no wrong attempt to show
                    break
                expression, value = wrong
                text += f"{self._call(expression)}{self.eos}{_response(str(value))}"
            if rng.random() < 0.5:
                next_turn = self._call(solution)
            else:
                text += f"{self._call(solution)}{self.eos}{_response(str(target))}"
                next_turn = f"<answer>{solution}</answer>"
            out.append(Record({"prompt": text, "solution": next_turn, "nums": nums, "target": target},
                              f"generated:calculator_countdown_sft#{i}"))
        return out

    @staticmethod
    def _miss(nums: list[int], target: int, rng: random.Random) -> tuple[str, int] | None:
        """A random expression using every number once whose value is not ``target``, and its value."""
        for _ in range(_RETRIES):
            order = list(nums)
            rng.shuffle(order)
            expression, value = random_countdown_expression(order, rng)
            if value != target:
                return expression, value
        return None

"""A small multi-turn game for testing and demonstrating multi-turn rollouts: guess a number, told higher or lower.

:class:`GuessNumberTask` generates the prompts (a ``target`` per row, from a small range so that a tiny model can
learn the game); :class:`GuessNumberEnv` plays the other side. Each policy turn must hold ``<guess>N</guess>``: a
right guess ends the episode with reward 1, a turn without a readable guess ends it with reward 0, and a wrong
guess is answered ``"higher"`` or ``"lower"`` (a ``user`` message) for the policy to guess again. An episode cut by
the turn limit before the right guess scores 0 (:func:`~lit_rlft.envs.base.environment_reward`). A policy that
learns binary search needs at most ``ceil(log2(high - low + 2))`` turns (5 for ``1..16``).
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Sequence
from typing import Any

from lit_rlft.data.loading import Record
from lit_rlft.data.tasks import SampledTask, Split, Task
from lit_rlft.envs.base import Environment, EnvStep, Message

__all__ = ["GuessNumberDemonstrations", "GuessNumberEnv", "GuessNumberTask", "binary_search_guesses", "guess_number_key", "parse_guess"]

_OPEN, _CLOSE = "<guess>", "</guess>"
MAX_GUESS_CHARS = 32
"""Longest content of a ``<guess>`` tag read as a number (longer is no guess)."""


def parse_guess(text: str) -> int | None:
    """The integer in the last closed ``<guess>...</guess>`` of ``text`` (from the last ``<guess>`` before the last
    ``</guess>``, surrounding whitespace allowed); None when there is none or its content is not an integer.
    Linear time (two reverse searches)."""
    end = text.rfind(_CLOSE)
    start = text.rfind(_OPEN, 0, end) if end != -1 else -1
    if start == -1:
        return None
    return _as_int(text[start + len(_OPEN) : end])


def _as_int(value: Any) -> int | None:
    """An integer column value (int, integral float, numeric string) as an int; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] in ("+", "-") else text
        return int(text) if digits.isascii() and digits.isdigit() and len(text) <= MAX_GUESS_CHARS else None
    return None


class GuessNumberEnv(Environment):
    """Guess the number: ``"higher"`` / ``"lower"`` after each wrong guess, reward 1.0 for the right one.

    ``step`` reads the last ``<guess>N</guess>`` of the policy's last turn (:func:`parse_guess`): equal to the row's
    target, ``EnvStep(done=True, reward=1.0)``; none readable, ``EnvStep(done=True, reward=0.0)``; otherwise the
    observation ``{"role": "user", "content": "higher"}`` (the target is higher than the guess) or ``"lower"``.
    A guess outside the bounds is answered the same way. Score episodes with
    :func:`~lit_rlft.envs.base.environment_reward`.

    Args:
        target_column: the row's integer column holding the number to guess.
        low: smallest possible target when the row has no ``low_column``.
        high: largest possible target when the row has no ``high_column``.
        low_column: the row's optional column overriding ``low``.
        high_column: the row's optional column overriding ``high``.
        name: shown in the logs and in failure messages.

    Raises (from ``step``):
        ValueError: the row has no integer target, or its target is outside ``[low, high]`` (a data error).
    """

    def __init__(
        self,
        target_column: str = "target",
        low: int = 1,
        high: int = 100,
        low_column: str = "low",
        high_column: str = "high",
        name: str = "guess_number",
    ) -> None:
        if low > high:
            raise ValueError(f"GuessNumberEnv: low ({low}) must be <= high ({high})")
        self.target_column = target_column
        self.low, self.high = int(low), int(high)
        self.low_column, self.high_column = low_column, high_column
        self.name = name

    def target(self, row: dict[str, Any]) -> int:
        """The row's target, checked against its bounds."""
        if self.target_column not in row:
            raise ValueError(f"{self.name}: the row has no column {self.target_column!r} (the number to guess; "
                             f"columns: {sorted(row)})")
        target = _as_int(row[self.target_column])
        if target is None:
            raise ValueError(f"{self.name}: column {self.target_column!r} must be an integer, got "
                             f"{row[self.target_column]!r}")
        low, high = self.low, self.high
        for column, what in ((self.low_column, "low"), (self.high_column, "high")):
            if row.get(column) is not None:
                value = _as_int(row[column])
                if value is None:
                    raise ValueError(f"{self.name}: column {column!r} ({what} bound) must be an integer, got "
                                     f"{row[column]!r}")
                low, high = (value, high) if what == "low" else (low, value)
        if not low <= target <= high:
            raise ValueError(f"{self.name}: target {target} is outside [{low}, {high}]")
        return target

    def step(self, messages: Sequence[Message], row: dict[str, Any]) -> EnvStep:
        """Answer the guess of ``messages[-1]`` (see the class docstring)."""
        if not messages:
            raise ValueError(f"{self.name}: step needs the episode's messages (got none)")
        target = self.target(row)
        guess = parse_guess(messages[-1].get("content") or "")
        if guess is None:
            return EnvStep(done=True, reward=0.0)
        if guess == target:
            return EnvStep(done=True, reward=1.0)
        return EnvStep(observation=[{"role": "user", "content": "higher" if target > guess else "lower"}])


# ------------------------------------------------------------------------------------------------------------ task


def guess_number_key(low: int, high: int, target: int) -> str:
    """Canonical key of an instance, for the held-out hash: ``"guess:1-16>7"``."""
    return f"guess:{low}-{high}>{target}"


def binary_search_guesses(low: int, high: int, target: int) -> int:
    """Guesses that binary search (guessing the midpoint ``(low + high) // 2``) needs to find ``target``:
    1 for the first midpoint, up to ``ceil(log2(high - low + 2))``."""
    guesses = 0
    while low <= high:
        guesses += 1
        mid = (low + high) // 2
        if mid == target:
            return guesses
        low, high = (mid + 1, high) if target > mid else (low, mid - 1)
    raise ValueError(f"target {target} is outside the range")


class GuessNumberTask(SampledTask):
    """Guess-the-number prompts for :class:`GuessNumberEnv`: each instance draws its target uniformly from
    ``low..high``, redrawn until it falls in the requested split (and, with ``unique``, is new).

    Record fields: ``prompt`` (``"Guess my number between 1 and 16. Answer with <guess>N</guess>.\\n"``),
    ``target`` (int), ``low``, ``high`` (int), ``answer`` (``str(target)``, so the datamodule's default
    ``answer_field`` works) and ``difficulty`` (the guesses binary search needs, :func:`binary_search_guesses`).

    The held-out hash is over :func:`guess_number_key`, so ``split="test"`` holds targets that ``"train"`` never
    has (binary search generalises to them; memorised answers do not). For a validation pool of the training
    distribution, use ``split="train"`` with another seed.

    Args:
        size: Number of instances.
        low: Smallest target.
        high: Largest target (``1..16`` by default: a tiny model can learn it).
        split: ``"train"`` (not held out), ``"test"`` (held out) or ``"all"``.
        held_out_fraction: Fraction of targets held out, by a fixed hash.
        seed: Random seed; the same arguments give the same records.
        unique: Keep only the first instance of each target (``size`` at most the split's number of targets).
    """

    def __init__(
        self,
        size: int = 1000,
        low: int = 1,
        high: int = 16,
        split: Split = "train",
        held_out_fraction: float = 0.2,
        seed: int = 0,
        unique: bool = False,
    ) -> None:
        super().__init__(size, split, held_out_fraction, seed, unique)
        if not isinstance(low, int) or not isinstance(high, int) or low > high:
            raise ValueError(f"low and high must be integers with low <= high, got low={low!r}, high={high!r}")
        self.low = low
        self.high = high

    def records(self) -> list[Record]:
        """Generate the instances (deterministic for the arguments)."""
        rng = random.Random(self.seed)

        def draw(_: None) -> tuple[str, int]:
            target = rng.randint(self.low, self.high)
            return guess_number_key(self.low, self.high, target), target

        def describe(_: None) -> str:
            return (
                f"targets {self.low}..{self.high}, split={self.split!r}, unique={self.unique}: lower size, "
                "widen the range, or set unique=False"
            )

        prompt = f"Guess my number between {self.low} and {self.high}. Answer with <guess>N</guess>.\n"
        return [
            Record(
                {
                    "prompt": prompt,
                    "target": target,
                    "low": self.low,
                    "high": self.high,
                    "answer": str(target),
                    "difficulty": binary_search_guesses(self.low, self.high, target),
                },
                f"generated:guess_number#{i}",
            )
            for i, target in enumerate(self.sample(draw, describe))
        ]


class GuessNumberDemonstrations(Task):
    """Supervised warm-start pairs for the guessing game: the state of a game after ``k`` wrong guesses (``k`` uniform
    in ``0..max_history``), as the policy sees it, and a next guess drawn uniformly from the numbers still possible.

    The ``prompt`` field is the episode so far as text, laid out as :class:`~lit_rlft.rollout.episodes.EpisodeRunner`
    lays it out with :class:`~lit_rlft.envs.formats.TextFormat`'s default ``user`` template: the task's prompt, then
    per wrong guess ``"<guess>g</guess>" + eos + "\\nhigher\\n"`` (or ``lower``); ``eos`` is the tokenizer's EOS
    token written as text (``"<eos>"`` for the tiny policy: its tokenizer reads it as the one special token). The
    ``solution`` field is the next turn, ``"<guess>g</guess>"``. The demonstrator guesses at random among the
    consistent numbers, not by bisection: the warm start learns the format and the rules, and reinforcement learning
    has the strategy (fewer turns, more games won within ``max_turns``) to find. Use with ``lit-rlft sft``
    (``target_field: solution``).

    Args:
        size: Number of pairs.
        low / high: The range, as the :class:`GuessNumberTask` of the RL run.
        max_history: Most wrong guesses before the demonstrated one.
        eos: The EOS token as text.
        seed: Random seed.
    """

    def __init__(self, size: int = 20000, low: int = 1, high: int = 16, max_history: int = 4, eos: str = "<eos>",
                 seed: int = 0) -> None:
        if size < 1 or max_history < 0 or low > high:
            raise ValueError(f"need size >= 1, max_history >= 0 and low <= high, got size={size}, "
                             f"max_history={max_history}, low={low}, high={high}")
        self.size, self.low, self.high, self.max_history, self.eos, self.seed = size, low, high, max_history, eos, seed

    def records(self) -> list[Record]:
        rng = random.Random(self.seed)
        prompt = f"Guess my number between {self.low} and {self.high}. Answer with <guess>N</guess>.\n"
        out: list[Record] = []
        while len(out) < self.size:
            target = rng.randint(self.low, self.high)
            lo, hi, text = self.low, self.high, prompt
            for _ in range(rng.randint(0, self.max_history)):
                candidates = [g for g in range(lo, hi + 1) if g != target]
                if not candidates:
                    break
                guess = rng.choice(candidates)
                feedback = "higher" if target > guess else "lower"
                text += f"{_OPEN}{guess}{_CLOSE}{self.eos}\n{feedback}\n"
                lo, hi = (guess + 1, hi) if target > guess else (lo, guess - 1)
            out.append(Record({"prompt": text, "solution": f"{_OPEN}{rng.randint(lo, hi)}{_CLOSE}",
                               "target": target}, f"generated:guess_number_sft#{len(out)}"))
        return out

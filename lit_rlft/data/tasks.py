"""Seeded synthetic tasks (Countdown, multi-digit arithmetic) that produce :class:`Record` rows.

Every task has typed constructor arguments (LightningCLI builds them from YAML) and a ``records()`` method. Records
are deterministic for a seed. A fixed hash of each instance's key (independent of the seed) holds out a fraction
of the instance space: ``split="train"`` yields only non-held-out instances, ``"test"`` only held-out ones and
``"all"`` both, so a train pool and a test pool never share an instance, whatever their seeds.

Such tasks derive from :class:`SampledTask`, which holds these shared arguments and draws the instances by rejection
sampling (:meth:`SampledTask.sample`); a task only says how to draw one candidate and how to write its record.
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from lit_rlft.data.loading import Record

__all__ = [
    "ArithmeticTask",
    "CountdownTask",
    "SampledTask",
    "Split",
    "Task",
    "arithmetic_value",
    "countdown_key",
    "held_out",
    "random_countdown_expression",
    "task_records",
    "write_jsonl",
]

Split = Literal["train", "test", "all"]

#: Consecutive rejected candidates after which generation gives up (the instance space is too small).
MAX_CONSECUTIVE_REJECTIONS: int = 50_000

_T = TypeVar("_T")


class Task(ABC):
    """A generated task: a source of records (subclass it and YAML can name it by ``class_path``)."""

    @abstractmethod
    def records(self) -> list[Record]:
        """All instances of the task, as records."""


def held_out(key: str, fraction: float) -> bool:
    """Whether the instance with this canonical key is held out: ``sha1(key)[:8] / 2**32 < fraction``."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16) / 2**32 < fraction


def countdown_key(nums: Iterable[int], target: int) -> str:
    """Canonical Countdown key, order-free: ``"3,7,12>81"`` for numbers ``{12, 7, 3}`` and target 81."""
    return ",".join(str(n) for n in sorted(nums)) + f">{target}"


class SampledTask(Task):
    """A task whose instances are drawn at random and kept by split: the shared arguments and the sampling loop.

    A subclass takes ``size``, ``split``, ``held_out_fraction``, ``seed`` and ``unique`` among its own typed
    arguments (documented in its ``Args:``), hands them to ``super().__init__`` (which checks them and sets the
    attributes of the same names) and generates its records through :meth:`sample`::

        def records(self) -> list[Record]:
            rng = random.Random(self.seed)

            def draw(_: None) -> tuple[str, int]:
                n = rng.randint(1, 99)
                return str(n), n  # (key, instance)

            return [Record({"n": n}, f"generated:example#{i}")
                    for i, n in enumerate(self.sample(draw, lambda _: "lower size"))]

    Args:
        size: Number of instances.
        split: ``"train"`` (not held out), ``"test"`` (held out) or ``"all"``.
        held_out_fraction: Fraction of keys held out, by a fixed hash (:func:`held_out`).
        seed: Random seed.
        unique: Keep only the first instance of each key.
    """

    def __init__(self, size: int, split: Split, held_out_fraction: float, seed: int, unique: bool) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        if not 0.0 <= held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction must be in [0, 1), got {held_out_fraction!r}")
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be one of 'train', 'test', 'all', got {split!r}")
        if split == "test" and held_out_fraction == 0.0:
            raise ValueError("split='test' with held_out_fraction=0 has no instances: set held_out_fraction > 0")
        self.size = size
        self.split = split
        self.held_out_fraction = held_out_fraction
        self.seed = seed
        self.unique = unique

    def sample(
        self,
        draw: Callable[[Any], tuple[str, _T] | None],
        describe: Callable[[Any], str],
        stratum: Callable[[], Any] | None = None,
    ) -> Iterator[_T]:
        """Yield ``size`` instances, drawn by rejection sampling.

        Per instance, ``stratum()`` is called once (when given: e.g. the instance's count of numbers, drawn by
        weight), then ``draw(s)`` with its value ``s`` (None without ``stratum``) until a candidate is kept.
        ``draw`` returns ``(key, instance)``, or None for a candidate that is invalid in itself; a candidate is kept
        when ``held_out(key, held_out_fraction)`` fits ``split`` and, with ``unique``, no kept candidate had its key.

        A generator: each instance is drawn when the caller asks for it, so the caller may use the same random
        stream between instances (to shuffle what it was given, say).

        Args:
            draw: One candidate from the stratum's value: ``(key, instance)`` or None.
            describe: The settings that make the instance space too small, for the error message, from the
                stratum's value (e.g. ``"3 numbers, max_number=15, ...: lower size or ..."``).
            stratum: Called once per instance, before its candidates; None for no stratum.

        Raises:
            ValueError: ``MAX_CONSECUTIVE_REJECTIONS`` candidates in a row were rejected (the message names the
                task, the instances collected so far and ``describe(s)``).
        """
        seen: set[str] = set()
        for count in range(self.size):
            s = stratum() if stratum is not None else None
            rejected = 0
            while True:
                drawn = draw(s)
                if drawn is not None:
                    key, instance = drawn
                    kept = self.split == "all" or (self.split == "test") == held_out(key, self.held_out_fraction)
                    if kept and not (self.unique and key in seen):
                        break
                rejected += 1
                if rejected >= MAX_CONSECUTIVE_REJECTIONS:
                    raise ValueError(
                        f"{type(self).__name__}: collected only {count} of size={self.size} instances after "
                        f"{MAX_CONSECUTIVE_REJECTIONS} consecutive rejected candidates: the instance space is too "
                        f"small for these settings ({describe(s)})"
                    )
            if self.unique:
                seen.add(key)
            yield instance


def _check_weights(weights: Sequence[float] | None, n: int, name: str, option: str) -> list[float] | None:
    if weights is None:
        return None
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise ValueError(f"weights must have one entry per {option} value ({n}), got {len(weights)}")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights} (for {name})")
    return weights


# ----------------------------------------------------------------------------------------------------- Countdown

# An expression tree is an int (leaf) or a tuple (op, left, right).
_PREC = {"+": 1, "-": 1, "*": 2}


def _build_tree(nums: list[int], rng: random.Random) -> Any:
    if len(nums) == 1:
        return nums[0]
    cut = rng.randint(1, len(nums) - 1)
    op = rng.choice("+-*")
    return (op, _build_tree(nums[:cut], rng), _build_tree(nums[cut:], rng))


def _value(tree: Any) -> int:
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    a, b = _value(left), _value(right)
    return a + b if op == "+" else a - b if op == "-" else a * b


def _infix(tree: Any) -> tuple[str, int]:
    """Infix text without spaces and with only the parentheses precedence needs; returns (text, precedence)."""
    if isinstance(tree, int):
        return str(tree), 3
    op, left, right = tree
    prec = _PREC[op]
    ltext, lprec = _infix(left)
    rtext, rprec = _infix(right)
    if lprec < prec:
        ltext = f"({ltext})"
    if rprec < prec or (rprec == prec and op == "-"):
        rtext = f"({rtext})"
    return f"{ltext}{op}{rtext}", prec


def random_countdown_expression(nums: list[int], rng: random.Random) -> tuple[str, int]:
    """A random expression using every number of ``nums`` once, in their order (random shape, operators uniform,
    as :class:`CountdownTask` builds its solutions): its infix text and its value."""
    tree = _build_tree(nums, rng)
    return _infix(tree)[0], _value(tree)


class CountdownTask(SampledTask):
    """Countdown: reach a target from a few numbers with ``+ - *`` and parentheses, each number used once.

    Each instance draws ``k`` from ``num_numbers`` (by ``weights``, uniform by default), ``k`` numbers uniformly
    from ``1..max_number`` (repeats allowed), and a random binary expression tree over them (random shape,
    operators uniform); a candidate is redrawn (same ``k``) until its value is in ``[0, max_target]``, it falls in
    the requested split, and (with ``unique``) its key is new. The numbers are then shuffled.

    Record fields: ``prompt`` (``"12 7 3>81="``), ``nums`` (list[int], prompt order), ``target`` (int),
    ``solution`` (the generating expression, e.g. ``"(12-3)*7+18"``: each number once, no spaces) and
    ``difficulty`` (``k``). No ``answer`` field: build pools with ``answer_field=None``.

    Args:
        size: Number of instances.
        num_numbers: Possible counts of numbers per instance (each >= 2).
        weights: Relative weight of each entry of ``num_numbers``; ``None`` for uniform.
        max_number: Numbers are drawn from ``1..max_number``.
        max_target: Targets lie in ``0..max_target``.
        split: ``"train"`` (not held out), ``"test"`` (held out) or ``"all"``.
        held_out_fraction: Fraction of keys ``(sorted nums, target)`` held out, by a fixed hash.
        seed: Random seed; the same arguments give the same records.
        unique: Keep only the first instance of each key ``(sorted nums, target)``.
    """

    def __init__(
        self,
        size: int = 4000,
        num_numbers: list[int] = [2, 3, 4],  # noqa: B006 (copied below; a list default shows in LightningCLI)
        weights: list[float] | None = None,
        max_number: int = 15,
        max_target: int = 99,
        split: Split = "train",
        held_out_fraction: float = 0.2,
        seed: int = 0,
        unique: bool = False,
    ) -> None:
        super().__init__(size, split, held_out_fraction, seed, unique)
        num_numbers = [int(k) for k in num_numbers]
        if not num_numbers or any(k < 2 for k in num_numbers):
            raise ValueError(f"num_numbers must be a non-empty list of integers >= 2, got {num_numbers}")
        if max_number < 1:
            raise ValueError(f"max_number must be >= 1, got {max_number}")
        if max_target < 0:
            raise ValueError(f"max_target must be >= 0, got {max_target}")
        self.num_numbers = num_numbers
        self.weights = _check_weights(weights, len(num_numbers), "CountdownTask", "num_numbers")
        self.max_number = max_number
        self.max_target = max_target

    def records(self) -> list[Record]:
        """Generate the instances (deterministic for the arguments)."""
        rng = random.Random(self.seed)

        def draw(k: int) -> tuple[str, tuple[int, list[int], Any, int]] | None:
            nums = [rng.randint(1, self.max_number) for _ in range(k)]
            tree = _build_tree(nums, rng)
            target = _value(tree)
            if not 0 <= target <= self.max_target:
                return None
            return countdown_key(nums, target), (k, nums, tree, target)

        def describe(k: int) -> str:
            return (
                f"{k} numbers, max_number={self.max_number}, max_target={self.max_target}, split={self.split!r}, "
                f"unique={self.unique}: lower size, raise max_number or max_target, or set unique=False"
            )

        def stratum() -> int:
            return rng.choices(self.num_numbers, weights=self.weights)[0]

        out: list[Record] = []
        for i, (k, nums, tree, target) in enumerate(self.sample(draw, describe, stratum)):
            shown = list(nums)
            rng.shuffle(shown)  # the next instance is drawn after this shuffle (sample is a generator)
            out.append(
                Record(
                    {
                        "prompt": " ".join(map(str, shown)) + f">{target}=",
                        "nums": shown,
                        "target": target,
                        "solution": _infix(tree)[0],
                        "difficulty": k,
                    },
                    f"generated:countdown#{i}",
                )
            )
        return out


# ---------------------------------------------------------------------------------------------------- Arithmetic


def arithmetic_value(operands: Sequence[int], ops: Sequence[str]) -> int:
    """Value of ``operands[0] ops[0] operands[1] ...`` with the usual precedence (``*`` before ``+ -``)."""
    terms: list[int] = [operands[0]]
    signs: list[int] = [1]
    for op, x in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


class ArithmeticTask(SampledTask):
    """Multi-digit arithmetic: ``"123+45="`` answered with the exact integer.

    Each instance draws ``d`` from ``digits`` (by ``weights``) and ``num_operands`` operands with exactly ``d``
    digits (``0..9`` for ``d = 1``, ``10**(d-1)..10**d - 1`` otherwise), and each operator uniformly from
    ``operators``. Results are kept non-negative: two operands are swapped, more are tried with the largest first,
    and a candidate that is still negative is redrawn. ``*`` binds tighter than ``+ -``.

    Record fields: ``prompt`` (``"123+45="``), ``answer`` (str, the exact result), ``solution`` (same as
    ``answer``), ``difficulty`` (``d``). Held out by a fixed hash of the prompt.

    Args:
        size: Number of instances.
        digits: Possible operand digit counts (each >= 1).
        weights: Relative weight of each entry of ``digits``; ``None`` for uniform.
        num_operands: Operands per instance (>= 2).
        operators: Characters from ``"+-*"`` to draw operators from.
        split: ``"train"`` (not held out), ``"test"`` (held out) or ``"all"``.
        held_out_fraction: Fraction of prompts held out, by a fixed hash.
        seed: Random seed; the same arguments give the same records.
        unique: Keep only the first instance of each prompt.
    """

    def __init__(
        self,
        size: int = 4000,
        digits: list[int] = [1, 2, 3],  # noqa: B006 (copied below; a list default shows in LightningCLI)
        weights: list[float] | None = None,
        num_operands: int = 2,
        operators: str = "+",
        split: Split = "train",
        held_out_fraction: float = 0.2,
        seed: int = 0,
        unique: bool = False,
    ) -> None:
        super().__init__(size, split, held_out_fraction, seed, unique)
        digits = [int(d) for d in digits]
        if not digits or any(d < 1 for d in digits):
            raise ValueError(f"digits must be a non-empty list of integers >= 1, got {digits}")
        if num_operands < 2:
            raise ValueError(f"num_operands must be >= 2, got {num_operands}")
        if not operators or any(c not in "+-*" for c in operators):
            raise ValueError(f"operators must be a non-empty string of '+', '-', '*', got {operators!r}")
        self.digits = digits
        self.weights = _check_weights(weights, len(digits), "ArithmeticTask", "digits")
        self.num_operands = num_operands
        self.operators = operators

    def _draw(self, d: int, rng: random.Random) -> tuple[str, int] | None:
        low, high = (0, 9) if d == 1 else (10 ** (d - 1), 10**d - 1)
        operands = [rng.randint(low, high) for _ in range(self.num_operands)]
        ops = [rng.choice(self.operators) for _ in range(self.num_operands - 1)]
        value = arithmetic_value(operands, ops)
        if value < 0:
            if self.num_operands == 2:
                operands.reverse()
            else:
                top = max(range(len(operands)), key=operands.__getitem__)
                operands[0], operands[top] = operands[top], operands[0]
            value = arithmetic_value(operands, ops)
            if value < 0:
                return None
        text = str(operands[0]) + "".join(op + str(x) for op, x in zip(ops, operands[1:])) + "="
        return text, value

    def records(self) -> list[Record]:
        """Generate the instances (deterministic for the arguments)."""
        rng = random.Random(self.seed)

        def draw(d: int) -> tuple[str, tuple[int, str, int]] | None:
            drawn = self._draw(d, rng)
            if drawn is None:
                return None
            prompt, value = drawn
            return prompt, (d, prompt, value)

        def describe(d: int) -> str:
            return (
                f"{d} digits, num_operands={self.num_operands}, operators={self.operators!r}, split={self.split!r}, "
                f"unique={self.unique}: lower size, use more digits, or set unique=False"
            )

        def stratum() -> int:
            return rng.choices(self.digits, weights=self.weights)[0]

        return [
            Record(
                {"prompt": prompt, "answer": str(value), "solution": str(value), "difficulty": d},
                f"generated:arithmetic#{i}",
            )
            for i, (d, prompt, value) in enumerate(self.sample(draw, describe, stratum))
        ]


# ------------------------------------------------------------------------------------------------------- helpers


def task_records(task: Task) -> list[Record]:
    """``task.records()``."""
    return task.records()


def write_jsonl(records: Iterable[Record] | Iterable[dict[str, Any]], path: str | Path) -> None:
    """Write records (or plain dicts) as JSON lines, one object per line; parent folders are created."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            data = rec.data if isinstance(rec, Record) else rec
            f.write(json.dumps(data, ensure_ascii=False) + "\n")

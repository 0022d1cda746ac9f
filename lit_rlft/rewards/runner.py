"""Run several reward functions on a batch of completions, with weights, a timeout and error accounting.

A reward function follows TRL's convention: ``fn(completions: list[str], **columns) -> list[float | None]``.
Training must go on when a reward function misbehaves at run time, so the runner scores 0 (and counts) a call
that raises, a call that runs past ``timeout_s`` and every None score. A function that returns the wrong number
of scores breaks the contract itself and raises ``ValueError``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["RewardFunc", "RewardResult", "RewardRunner", "resolve_reward", "reward_name"]

RewardFunc = Callable[..., Sequence[Any]]
"""``fn(completions: list[str], **columns) -> list[float | None]``."""

_COUNTERS = ("num_calls", "num_errors", "num_timeouts", "num_unscored")


@dataclass
class RewardResult:
    """Scores of one batch of ``N`` completions.

    Attributes:
        total: ``[N]`` float32, weighted sum over functions (None, errors and timeouts count as 0).
        per_func: function name -> ``[N]`` float32 unweighted scores (same zeroing).
        num_errors: calls that raised (all their scores are 0).
        num_timeouts: calls that ran past the timeout (all their scores are 0).
        num_unscored: None (or NaN / infinite) scores returned, summed over functions.
    """

    total: torch.Tensor
    per_func: dict[str, torch.Tensor] = field(default_factory=dict)
    num_errors: int = 0
    num_timeouts: int = 0
    num_unscored: int = 0


class _CallTimeout(Exception):
    """A reward call ran past the runner's timeout."""


def reward_name(func: Callable[..., Any]) -> str:
    """Display name of a reward function: its ``name`` attribute, ``__name__``, wrapped function's name
    (``functools.partial``) or class name, in that order."""
    name = getattr(func, "name", None)
    if isinstance(name, str) and name:
        return name
    name = getattr(func, "__name__", None)
    if isinstance(name, str) and name:
        return name
    inner = getattr(func, "func", None)
    if inner is not None and callable(inner):
        return reward_name(inner)
    return type(func).__name__


def _import_longest_prefix(path: str) -> Any:
    """Import the longest importable module prefix of a dotted ``path`` and walk the rest as attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this prefix does not exist" means "try a shorter one"; a missing dependency inside an
            # existing module is a real error.
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue
            raise
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                raise ValueError(f"cannot resolve reward function {path!r}: {obj.__name__!r} has no {attribute!r}")
            obj = getattr(obj, attribute)
        return obj
    raise ValueError(f"cannot resolve reward function {path!r}: no module {parts[0]!r}")


def _instantiate(obj: Any, path: str, init_args: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """Turn what a path named into a reward callable: a class is instantiated, a module gives ``<name>_reward``."""
    if inspect.ismodule(obj):
        short = obj.__name__.rsplit(".", 1)[-1]
        func = getattr(obj, f"{short}_reward", None)
        if func is None or not callable(func):
            raise ValueError(f"cannot resolve reward function {path!r}: it is a module without a {short}_reward")
        return func
    if inspect.isclass(obj):
        return obj(**dict(init_args or {}))
    if init_args:
        raise ValueError(f"reward {path!r} is not a class, it takes no init_args")
    if not callable(obj):
        raise ValueError(f"cannot resolve reward function {path!r}: {type(obj).__name__} is not callable")
    return obj


def resolve_reward(obj: Any) -> Callable[..., Sequence[Any]]:
    """A reward callable from a callable, a dotted path or a ``{"class_path", "init_args"}`` mapping.

    - a callable (not a class) is returned as is;
    - ``"lit_rlft.rewards.math_reward"``: the module is imported and the attribute returned;
    - a path naming a class (``"lit_rlft.rewards.CountdownReward"``) or a class: instantiated without arguments;
    - a path naming a module (``"lit_rlft.rewards.countdown"``): its ``countdown_reward`` function;
    - ``{"class_path": "lit_rlft.rewards.CountdownReward", "init_args": {"format_reward": 0.1}}``: instantiated.

    Raises:
        ValueError: the path, or what it names, does not resolve to a callable (the message names the path).
    """
    if isinstance(obj, str):
        return _instantiate(_import_longest_prefix(obj.strip()), obj)
    if isinstance(obj, Mapping):
        if "class_path" not in obj:
            raise ValueError(f"a reward given as a mapping needs a 'class_path' key, got keys {sorted(obj)}")
        path = str(obj["class_path"])
        return _instantiate(_import_longest_prefix(path), path, obj.get("init_args"))
    if inspect.isclass(obj):
        return obj()
    if callable(obj):
        return obj
    raise ValueError(f"a reward must be a callable or a dotted path, got {type(obj).__name__}: {obj!r}")


def _call_with_timeout(func: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float | None, name: str) -> Any:
    """``func(**kwargs)`` in a daemon thread, waiting at most ``timeout_s`` seconds (None: call inline).

    A Python thread cannot be killed: on timeout the call is abandoned and keeps running in the background until
    it returns on its own (its result is then dropped). The thread is a daemon, so a call that never returns does
    not keep the process alive at exit (``ThreadPoolExecutor`` workers are joined at exit and would), and each
    call gets its own thread, so a hung call never blocks later ones.

    Raises:
        _CallTimeout: the call ran past ``timeout_s``.
        Exception: whatever ``func`` raised.
    """
    if timeout_s is None:
        return func(**kwargs)
    future: Future[Any] = Future()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = func(**kwargs)
        except BaseException as exc:  # reported to the caller through the future
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=target, name=f"reward-{name}", daemon=True).start()
    done, _ = wait([future], timeout=timeout_s)
    if not done:
        raise _CallTimeout
    return future.result()


def _to_scores(raw: Any, n: int, name: str) -> tuple[list[float], int]:
    """Validate a function's return value: ``n`` floats (None / NaN / inf -> 0) and the count of unscored."""
    if isinstance(raw, torch.Tensor):
        raw = raw.detach().cpu().reshape(-1).tolist()
    if isinstance(raw, (str, bytes)) or not hasattr(raw, "__len__"):
        raise ValueError(f"reward function {name!r} returned {type(raw).__name__}, expected a list of {n} scores")
    if len(raw) != n:
        raise ValueError(f"reward function {name!r} returned {len(raw)} scores for {n} completions")
    scores: list[float] = []
    unscored = 0
    for value in raw:
        try:
            score = None if value is None else float(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"reward function {name!r} returned a non-numeric score {value!r}") from exc
        if score is None or not math.isfinite(score):
            unscored += 1
            score = 0.0
        scores.append(score)
    return scores, unscored


def _unique_names(funcs: Sequence[Callable[..., Any]]) -> list[str]:
    """Display names, with ``_2``, ``_3``... appended to repeats."""
    names: list[str] = []
    for func in funcs:
        base = reward_name(func)
        name, k = base, 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.append(name)
    return names


class RewardRunner:
    """Score completions with several reward functions and combine them with weights.

    Args:
        funcs: reward functions (callables, or anything :func:`resolve_reward` accepts).
        weights: one weight per function (default: all 1.0).
        timeout_s: longest a single function call may run, in seconds; past it the call is abandoned and scores 0.
            None runs functions inline in the calling thread without a timeout.

    Example:
        >>> runner = RewardRunner(["lit_rlft.rewards.exact_match_reward"])
        >>> runner(["4", "5"], {"answer": ["4", "4"]}).total
        tensor([1., 0.])
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any] | str],
        weights: Sequence[float] | None = None,
        timeout_s: float | None = 10.0,
    ) -> None:
        if isinstance(funcs, (str, Mapping)) or callable(funcs):
            funcs = [funcs]  # type: ignore[list-item]
        if not funcs:
            raise ValueError("RewardRunner needs at least one reward function")
        self.funcs: list[Callable[..., Any]] = [resolve_reward(f) for f in funcs]
        self.names: list[str] = _unique_names(self.funcs)
        if weights is None:
            weights = [1.0] * len(self.funcs)
        if len(weights) != len(self.funcs):
            raise ValueError(f"{len(weights)} reward weights for {len(self.funcs)} reward functions")
        self.weights: list[float] = [float(w) for w in weights]
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive or None, got {timeout_s}")
        self.timeout_s = timeout_s
        self.totals: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        """Cumulative counters over all calls: num_calls, num_errors, num_timeouts, num_unscored."""
        self._warned: set[tuple[str, str]] = set()

    def _warn_once(self, name: str, kind: str, message: str) -> None:
        """Warn the first time a function hits a given kind of failure; later ones are only counted."""
        if (name, kind) not in self._warned:
            self._warned.add((name, kind))
            warnings.warn(
                f"{message} (further {kind}s of {name!r} are counted, not reported)", RuntimeWarning, stacklevel=3
            )

    def _check_columns(self, n: int, columns: Mapping[str, Any]) -> None:
        """Column lists must align with the completions; ``completions`` cannot be a column."""
        if "completions" in columns:
            raise ValueError("'completions' cannot be a column name: it is the first argument of reward functions")
        for key, column in columns.items():
            if isinstance(column, (list, tuple)) and len(column) != n:
                raise ValueError(f"column {key!r} has {len(column)} rows for {n} completions")

    def _score_func(
        self, index: int, completions: list[str], columns: Mapping[str, Any]
    ) -> tuple[list[float], str, int]:
        """Scores of one function, its outcome (``"ok"``, ``"error"``, ``"timeout"``) and its unscored count."""
        func, name, n = self.funcs[index], self.names[index], len(completions)
        try:
            raw = _call_with_timeout(func, {"completions": completions, **columns}, self.timeout_s, name)
        except _CallTimeout:
            self._warn_once(name, "timeout", f"reward function {name!r} ran past {self.timeout_s} s; scored 0")
            return [0.0] * n, "timeout", 0
        except Exception as exc:
            self._warn_once(name, "error", f"reward function {name!r} raised {exc!r}; scored 0")
            return [0.0] * n, "error", 0
        scores, unscored = _to_scores(raw, n, name)
        return scores, "ok", unscored

    def __call__(self, completions: list[str], columns: Mapping[str, Any] | None = None) -> RewardResult:
        """Score ``N`` completions.

        Args:
            completions: ``N`` generated texts.
            columns: data set fields as lists aligned with ``completions`` (``answer``, ``prompts``...), passed to
                every function as keyword arguments.

        Raises:
            ValueError: a function returned the wrong number of scores (or no list), or a column is misaligned.
        """
        completions = list(completions)
        columns = dict(columns or {})
        self._check_columns(len(completions), columns)
        result = RewardResult(total=torch.zeros(len(completions), dtype=torch.float32))
        for index, (name, weight) in enumerate(zip(self.names, self.weights)):
            scores, outcome, unscored = self._score_func(index, completions, columns)
            result.num_errors += outcome == "error"
            result.num_timeouts += outcome == "timeout"
            result.num_unscored += unscored
            tensor = torch.tensor(scores, dtype=torch.float32)
            result.per_func[name] = tensor
            result.total += weight * tensor
        self.totals["num_calls"] += 1
        self.totals["num_errors"] += result.num_errors
        self.totals["num_timeouts"] += result.num_timeouts
        self.totals["num_unscored"] += result.num_unscored
        return result

    def __repr__(self) -> str:
        funcs = ", ".join(f"{name}*{weight:g}" for name, weight in zip(self.names, self.weights))
        return f"RewardRunner([{funcs}], timeout_s={self.timeout_s})"

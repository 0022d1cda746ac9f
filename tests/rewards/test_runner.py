"""Tests of RewardRunner (weights, errors, timeouts, unscored, validation) and resolve_reward."""

import functools
import time
import warnings

import pytest
import torch

from lit_rlft.rewards import (
    CountdownReward,
    RewardResult,
    RewardRunner,
    countdown_reward,
    exact_match_reward,
    math_reward,
    resolve_reward,
    reward_name,
)


def length_reward(completions: list[str], **kwargs: object) -> list[float]:
    return [float(len(c)) for c in completions]


def none_on_b(completions: list[str], **kwargs: object) -> list[float | None]:
    return [None if c == "b" else 1.0 for c in completions]


def raising_reward(completions: list[str], **kwargs: object) -> list[float]:
    raise RuntimeError("boom")


def sleepy_reward(completions: list[str], **kwargs: object) -> list[float]:
    time.sleep(1.0)
    return [1.0] * len(completions)


def two_scores_reward(completions: list[str], **kwargs: object) -> list[float]:
    return [1.0, 1.0]


def test_weighted_total_and_per_func() -> None:
    runner = RewardRunner([exact_match_reward, length_reward], weights=[2.0, 0.5])
    result = runner(["4", "55"], {"answer": ["4", "4"], "prompts": ["p", "q"]})
    assert isinstance(result, RewardResult)
    assert result.total.dtype == torch.float32 and result.total.shape == (2,)
    assert torch.equal(result.per_func["exact_match_reward"], torch.tensor([1.0, 0.0]))
    assert torch.equal(result.per_func["length_reward"], torch.tensor([1.0, 2.0]))
    assert torch.allclose(result.total, torch.tensor([2.5, 1.0]))
    assert (result.num_errors, result.num_timeouts, result.num_unscored) == (0, 0, 0)


def test_unscored_counts_as_zero() -> None:
    runner = RewardRunner([none_on_b])
    result = runner(["a", "b", "b"], {})
    assert torch.equal(result.total, torch.tensor([1.0, 0.0, 0.0]))
    assert result.num_unscored == 2
    assert runner.totals["num_unscored"] == 2


def test_error_is_counted_and_warned_once() -> None:
    runner = RewardRunner([raising_reward, length_reward])
    with pytest.warns(RuntimeWarning, match="1 raised.*raising_reward.*RuntimeError: boom"):
        result = runner(["ab"], {})
    assert result.num_errors == 1
    assert torch.equal(result.per_func["raising_reward"], torch.tensor([0.0]))
    assert torch.equal(result.total, torch.tensor([2.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second failure is counted, not warned again
        result = runner(["ab"], {})
    assert result.num_errors == 1
    assert runner.totals == {"num_calls": 2, "num_errors": 2, "num_timeouts": 0, "num_unscored": 0}


def test_timeout_is_counted_and_does_not_block() -> None:
    runner = RewardRunner([sleepy_reward, length_reward], timeout_s=0.2)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="sleepy_reward.*0.2"):
        first = runner(["abc"], {})
    second = runner(["abc"], {})  # the abandoned first call must not delay this one
    elapsed = time.perf_counter() - start
    assert first.num_timeouts == 1 and second.num_timeouts == 1
    assert torch.equal(first.total, torch.tensor([3.0]))
    assert runner.totals["num_timeouts"] == 2
    assert elapsed < 0.9


def test_wrong_length_raises_naming_the_function() -> None:
    runner = RewardRunner([two_scores_reward])
    with pytest.raises(ValueError, match="two_scores_reward.*2 scores for 1 completion"):
        runner(["a", "b"], {})


def test_non_list_and_non_numeric_returns_raise() -> None:
    with pytest.raises(ValueError, match="returned NoneType"):
        RewardRunner([lambda completions, **kw: None])(["a"], {})
    with pytest.raises(ValueError, match="non-numeric"):
        RewardRunner([lambda completions, **kw: ["x"]])(["a"], {})


def test_misaligned_column_and_bad_weights_raise() -> None:
    with pytest.raises(ValueError, match="answer"):
        RewardRunner([exact_match_reward])(["a", "b"], {"answer": ["a"]})
    with pytest.raises(ValueError, match="weights"):
        RewardRunner([exact_match_reward], weights=[1.0, 2.0])
    with pytest.raises(ValueError):
        RewardRunner([])


def test_inline_mode_without_timeout() -> None:
    result = RewardRunner([length_reward], timeout_s=None)(["abc"], {})
    assert torch.equal(result.total, torch.tensor([3.0]))


def test_names_and_duplicates() -> None:
    runner = RewardRunner([CountdownReward(0.1), countdown_reward, functools.partial(length_reward)])
    assert runner.names == ["countdown_reward", "countdown_reward_2", "length_reward"]
    assert reward_name(lambda c: c) == "<lambda>"


def test_countdown_through_runner_in_worker_thread() -> None:
    runner = RewardRunner(["lit_rlft.rewards.countdown_reward", "lit_rlft.rewards.math_reward"], weights=[1.0, 0.5])
    columns = {"nums": [[12, 3, 9], [12, 3, 9]], "target": [81, 81], "answer": ["81", "81"]}
    result = runner(["(12-3)*9", r"\boxed{81}"], columns)
    assert torch.allclose(result.total, torch.tensor([1.0, 0.5]))


def test_resolve_reward() -> None:
    assert resolve_reward(math_reward) is math_reward
    assert resolve_reward("lit_rlft.rewards.math_reward") is math_reward
    assert resolve_reward("lit_rlft.rewards.math.math_reward") is math_reward
    assert resolve_reward("lit_rlft.rewards.math") is math_reward  # a module gives its <name>_reward
    assert resolve_reward("lit_rlft.rewards.countdown") is countdown_reward
    default = resolve_reward("lit_rlft.rewards.CountdownReward")
    assert isinstance(default, CountdownReward) and default.format_reward == 0.0
    shaped = resolve_reward({"class_path": "lit_rlft.rewards.CountdownReward", "init_args": {"format_reward": 0.1}})
    assert isinstance(shaped, CountdownReward) and shaped.format_reward == 0.1


@pytest.mark.parametrize(
    "path", ["lit_rlft.rewards.no_such_reward", "no_such_package.reward", "lit_rlft.rewards.runner"]
)
def test_resolve_reward_errors_name_the_path(path: str) -> None:
    with pytest.raises(ValueError, match=path.replace(".", r"\.")):
        resolve_reward(path)


def test_resolve_reward_rejects_non_callables() -> None:
    with pytest.raises(ValueError):
        resolve_reward(42)
    with pytest.raises(ValueError):
        resolve_reward("lit_rlft.rewards.countdown.MAX_DEPTH")

"""Per-completion isolation and the real time bound of RewardRunner (processes that are killed; the pool's own
mechanics are tested in tests/runtime/test_worker_pool.py)."""

import copy
import os
import time
import warnings

import pytest
import torch

from lit_rlft.rewards import RewardRunner
from tests.runtime.test_worker_pool import hostile_length  # len(c), except for the hostile completions it names


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def whole_batch(completions: list[str], **kwargs: object) -> list[float]:
    """A function written for batches: raises on the whole batch if any completion is bad."""
    return [float(len(c)) if c != "raise" else 1 / 0 for c in completions]


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_one_bad_completion_changes_no_other_score(timeout_s: float | None) -> None:
    runner = RewardRunner([whole_batch, hostile_length], timeout_s=timeout_s)
    good = ["a", "bb", "ccc"]
    alone = runner(good, {}).total
    mixed = runner(["a", "raise", "bb", "nan", "ccc"], {})
    assert torch.equal(mixed.total[[0, 2, 4]], alone)
    assert mixed.per_func["whole_batch"][1] == 0.0 and mixed.per_func["hostile_length"][1] == 0.0
    assert mixed.num_errors == 2 and mixed.num_unscored == 1  # "raise" in both functions, "nan" in one
    assert mixed.per_func["whole_batch"][3] == 3.0  # "nan" is only unscored by the function that gave NaN
    runner.close()


def test_hang_in_c_code_is_killed_within_the_bound() -> None:
    runner = RewardRunner([hostile_length], timeout_s=1.0, num_workers=2, warn_interval_s=0.0)
    runner(["warm", "up"], {})  # workers started and warm
    before = runner.pool.pids()
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match=r"1 timed out \(> 1.0 s\)"):
        result = runner(["x", "hang", "yy", "zzz"], {})
    elapsed = time.perf_counter() - start
    assert torch.equal(result.total, torch.tensor([1.0, 0.0, 2.0, 3.0]))
    assert result.num_timeouts == 1
    assert elapsed < 1.0 + 1.0, elapsed  # the stated bound (1 s) plus at most 1 s
    killed = [pid for pid in before if pid not in runner.pool.pids()]
    assert len(killed) == 1 and not _alive(killed[0])  # nothing keeps running after the bound
    assert runner.pool.restarts == 1
    runner.close()


def test_a_dying_worker_scores_its_completion_alone_and_is_replaced() -> None:
    runner = RewardRunner([hostile_length], timeout_s=5.0, num_workers=1, warn_interval_s=1e9)
    with pytest.warns(RuntimeWarning, match="died"):
        result = runner(["ab", "die", "abc", "abcd"], {})
    assert torch.equal(result.total, torch.tensor([2.0, 0.0, 3.0, 4.0]))
    assert result.num_errors == 1 and runner.pool.restarts == 1
    assert torch.equal(runner(["a"], {}).total, torch.tensor([1.0]))  # the replacement works
    runner.close()


def test_fallback_score_replaces_failures_only() -> None:
    runner = RewardRunner([hostile_length], timeout_s=None, fallback=-1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = runner(["raise", "nan", "ok"], {})
    assert torch.equal(result.total, torch.tensor([-1.0, -1.0, 2.0]))
    with pytest.raises(ValueError, match="fallback"):
        RewardRunner([hostile_length], fallback=float("nan"))


def test_warnings_are_rate_limited_and_carry_counts() -> None:
    runner = RewardRunner([hostile_length], timeout_s=None, warn_interval_s=1e9)
    with pytest.warns(RuntimeWarning, match=r"of 2 completion scorings since the start, 1 raised"):
        runner(["raise", "a"], {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner(["raise", "raise", "a"], {})  # counted, not printed within the interval
    assert runner.totals["num_errors"] == 3
    runner.warn_interval_s = 0.0
    with pytest.warns(RuntimeWarning, match=r"of 5 completion scorings in the last \d+ s, 3 raised"):
        runner(["raise", "b"], {})  # the held-back counts come with the next warning


def test_no_warning_on_other_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")  # what launchers set (no process group in this test)
    runner = RewardRunner([hostile_length], timeout_s=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runner(["raise"], {}).num_errors == 1


def test_pool_survives_copy_and_reuses_workers() -> None:
    runner = RewardRunner([hostile_length], timeout_s=5.0, num_workers=1)
    runner(["a"], {})
    pids = runner.pool.pids()
    runner(["b"], {})
    assert runner.pool.pids() == pids  # reused across calls
    clone = copy.deepcopy(runner)  # e.g. a strategy that pickles the module: processes do not travel
    assert clone.pool.pids() == []
    assert torch.equal(clone(["abc"], {}).total, torch.tensor([3.0]))
    assert clone.pool.pids() != pids
    runner.close()
    clone.close()
    assert not any(_alive(pid) for pid in pids)


def coin(completions: list[str], **kwargs: object) -> list[float]:
    return [float(torch.rand(()))]


def test_a_sampling_reward_is_reproducible_from_the_callers_seed() -> None:
    """Workers are seeded per task from torch's current seed (set per step by GRPOModule) and the calls since:
    a resumed run scores like the uninterrupted one, and the caller's own generator is not drawn from."""
    runner = RewardRunner([coin], timeout_s=5.0, num_workers=2)
    torch.manual_seed(7)
    first = [runner(["a", "b", "c"], {}).total for _ in range(2)]
    state = torch.get_rng_state()
    resumed = RewardRunner([coin], timeout_s=5.0, num_workers=1)  # a resumed run: a new runner, other workers
    torch.manual_seed(7)
    again = [resumed(["a", "b", "c"], {}).total for _ in range(2)]
    resumed.close()
    torch.manual_seed(7)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first[0], first[1])  # a later call in the same step draws other numbers
    assert len(set(first[0].tolist())) == 3
    runner.close()

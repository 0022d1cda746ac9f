"""Reward worker processes never outlive the process that started them, however it ends.

Each case runs a small script in a subprocess that scores through a ``RewardRunner`` (2 workers) and prints the
workers' pids, then ends in one way: falling off its end without closing, ``os._exit``, ``SIGKILL`` or ``SIGTERM``
while the workers are busy scoring. None of the workers may be running a few seconds later (before the fix, every
way but the first left them running, re-parented to init, for good). Each case takes a few seconds, mostly the
script's imports.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from lit_rlft.rewards import RewardRunner

REPO = Path(__file__).resolve().parents[2]
DEATH_S = 5.0
"""How long the workers may take to go once their parent is gone."""

SCRIPT = textwrap.dedent('''
    import json, os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from lit_rlft.rewards.runner import RewardRunner

    MODE, MARKS = sys.argv[2], sys.argv[3]

    def length(completions, **columns):
        (c,) = completions
        if c == "slow":  # tells the test that this worker is busy, then stays busy
            open(os.path.join(MARKS, str(os.getpid())), "w").close()
            time.sleep(120)
        return [float(len(c))]

    runner = RewardRunner([length], timeout_s=60.0, num_workers=2)
    if MODE in ("thread", "held"):  # workers forked from a thread that ends before the process
        threading.Thread(target=runner, args=(["a", "bb"],)).start()
        while not runner.pool.pids() or threading.active_count() > 1:
            time.sleep(0.05)
    assert runner(["a", "bb"]).total.tolist() == [1.0, 2.0]
    print(json.dumps(runner.pool.pids()), flush=True)
    if MODE == "os_exit":
        os._exit(0)
    if MODE in ("thread", "held"):
        assert runner.pool.restarts == 0, "a worker died with the thread that started it"
    if MODE == "held":  # a process that outlives this one holds the workers' pipes open: no EOF will come
        import subprocess
        conns = [worker.conn.fileno() for worker in runner.pool._workers]
        subprocess.Popen(["sleep", "60"], pass_fds=conns)
    if MODE in ("thread", "held"):
        os._exit(0)
    if MODE == "busy":
        runner(["slow", "slow"])  # the test kills this process meanwhile
    # MODE == "exit": the interpreter exits without runner.close()
''')


def _alive(pid: int) -> bool:
    """Whether ``pid`` is running (a zombie is not: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def survivors(pids: list[int], within_s: float = DEATH_S) -> list[int]:
    """The pids still running after ``within_s`` (returns as soon as none is)."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def kill_all(pids: list[int]) -> None:
    """Clean up after a failure: the leaked workers would otherwise live on."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, list[int]]:
    """Run the script in ``mode``; returns the process and its workers' pids once it has scored."""
    script = tmp_path / "score.py"
    script.write_text(SCRIPT, encoding="utf-8")
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, str(script), str(REPO), mode, str(marks)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        pytest.fail(f"the script ended before scoring:\n{proc.stderr.read()[-3000:]}")
    pids = json.loads(line)
    assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    return proc, pids


@pytest.mark.parametrize("mode", ["exit", "os_exit", "thread", "held"])
def test_workers_end_with_a_script_that_exits_without_closing(tmp_path: Path, mode: str) -> None:
    """``exit``: a normal interpreter exit; ``os_exit``: a hard exit that skips every clean-up; ``thread``: the
    workers were started from a thread that ended first (no parent-death signal there); ``held``: that, and a
    process left behind holds the workers' pipes open (only the polling fallback can tell them)."""
    proc, pids = start(tmp_path, mode)
    try:
        assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
        assert survivors(pids) == []
    finally:
        kill_all(pids)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the "held" case's sleeper


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_end_with_a_script_killed_mid_scoring(tmp_path: Path, sig: signal.Signals) -> None:
    """Killed while both workers are inside a reward function (where no polling happens)."""
    proc, pids = start(tmp_path, "busy")
    try:
        deadline = time.monotonic() + 30
        while len(list((tmp_path / "marks").iterdir())) < 2:  # both workers busy
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig
        assert survivors(pids) == []
    finally:
        kill_all(pids)
        with contextlib.suppress(OSError):
            proc.kill()


def hostile_free_length(completions: list[str], **columns: object) -> list[float]:
    return [float(len(completions[0]))]


def test_garbage_collection_closes_the_pool_and_close_is_idempotent() -> None:
    runner = RewardRunner([hostile_free_length], timeout_s=5.0, num_workers=2)
    assert torch.equal(runner(["a", "bb"]).total, torch.tensor([1.0, 2.0]))
    pids = runner.pool.pids()
    del runner
    gc.collect()
    assert survivors(pids) == []

    with RewardRunner([hostile_free_length], timeout_s=5.0, num_workers=1) as runner:
        runner(["a"])
        pids = runner.pool.pids()
        runner.close()
        runner.close()  # twice: harmless
        assert survivors(pids) == [] and runner.pool.pids() == []
        assert torch.equal(runner(["abc"]).total, torch.tensor([3.0]))  # usable again: new workers
        pids = runner.pool.pids()
    assert survivors(pids) == []
    runner.close()  # after the context: still harmless


def test_a_forked_child_forgets_the_parents_workers() -> None:
    """A child forked by other code (a data-loader worker...) closes the workers' pipes it inherited and does not
    touch the parent's workers: they keep working for the parent."""
    runner = RewardRunner([hostile_free_length], timeout_s=5.0, num_workers=2)
    runner(["a", "bb"])
    pids = runner.pool.pids()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery here, only an exit code
        ok = runner.pool.pids() == [] and torch.equal(runner(["xyz"]).total, torch.tensor([3.0]))
        runner.close()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert runner.pool.pids() == pids and runner.pool.restarts == 0
    assert torch.equal(runner(["abcd"]).total, torch.tensor([4.0]))
    runner.close()

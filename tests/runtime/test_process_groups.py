"""Nothing a worker starts outlives it: a reward function, an environment step and a tool that each start a process
and forget it (``subprocess.Popen(["sleep", "1000"])``) leave nothing behind after the pool's timeout kill, the
replacement of a dead worker, ``close()``, or the trainer's ``SIGKILL``; and the process-group helpers of
:mod:`lit_rlft.runtime.processes` (the reaper) on their own.

Each forgotten child writes its pid to a file (``marks/<kind>-<pid>``) so that the test can find it. Before the fix
every one of these children was left running, re-parented to init. Linux only (``/proc``, the parent-death signal).
"""

from __future__ import annotations

import contextlib
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

from lit_rlft.envs.base import Environment, EnvStep
from lit_rlft.envs.formats import TextFormat
from lit_rlft.envs.tools import ToolEnvironment
from lit_rlft.models.tiny import char_tokenizer
from lit_rlft.rewards import RewardRunner
from lit_rlft.rollout.engines.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.runtime.processes import forget_group, kill_group, watch_group, watched_groups
from tests.rewards.test_lifetime import kill_all, survivors

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, /proc: Linux")

REPO = Path(__file__).resolve().parents[2]
MARKS = "LIT_RLFT_TEST_MARKS"
"""Environment variable naming the folder where forgotten children leave their pids (the workers inherit it)."""
DEATH_S = 10.0
"""How long the children may take to go."""
TOOL_CALL = '<tool_call>{"name": "start_sleeper", "arguments": {"why": "tool"}}</tool_call>'


# ----------------------------------------------------------------------------------- what starts and forgets a child
def forget_a_child(kind: str) -> int:
    """Start a process that never ends, leave its pid in ``$MARKS/<kind>-<pid>`` and forget it."""
    child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    (Path(os.environ[MARKS]) / f"{kind}-{child.pid}").touch()
    return child.pid


def forgetful_reward(completions: list[str], **columns: object) -> list[float]:
    """Starts a child and forgets it; then ``"hang"`` sleeps past any bound, ``"die"`` kills its worker."""
    (c,) = completions
    forget_a_child("reward")
    if c == "hang":
        time.sleep(120)
    if c == "die":
        os._exit(3)
    return [1.0]


class ForgetfulEnvironment(Environment):
    """Every step starts a child, forgets it, and ends the episode."""

    name = "forgetful"

    def step(self, messages, row):
        forget_a_child("env")
        return EnvStep(done=True, reward=1.0)


def start_sleeper(why: str) -> str:
    """Start a process that never ends, and forget it.

    Args:
        why: Who asked.
    """
    return str(forget_a_child(why))


class OneTurn(RolloutEngine):
    """Every completion is ``text`` (then EOS), whatever the prompt."""

    def __init__(self, tok, text: str):
        self.ids = tok(text)["input_ids"] + [tok.eos_token_id]

    def generate(self, prompts, num_generations, sampling, seed=None):
        n = len(prompts) * num_generations
        ids = torch.tensor([self.ids] * n)
        return GenerationOutput(ids, torch.ones_like(ids), None, ["stop"] * n)


def run_episode(env: Environment, text: str) -> EpisodeRunner:
    """One single-turn episode whose turn is ``text``; the runner (and its worker) left open."""
    tok = char_tokenizer()
    runner = EpisodeRunner(env, tok, TextFormat(tok), max_turns=1, timeout_s=30.0, num_workers=1)
    out = runner.run(OneTurn(tok, text), [tok("Q:")["input_ids"]], [{}], 1, SamplingConfig(max_new_tokens=200))
    assert out.env_errors == 0 and out.env_timeouts == 0, out.transcripts
    return runner


_KEEP: list[object] = []


def start_all() -> list[int]:
    """A reward, an environment step and a tool, each in its own pool, each leaving a child behind; the pools left
    open. Returns the workers' pids."""
    rewards = RewardRunner([forgetful_reward], timeout_s=30.0, num_workers=1)
    assert rewards(["a"]).total.tolist() == [1.0]
    env = run_episode(ForgetfulEnvironment(), "done")
    tools = run_episode(ToolEnvironment([start_sleeper]), TOOL_CALL)
    _KEEP.extend((rewards, env, tools))  # open until the process ends
    return rewards.pool.pids() + env.pool.pids() + tools.pool.pids()


def children(marks: Path, kind: str | None = None) -> list[int]:
    return [int(p.name.rsplit("-", 1)[1]) for p in marks.iterdir() if kind is None or p.name.startswith(kind + "-")]


@pytest.fixture
def marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The folder of the forgotten children's pids; whatever is still running at the end is killed."""
    folder = tmp_path / "marks"
    folder.mkdir()
    monkeypatch.setenv(MARKS, str(folder))
    yield folder
    kill_all(children(folder))


# ------------------------------------------------------------------------------------------------------ the pools
@pytest.mark.parametrize("kind", ["reward", "env", "tool"])
def test_what_a_worker_started_ends_with_close(marks: Path, kind: str) -> None:
    if kind == "reward":
        runner = RewardRunner([forgetful_reward], timeout_s=30.0, num_workers=1)
        assert runner(["a"]).total.tolist() == [1.0]
    else:
        runner = run_episode(*((ForgetfulEnvironment(), "done") if kind == "env"
                               else (ToolEnvironment([start_sleeper]), TOOL_CALL)))
    workers = runner.pool.pids()
    (child,) = children(marks, kind)
    assert survivors([child], 0.0) == [child]  # running while the pool is
    assert watched_groups() >= set(workers)  # the worker's group dies with this process
    runner.close()
    assert survivors([child, *workers], DEATH_S) == []
    assert not watched_groups() & set(workers)  # forgotten once killed


def test_what_a_hung_reward_started_ends_with_the_timeout_kill(marks: Path) -> None:
    runner = RewardRunner([forgetful_reward], timeout_s=1.0, num_workers=1, warn_interval_s=1e9)
    with pytest.warns(RuntimeWarning, match="timed out"):
        result = runner(["hang"])
    assert result.num_timeouts == 1 and runner.pool.restarts == 1
    assert survivors(children(marks, "reward"), DEATH_S) == []  # killed with its worker, the pool still open
    runner.close()


def test_what_a_dead_worker_started_ends_with_its_replacement(marks: Path) -> None:
    runner = RewardRunner([forgetful_reward], timeout_s=30.0, num_workers=1, warn_interval_s=1e9)
    with pytest.warns(RuntimeWarning, match="died"):
        result = runner(["die"])
    assert result.num_errors == 1 and runner.pool.restarts == 1
    assert survivors(children(marks, "reward"), DEATH_S) == []  # the pool still open
    runner.close()


TRAINER = textwrap.dedent('''
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from tests.runtime.test_process_groups import start_all

    print(json.dumps(start_all()), flush=True)
    time.sleep(600)  # the test kills this process meanwhile
''')


def test_what_the_workers_started_ends_with_a_trainer_killed_by_sigkill(marks: Path, tmp_path: Path) -> None:
    """The trainer (a script with a reward runner and two episode runners, each worker having left a child) is
    killed outright: its workers die by the parent-death signal, their children by the reaper."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER, encoding="utf-8")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, str(script), str(REPO)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    workers: list[int] = []
    try:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            pytest.fail(f"the trainer ended before its workers started:\n{proc.stderr.read()[-3000:]}")
        workers = json.loads(line)
        left = children(marks)
        assert sorted(p.name.split("-")[0] for p in marks.iterdir()) == ["env", "reward", "tool"]
        assert survivors(left + workers, 0.0) == left + workers  # all running
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert survivors(left + workers, DEATH_S) == []
    finally:
        kill_all(workers)
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait(timeout=30)


# ----------------------------------------------------------------------------------------- the helpers on their own
def _sleepers() -> tuple[subprocess.Popen, int]:
    """A child in a session of its own that starts a grandchild (``sleep``) and waits; the grandchild's pid."""
    child = subprocess.Popen(["sh", "-c", "sleep 1000 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    return child, int(child.stdout.readline())


def test_kill_group_ends_a_popen_child_and_what_it_started() -> None:
    """The generation process's case: ``Popen(..., start_new_session=True)``, ``watch_group(pid)``,
    ``kill_group(pid)``; killing again after the wait is harmless."""
    child, grandchild = _sleepers()
    try:
        assert watch_group(child.pid) and child.pid in watched_groups()
        kill_group(child.pid)
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert survivors([grandchild], DEATH_S) == []
        assert child.pid not in watched_groups()
        kill_group(child.pid)  # reaped and gone: nothing to do, nothing else hit
        with pytest.raises(ValueError, match="own"):
            watch_group(os.getpgrp())
    finally:
        kill_all([child.pid, grandchild])
        child.wait(timeout=10)
        child.stdout.close()


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (a reaper that is ready)."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught >> (sig - 1) & 1)


def test_a_dead_reaper_is_restarted_with_every_watched_group() -> None:
    from lit_rlft.runtime import processes

    first, first_grandchild = _sleepers()
    second, second_grandchild = _sleepers()
    try:
        watch_group(first.pid)
        reaper = processes._REAPER.process
        reaper.kill()
        reaper.wait(timeout=10)
        assert watch_group(second.pid)  # finds it dead: a new one, told about both groups
        assert processes._REAPER.process is not reaper
        deadline = time.monotonic() + DEATH_S
        while not _catches(processes._REAPER.process.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.01)  # its interpreter starting
        processes._REAPER.process.send_signal(signal.SIGTERM)  # a reaper stopped (or its parent gone) ends them
        assert survivors([first_grandchild, second_grandchild], DEATH_S) == []
        assert first.wait(timeout=10) == second.wait(timeout=10) == -signal.SIGKILL
    finally:
        for child in (first, second):
            kill_group(child.pid)
            child.wait(timeout=10)
            child.stdout.close()
        kill_all([first_grandchild, second_grandchild])


def test_a_forked_child_forgets_the_reaper_and_starts_its_own() -> None:
    """The parent's reaper keeps watching the parent's groups after a fork (the child closed its copy of the pipe);
    a group the child registers dies when the child exits, with the child's own reaper."""
    ours, ours_grandchild = _sleepers()
    watch_group(ours.pid)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery here, only an exit code and a pid
        os.close(read)
        ok = watched_groups() == set()
        theirs, theirs_grandchild = _sleepers()
        ok = ok and watch_group(theirs.pid)
        os.write(write, f"{theirs.pid} {theirs_grandchild}".encode())
        os._exit(0 if ok else 1)
    os.close(write)
    left: list[int] = []
    try:
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as f:
            left += [int(p) for p in f.read().split()]
        assert os.waitstatus_to_exitcode(status) == 0
        assert survivors(left, DEATH_S) == []  # the child's reaper saw it exit
        assert survivors([ours.pid, ours_grandchild], 0.0) == [ours.pid, ours_grandchild]  # ours still watched
        assert ours.pid in watched_groups()
    finally:
        kill_group(ours.pid)
        ours.wait(timeout=10)
        ours.stdout.close()
        kill_all([ours_grandchild, *left])
    forget_group(ours.pid)  # already forgotten: harmless

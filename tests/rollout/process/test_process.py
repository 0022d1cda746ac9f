"""Every failure of a generation process is named, on every path: killed with SIGKILL while the trainer pushes weights,
waits for its batch, waits for a validation call, or trains (the process idle or generating ahead), the run ends with
a GenerationError that names the process (pid), how it ended (the exit code and SIGKILL) and what the trainer was
doing, within seconds (far below ``async_timeout_s``); nothing is left behind: the process is reaped, its shared
weights removed, its reward workers and what they started killed with it. Found dead at close, it is named in a
warning."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lit_rlft import build_step
from lit_rlft.rollout.process import GenerationError
from lit_rlft.step import TorchBackend, train
from lit_rlft.step.optim import configure_adamw
from tests.conftest import countdown_dm, tiny_config
from tests.step.test_episodes_step import TwoTurns

COIN = "tests.distributed.helpers.coin_reward"
TIMEOUT_S = 60.0  # async_timeout_s: a failure must end the run far sooner


def slow_coin(completions, **columns):
    """A coin flip that takes 0.1 s per completion (a batch of 16 takes 1.6 s): the process is busy when killed."""
    time.sleep(0.1)
    return [float(hash(completions[0]) % 2)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is not alive
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (its children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30  # a loaded machine can take seconds to end a killed process
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _run(step, data, steps=3):
    opt = configure_adamw(step.policy, step.optim, total_steps=100)
    backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    outs = []
    for out in train(step, backend):
        outs.append(out)
        if len(outs) == steps:
            break
    return outs


def _setup(reward=COIN, **kw):
    step = build_step(tiny_config(reward_funcs=[reward], async_depth=1, async_threads=1,
                                  async_timeout_s=TIMEOUT_S, **kw))
    data = countdown_dm(size=48, batch_size=4, val=True)
    data.setup("fit")
    step.bind(data)
    return step, data


def _wrap_kill(obj, name: str, step, *, after_s: float = 0.0, when=lambda *a: True) -> list[int]:
    """Replace ``obj.name`` by a call that kills the generation process (at once, or ``after_s`` into the call from
    a timer) and then makes the original call; the pids killed."""
    original, killed = getattr(obj, name), []

    def call(*args, **kwargs):
        if when(*args) and not killed:
            pid = step.source.pid
            killed.append(pid)
            if after_s:
                threading.Timer(after_s, os.kill, (pid, signal.SIGKILL)).start()
            else:
                _kill(pid)
        return original(*args, **kwargs)

    setattr(obj, name, call)
    return killed


PATHS = {
    # the trainer pushes the weights of step 0's update to a process that died meanwhile
    "push": dict(target="sync_weights", after_s=0.0, doing=r"pushing weights version 1", reward=COIN),
    # the trainer waits for its batch while the process is scoring it
    "receive": dict(target="receive", after_s=0.5, doing=r"receiving the train rollouts of 4 prompts requested at "
                                                            r"step \d", reward="tests.rollout.process.test_process.slow_coin"),
    # the trainer waits for a validation call while the process is scoring it
    "validation": dict(target="rollout", after_s=0.5, doing=r"waiting for the validation rollouts of \d+ prompts",
                       reward="tests.rollout.process.test_process.slow_coin"),
    # killed between steps, while the trainer trains (the process generating ahead or idle): named at the next call
    "idle": dict(target=None, after_s=0.0, doing=r"submitting the train rollouts of 4 prompts requested at step 1",
                 reward=COIN),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_generation_process_killed_on_each_path_is_named_and_leaves_nothing(path):
    spec = PATHS[path]
    step, data = _setup(reward=spec["reward"], reward_timeout_s=None if "slow" in spec["reward"] else 10.0)
    step.sync_weights()  # start the process (with the current weights): its pid and workers are known from here
    pid, folder = step.source.pid, Path(step.source.process._folder)
    killed: list[int] = []
    if spec["target"] == "rollout":
        killed = _wrap_kill(step.source, "rollout", step, after_s=spec["after_s"], when=lambda r: r.split == "val")
    elif spec["target"] is not None:
        killed = _wrap_kill(step.source, spec["target"], step, after_s=spec["after_s"])
    t0 = time.monotonic()
    with pytest.raises(GenerationError) as error:
        if path == "validation":
            step.start()
            step.validate(data.val_dataloader())
        elif path == "idle":
            class KillAfterStep:
                def setup_step(self, ctx): ...
                def before_first_step(self, ctx): ...
                def after_step(self, ctx, out):
                    if out.step == 0:
                        workers.update(_descendants(pid))
                        killed.append(pid)
                        _kill(pid)

            workers: set[int] = set()
            opt = configure_adamw(step.policy, step.optim, total_steps=100)
            backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
            for _ in train(step, backend, [KillAfterStep()]):
                pass
        else:
            _run(step, data)
    elapsed = time.monotonic() - t0
    message = str(error.value)
    assert killed == [pid]
    assert f"the generation process (pid {pid}) died (exit code -9), killed by SIGKILL, while the trainer was " \
           in message, message
    assert __import__("re").search(spec["doing"], message), message
    assert elapsed < 20 < TIMEOUT_S, elapsed
    step.close()
    assert not _alive(pid) and not folder.exists()
    if path == "idle":  # its reward workers (killed with it, by its reaper) are gone too
        assert workers, "the process had no reward workers: the test would not see them"
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), [w for w in workers if _alive(w)]


def test_a_generation_process_found_dead_at_close_is_named_in_a_warning():
    step, _ = _setup()
    step.sync_weights()
    pid = step.source.pid
    _kill(pid)
    with pytest.warns(RuntimeWarning, match=rf"generation process \(pid {pid}\) died \(exit code -9\), killed by "
                                            r"SIGKILL, before it was closed"):
        step.close()
    assert not _alive(pid)


def _cannot_be_rebuilt():
    raise RuntimeError("this environment cannot be rebuilt in another process")


class Unpicklable(TwoTurns):
    """Pickles in the trainer, fails to unpickle in the generation process."""

    def __reduce__(self):
        return (_cannot_be_rebuilt, ())


def test_a_generation_process_that_cannot_start_says_why():
    """A failure while the process starts (here: an environment it cannot rebuild) comes back with its traceback,
    not as a bare exit code."""
    step, _ = _setup(environment=Unpicklable(), episodes={"max_turns": 2})
    step.sync_weights()  # starts the process: it fails while the trainer goes on
    with pytest.raises(GenerationError, match=r"(?s)pid \d+\) exited \(exit code 0\) while the trainer was waiting "
                                              r"for the train rollouts.*starting failed:.*cannot be rebuilt"):
        step.rollout(np.arange(4))
    step.close()

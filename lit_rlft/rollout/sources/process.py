"""Rollouts made in a process of their own, with their own copy of the policy's weights: :class:`ProcessRollouts`, the
rollout source of asynchronous runs (``model.asynchronous.depth = k >= 1``).

    source = ProcessRollouts(policy_factory, HFEngine(), scorer, tokenizer, success_threshold, threads=1)
    source.attach(policy)                 # the trainer's policy: its weights are copied when the process starts
    source.submit(request)                # returns at once; the process works through requests in order
    reply = source.receive()              # blocks (bounded); an error names the process, how it ended, and why
    source.sync_weights(policy, version=3)        # the trainer's trainable weights, through shared memory
    source.close()

One process per rank (:class:`GenerationProcess`): a fresh interpreter (``python -c``, so a training script needs no
``if __name__ == "__main__"`` guard) with its own torch threads and device. It builds its copy of the policy with the
factory it was given (no reference, no optimizer), sets its engine up on it (HF with the sampling log-probs, or vLLM)
and scores with the scorer it was given (and its own environment workers for multi-turn episodes). Requests and
weight pushes go through one connection, in order, so every request samples from the last weights pushed before it
was submitted. Weights travel through files in shared memory (``/dev/shm``) that both processes map; a push waits
until the process has loaded the previous one before overwriting them, so a version is never torn.

Lifetime: the process runs in a session of its own, asks the kernel for SIGKILL when its parent dies (Linux), polls
its parent otherwise, and its group is killed by :meth:`close`, at garbage collection, at interpreter exit and by the
trainer's reaper when the trainer dies (:mod:`lit_rlft.runtime.processes`): what it started dies with it.

Failures: a process that fails, dies or stops answering ends the trainer's waiting call within ``timeout_s`` with a
:class:`GenerationError` naming its pid, how it ended (exit code, signal) and what the trainer was doing (submitting a
batch, receiving one, pushing or loading weights, a validation call), with its traceback when it reported one.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lit_rlft.rewards.scorer import Scorer, as_scorer
from lit_rlft.rollout.engines.base import RolloutEngine
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.source import RolloutReply, RolloutRequest
from lit_rlft.rollout.sources.base import close_scoring
from lit_rlft.runtime.distributed import Ranks
from lit_rlft.runtime.processes import kill_group, set_parent_death_signal, watch_group

__all__ = ["GenerationError", "GenerationProcess", "ProcessRollouts", "default_threads"]

_POLL_S = 0.2  # how often a waiting side checks that the other is alive
_REAP_S = 2.0  # how long a broken pipe waits for the process's exit status
_LOADED = -2  # the ticket of a reply that acknowledges a weight push
_FAILED = -1  # the ticket of an error outside a request (starting, loading weights)


class GenerationError(RuntimeError):
    """The generation process failed, died or stopped answering; the message names it, how it ended and what the
    trainer was doing."""


def default_threads() -> int:
    """The generation process's torch threads: half the cores of this rank's share of the node (at least 1)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, (os.cpu_count() or 2) // (2 * local))


@dataclass
class _Reply:
    ticket: int
    reply: RolloutReply | None = None
    version: int = -1
    error: str | None = None


@dataclass
class _Spec:
    """What the process is built from."""

    policy: Callable[[], nn.Module]
    engine: RolloutEngine  # not set up
    rewards: Scorer
    tokenizer: Any
    success_threshold: float
    episodes: EpisodeRunner | None
    threads: int
    device: str


def _send(conn: Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection, timeout: float) -> Any:
    """The next object, or None when nothing came within ``timeout``."""
    return pickle.loads(conn.recv_bytes()) if conn.poll(timeout) else None


def _shared(path: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A CPU tensor mapped onto the file ``path`` (created with the right size if missing), shared between
    processes."""
    numel = int(np.prod(shape)) if shape else 1
    return torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)


# ---------------------------------------------------------------------------------------------- the process side
def main(fd: int, parent: int) -> None:
    """The process: build, then serve weight pushes and requests in order until told to stop or orphaned."""
    conn = Connection(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    try:
        sys_path, spec = pickle.loads(conn.recv_bytes())[1:]
        sys.path[:] = sys_path  # the trainer's: its reward functions import from there
        torch.set_num_threads(spec.threads)
        worker, policy = _build(spec)
    except Exception:
        _send(conn, _Reply(_FAILED, error="starting failed:\n" + traceback.format_exc()))
        return
    named = {**dict(policy.named_parameters()), **dict(policy.named_buffers())}
    buffers: dict[str, torch.Tensor] = {}
    version, idle_since = -1, time.perf_counter()
    while True:
        try:
            message = _recv(conn, _POLL_S)
        except (EOFError, OSError):
            return
        if message is None:
            if os.getppid() != parent:  # orphaned (where the parent-death signal is not available)
                return
            continue
        kind = message[0]
        if kind == "stop":
            worker.rewards.close()
            if worker.episodes is not None:
                worker.episodes.close()
            return
        try:
            if kind == "weights":
                _, version, files, names = message
                buffers.update({n: _shared(*spec_) for n, spec_ in (files or {}).items()})
                with torch.no_grad():
                    for name in names:
                        named[name].copy_(buffers[name])
                worker.engine.sync_weights(policy)
                _send(conn, _Reply(_LOADED, version=version))
                continue
            _, ticket, request = message
            idle = time.perf_counter() - idle_since
            if request.seed is not None:
                torch.manual_seed(request.seed)
            request.version = version  # the rows' birth step: the weights that sample them
            reply = worker.rollout(request)
            reply.idle_s = idle
            _send(conn, _Reply(ticket, reply, version))
        except Exception:
            ticket = message[1] if kind == "rollout" else _FAILED
            _send(conn, _Reply(ticket, error=traceback.format_exc()))
            if kind == "weights":
                return  # a half-loaded policy must not sample
        idle_since = time.perf_counter()


def _build(spec: _Spec) -> tuple[Any, nn.Module]:
    from lit_rlft.rollout.engines.hf import HFEngine
    from lit_rlft.rollout.worker import RolloutWorker

    policy = spec.policy().to(spec.device).eval().requires_grad_(False)
    engine = spec.engine
    if isinstance(engine, HFEngine):
        engine = copy.copy(engine)
        engine.return_logprobs = True  # mu: what this copy of the weights sampled from
    engine.setup(policy, spec.tokenizer, sharded=False)
    return RolloutWorker(engine, spec.rewards, spec.tokenizer, spec.success_threshold, episodes=spec.episodes), policy


# ---------------------------------------------------------------------------------------------- the trainer side
def _stop(process: subprocess.Popen, conn: Connection, folder: str) -> None:
    """Stop the process and its group, remove the shared weights (module-level, so that ``weakref.finalize`` can
    call it)."""
    if process.poll() is None:
        with contextlib.suppress(Exception):
            _send(conn, ("stop",))
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5.0)
    kill_group(process.pid)  # what it started (and itself, if it did not stop)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)
    with contextlib.suppress(Exception):
        conn.close()
    shutil.rmtree(folder, ignore_errors=True)


def _shm_folder() -> str:
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="lit_rlft_weights_", dir=root)


def how_it_ended(returncode: int | None) -> str:
    """A process's end in words, from its ``Popen.returncode``: ``died (exit code -9), killed by SIGKILL,``,
    ``died (exit code 1)``, ``exited (exit code 0)``, or ``is still running``."""
    if returncode is None:
        return "is still running"
    if returncode == 0:
        return "exited (exit code 0)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died (exit code {returncode}), killed by {name},"
    return f"died (exit code {returncode})"


class GenerationProcess:
    """One generation process (see the module docstring).

    Args:
        spec: what it is built from (its policy factory, engine settings, scorer, tokenizer, episodes).
        timeout_s: longest a call waits for the process (a reply, or its loading of the previous weights).
    """

    def __init__(self, spec: _Spec, timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        ours, theirs = socket.socketpair()
        self._conn = Connection(os.dup(ours.fileno()))
        ours.close()
        code = f"from lit_rlft.rollout.sources.process import main; main({theirs.fileno()}, {os.getpid()})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                        start_new_session=True, preexec_fn=set_parent_death_signal)
        theirs.close()
        watch_group(self.process.pid)  # the trainer's reaper kills its group if the trainer dies
        self._folder = _shm_folder()
        self._finalizer = weakref.finalize(self, _stop, self.process, self._conn, self._folder)
        self._buffers: dict[str, torch.Tensor] = {}
        self._pushed = self._loaded = -1
        self._ticket = 0
        self._replies: dict[int, _Reply] = {}
        self._last_words: str | None = None  # the traceback it sent before it stopped answering
        self._named = False  # its end was reported (by an error): close() does not warn again
        self._send(("init", list(sys.path), spec), "starting the generation process")

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    # -- weights ------------------------------------------------------------------------------------------
    def sync_weights(self, policy: nn.Module, version: int, full: bool = False) -> None:
        """Make requests submitted from now on sample from ``policy``'s weights (``version``): its trainable
        parameters, or with ``full`` every parameter and buffer. Waits (bounded) until the process has loaded the
        previous push, then writes the shared files and returns; the process loads between requests. Every rank
        calls this (an FSDP2 shard is gathered)."""
        self._wait(lambda: self._loaded == self._pushed,
                   f"pushing weights version {version} (waiting for it to load version {self._pushed})")
        named = list(policy.named_parameters()) + (list(policy.named_buffers()) if full else [])
        tensors = {n: _whole(t).detach() for n, t in named if full or t.requires_grad}
        files = {}
        for name, t in tensors.items():
            if name not in self._buffers:  # a file each, created once, mapped by both processes
                files[name] = (str(Path(self._folder) / f"{len(self._buffers)}.bin"), t.dtype, tuple(t.shape))
                self._buffers[name] = _shared(*files[name])
            self._buffers[name].copy_(t)
        self._send(("weights", int(version), files or None, list(tensors)), f"pushing weights version {version}")
        self._pushed = int(version)

    # -- requests ------------------------------------------------------------------------------------------
    def submit(self, request: RolloutRequest, doing: str) -> int:
        """Queue ``request`` (returns at once); its ticket. ``doing``: what the trainer does, for a failure."""
        self._ticket += 1
        self._send(("rollout", self._ticket, request), doing)
        return self._ticket

    def result(self, ticket: int, doing: str) -> RolloutReply:
        """The reply to ``ticket`` (waiting for it, bounded by ``timeout_s``). Raises :class:`GenerationError`
        with the process's traceback when it failed, died or stopped answering."""
        self._wait(lambda: ticket in self._replies, doing, f"answer request {ticket}")
        reply = self._replies.pop(ticket)
        if reply.error is not None:
            raise self._error(f"failed while the trainer was {doing}:\n{reply.error}")
        return reply.reply

    # -- the connection --------------------------------------------------------------------------------------
    def _send(self, message: Any, doing: str) -> None:
        """Send ``message``; a closed connection (the process died) is named."""
        if not self.alive:
            raise self._died(doing)
        try:
            _send(self._conn, message)
        except (OSError, EOFError):  # BrokenPipeError, ConnectionResetError: it died meanwhile
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=_REAP_S)
            raise self._died(doing) from None

    def _read(self, timeout: float) -> None:
        """Take what the process sent (waiting up to ``timeout`` for the first)."""
        while True:
            try:
                reply = _recv(self._conn, timeout)
            except (EOFError, OSError):
                return
            if reply is None:
                return
            timeout = 0.0
            if reply.ticket == _LOADED:
                self._loaded = reply.version
            elif reply.ticket == _FAILED:  # it could not start or load: nothing more will come
                self._last_words = reply.error
            else:
                self._replies[reply.ticket] = reply

    def _wait(self, done: Callable[[], bool], doing: str, what: str | None = None) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            if not self.alive or self._last_words is not None:
                self._read(0.0)  # what it said before it ended
                if done():
                    return
                raise self._died(doing)
            if time.monotonic() > deadline:
                self._kill()
                raise self._error(f"did not {what or 'answer'} within {self.timeout_s:g} s "
                                  f"(model.asynchronous.timeout_s) while the trainer was {doing}: it hangs or is "
                                  "far slower than expected; it was killed")
            self._read(min(_POLL_S, max(deadline - time.monotonic(), 0.0)))

    def _died(self, doing: str) -> GenerationError:
        """The error for a process that ended (or said it cannot go on) while the trainer was ``doing``."""
        self._read(0.0)  # what it said before it ended
        if self._last_words is not None and self.alive:  # it reported a failure and is stopping: let it end
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=_REAP_S)
        if self.alive:
            self._kill()
            how = "stopped answering (it was killed)"
        else:
            how = how_it_ended(self.process.returncode)
        words = f":\n{self._last_words}" if self._last_words else ""
        return self._error(f"{how} while the trainer was {doing}{words}")

    def _error(self, text: str) -> GenerationError:
        self._named = True
        return GenerationError(f"the generation process (pid {self.pid}) {text}")

    def _kill(self) -> None:
        kill_group(self.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=_REAP_S)

    def close(self) -> None:
        """Stop the process and its group, remove the shared weights (idempotent). A process found dead here whose
        end no error reported is named in a warning."""
        if self._finalizer.alive and not self.alive and not self._named:
            warnings.warn(f"the generation process (pid {self.pid}) {how_it_ended(self.process.returncode)} before "
                          "it was closed; the batches it held were dropped (the step's ledger keeps their ids)",
                          RuntimeWarning, stacklevel=2)
        self._finalizer()


def _whole(t: torch.Tensor) -> torch.Tensor:
    """An FSDP2 shard gathered (a collective), or the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class ProcessRollouts:
    """A :class:`~lit_rlft.rollout.source.RolloutSource` whose rollouts are made in a :class:`GenerationProcess`.

    Args:
        policy: builds the process's copy of the policy (a picklable function without arguments: the same model,
            dtype, size and LoRA as the trainer's; no reference, no optimizer).
        engine: the rollout engine's settings (not set up; an HF engine returns its sampling log-probs).
        rewards: the scorer (pickled to the process; it scores there).
        tokenizer: the policy's tokenizer.
        success_threshold: a completion is correct when its total reward is at least this.
        episodes: multi-turn episodes (pickled: the process runs its own environment workers); None: single turn.
        threads: the process's torch threads (None: :func:`default_threads`).
        device: where its policy runs (None: ``"cpu"``; ``"cuda:1"``: a GPU of its own).
        timeout_s: longest a call waits for the process (``model.asynchronous.timeout_s``).
    """

    def __init__(self, policy: Callable[[], nn.Module], engine: RolloutEngine, rewards: Scorer, tokenizer: Any,
                 success_threshold: float = 1.0, episodes: EpisodeRunner | None = None, *, threads: int | None = None,
                 device: str | None = None, timeout_s: float = 600.0):
        self.policy_factory, self.engine, self.tokenizer = policy, engine, tokenizer
        self.rewards = rewards
        self.success_threshold, self.episodes = success_threshold, episodes
        self.threads, self.device, self.timeout_s = threads or default_threads(), device or "cpu", timeout_s
        self.process: GenerationProcess | None = None
        self._policy: nn.Module | None = None
        self._tickets: deque[tuple[int, str]] = deque()  # (ticket, what receiving it is) of the batches submitted

    @property
    def rewards(self) -> Scorer:
        return self._rewards

    @rewards.setter
    def rewards(self, scorer: Scorer) -> None:
        self._rewards = as_scorer(scorer)

    def scored_by(self, scorer: Scorer) -> contextlib.AbstractContextManager[None]:
        """Refused: this source scores in its generation process, with the scorer it was started with."""
        raise ValueError(f"ProcessRollouts scores in its generation process (pid {self.pid}): a measurement with a "
                         "reward of its own (reward_funcs) needs the rollouts scored in the trainer's process "
                         "(model.asynchronous.depth 0, no generation servers)")

    def bind_ranks(self, ranks: Ranks) -> None:
        """Nothing to do: each rank has a generation process of its own."""

    def attach(self, policy: nn.Module) -> None:
        """Copy ``policy``'s weights into the process when it starts (at the first push or request)."""
        self._policy = policy

    @property
    def pid(self) -> int | None:
        """The generation process's pid (None while none runs)."""
        return self.process.pid if self.process is not None else None

    def _started(self, version: int, doing: str) -> GenerationProcess:
        """The process, started with the trainer's current weights (``version``) if there is none. One that died is
        an error (:class:`GenerationError`), never silently replaced: the requests it held would never be answered."""
        if self.process is not None:
            if not self.process.alive:
                raise self.process._died(doing)
            return self.process
        if self._policy is None:
            raise RuntimeError("ProcessRollouts: no policy to copy (attach it first)")
        spec = _Spec(self.policy_factory, self.engine, self.rewards, self.tokenizer, self.success_threshold,
                     self.episodes, self.threads, self.device)
        self.process = GenerationProcess(spec, timeout_s=self.timeout_s)
        self.process.sync_weights(self._policy, version, full=True)
        return self.process

    def submit(self, request: RolloutRequest) -> None:
        doing = f"submitting the {_what(request)}"
        ticket = self._started(request.version, doing).submit(request, doing)
        self._tickets.append((ticket, f"receiving the {_what(request)}"))

    def receive(self) -> RolloutReply:
        if not self._tickets:
            raise RuntimeError("ProcessRollouts.receive: nothing was submitted")
        ticket, doing = self._tickets.popleft()
        if self.process is None:
            raise GenerationError(f"the generation process was closed while the trainer was {doing}")
        return self.process.result(ticket, doing)

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        process = self._started(request.version, f"submitting the {_what(request)}")
        doing = f"waiting for the {_what(request)}"
        return process.result(process.submit(request, doing), doing)

    def sync_weights(self, policy: nn.Module, version: int, full: bool = False) -> None:
        """Weights ``version`` to the process; one that is not running starts with the current weights."""
        self._policy = policy
        if self.process is None:
            self._started(version, f"starting it with weights version {version}")
        else:
            self.process.sync_weights(policy, version, full=full)

    @property
    def pending(self) -> int:
        return len(self._tickets)

    @property
    def last_sync_bytes(self) -> int | None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Stop the process (and this side's scorer and environment workers, should anything have started them);
        batches in flight are dropped (the step's ledger keeps their ids)."""
        if self.process is not None:
            self.process.close()
        self.process = None
        self._tickets.clear()
        close_scoring(self.rewards, self.episodes)


def _what(request: RolloutRequest) -> str:
    """A request in words, for failures: ``train rollouts of 4 prompts requested at step 3``."""
    kind = "validation" if request.split == "val" else request.purpose
    return f"{kind} rollouts of {len(request.prompt_ids)} prompts requested at step {request.version}"

"""Generation and reward scoring in a process of their own, with their own copy of the policy's weights.

    process = GenerationProcess(config, engine, rewards, tokenizer, success_threshold, threads=1, device="cpu")
    process.push(policy, version=0, full=True)   # the trainer's weights, through shared memory
    ticket = process.submit(request)             # returns at once; the process works through requests in order
    reply = process.result(ticket)               # blocks (bounded); the process's own error, by name
    process.close()

One process per rank: a fresh interpreter (``python -m lit_rlft.step.generation_process``, so a training script needs
no ``if __name__ == "__main__"`` guard), with its own torch threads and device. It builds the policy from the step's
:class:`~lit_rlft.step.builder.GRPOConfig` (no reference, no optimizer), sets its engine up on it (HF with the
sampling log-probs, or vLLM), and scores with the step's reward scorer. Requests and weight pushes go through one
connection, in order, so every request samples from the last weights pushed before it was submitted. Weights travel
through files in shared memory (``/dev/shm``) that both processes map; a push waits until the process has loaded the
previous one before overwriting them, so a version is never torn.

Lifetime: the process asks the kernel for SIGKILL when its parent dies (Linux), polls its parent otherwise, and is
stopped by :meth:`close`, at garbage collection and at interpreter exit. A process that dies or stops answering ends
the waiting call within ``timeout_s``, naming the cause (its traceback when it reported one).
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
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["GenerationError", "GenerationProcess", "GenerationReply", "GenerationRequest"]

_POLL_S = 0.2  # how often a waiting side checks that the other is alive
_LOADED = -2  # the ticket of a reply that acknowledges a weight push
_FAILED = -1  # the ticket of an error outside a request (building, loading weights)


class GenerationError(RuntimeError):
    """The generation process failed, died or stopped answering; the message names the cause."""


@dataclass
class GenerationRequest:
    """``b`` prompts of this rank to roll out, rendered by the trainer (the process holds no data)."""

    prompt_ids: np.ndarray  # [b] pool ids
    prompt_tokens: list[list[int]]  # [b] token ids, unpadded
    prompt_texts: list[str]  # [b]
    columns: dict[str, list[Any]]  # reward columns, [b] each
    num_generations: int
    sampling: Any  # SamplingConfig
    split: str = "train"
    seed: int | None = None  # seeds torch and the engine's call (None: unseeded)
    ticket: int = 0


@dataclass
class GenerationReply:
    ticket: int
    rollouts: Any = None  # Rollouts; birth_step = the weights version that sampled them
    failures: dict[str, Any] = field(default_factory=dict)  # lit_rlft.step.rewards_report.failure_counts
    version: int = -1
    idle_s: float = 0.0  # the process's wait for work before this request (after its previous one)
    error: str | None = None


@dataclass
class _Spec:
    """What the process is built from."""

    config: Any  # GRPOConfig
    engine: Any  # RolloutEngine, not set up
    rewards: Any
    tokenizer: Any
    success_threshold: float
    threads: int
    device: str


class _Source:
    """A prompt source over one request's rendered prompts (what ``RolloutWorker`` reads)."""

    def __init__(self, request: GenerationRequest):
        self.r = request
        self.index = {int(i): k for k, i in enumerate(request.prompt_ids)}

    def _rows(self, ids: np.ndarray) -> list[int]:
        return [self.index[int(i)] for i in ids]

    def prompt_tokens(self, ids: np.ndarray, split: str = "train") -> list[list[int]]:
        return [self.r.prompt_tokens[k] for k in self._rows(ids)]

    def prompt_texts(self, ids: np.ndarray, split: str = "train") -> list[str]:
        return [self.r.prompt_texts[k] for k in self._rows(ids)]

    def reward_columns(self, ids: np.ndarray, split: str = "train") -> dict[str, list[Any]]:
        rows = self._rows(ids)
        return {name: [values[k] for k in rows] for name, values in self.r.columns.items()}


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
    sys_path, spec = pickle.loads(conn.recv_bytes())[1:]
    sys.path[:] = sys_path  # the trainer's: its reward functions import from there
    from lit_rlft.step.rewards_report import failure_counts

    torch.set_num_threads(spec.threads)
    try:
        worker, policy = _build(spec)
    except Exception:
        _send(conn, GenerationReply(_FAILED, error="building the generation process failed:\n" + traceback.format_exc()))
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
            close = getattr(worker.rewards, "close", None)
            if close is not None:
                close()
            return
        try:
            if kind == "weights":
                _, version, files, names = message
                buffers.update({n: _shared(*spec_) for n, spec_ in (files or {}).items()})
                with torch.no_grad():
                    for name in names:
                        named[name].copy_(buffers[name])
                worker.engine.sync_weights(policy)
                _send(conn, GenerationReply(_LOADED, version=version))
                continue
            request: GenerationRequest = message[1]
            idle = time.perf_counter() - idle_since
            if request.seed is not None:
                torch.manual_seed(request.seed)
            rollouts, scored = worker.rollout(_Source(request), request.prompt_ids, request.num_generations,
                                              request.sampling, version, request.split, seed=request.seed)
            _send(conn, GenerationReply(request.ticket, rollouts, failure_counts(scored), version, idle))
        except Exception:
            ticket = message[1].ticket if kind == "rollout" else _FAILED
            _send(conn, GenerationReply(ticket, error=traceback.format_exc()))
            if kind == "weights":
                return  # a half-loaded policy must not sample
        idle_since = time.perf_counter()


def _build(spec: _Spec) -> tuple[Any, nn.Module]:
    from lit_rlft.models.loading import build_policy
    from lit_rlft.rollout.hf import HFEngine
    from lit_rlft.rollout.worker import RolloutWorker

    c = spec.config
    policy, _ = build_policy(c.model, c.dtype, c.tiny, c.lora, reference=False)
    policy = policy.to(spec.device).eval().requires_grad_(False)
    engine = spec.engine
    if isinstance(engine, HFEngine):
        engine = copy.copy(engine)
        engine.return_logprobs = True  # mu: what this copy of the weights sampled from
    engine.setup(policy, spec.tokenizer, sharded=False)
    from lit_rlft.step.builder import episode_runner

    episodes = episode_runner(c, spec.tokenizer) if getattr(c, "environment", None) is not None else None
    return RolloutWorker(engine, spec.rewards, spec.tokenizer, spec.success_threshold, episodes=episodes), policy


# ---------------------------------------------------------------------------------------------- the trainer side
def _stop(process: subprocess.Popen, conn: Connection, folder: str) -> None:
    """Stop the process and remove the shared weights (module-level, so that ``weakref.finalize`` can call it)."""
    if process.poll() is None:
        with contextlib.suppress(Exception):
            _send(conn, ("stop",))
        try:
            process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5.0)
    with contextlib.suppress(Exception):
        conn.close()
    shutil.rmtree(folder, ignore_errors=True)


def _shm_folder() -> str:
    root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="lit_rlft_weights_", dir=root)


class GenerationProcess:
    """One generation process (see the module docstring).

    Args:
        config: the step's :class:`~lit_rlft.step.builder.GRPOConfig` (the policy's model, size, dtype, LoRA).
        engine: the rollout engine's settings (an engine not set up; HF engines return their sampling log-probs).
        rewards: the scorer, ``(completions, columns) -> RewardResult`` (pickled to the process).
        tokenizer: the policy's tokenizer.
        success_threshold: a completion is correct when its total reward is at least this.
        threads: the process's torch threads.
        device: where its policy runs (``"cpu"``, ``"cuda:1"``, ...).
        timeout_s: longest a call waits for the process (a reply, or its loading of the previous weights).
    """

    def __init__(self, config: Any, engine: Any, rewards: Any, tokenizer: Any, success_threshold: float, *,
                 threads: int = 1, device: str = "cpu", timeout_s: float = 600.0):
        from lit_rlft.rewards.pool import set_parent_death_signal

        self.timeout_s = timeout_s
        ours, theirs = socket.socketpair()
        self._conn = Connection(os.dup(ours.fileno()))
        ours.close()
        code = f"from lit_rlft.step.generation_process import main; main({theirs.fileno()}, {os.getpid()})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                        preexec_fn=set_parent_death_signal)
        theirs.close()
        self._folder = _shm_folder()
        self._finalizer = weakref.finalize(self, _stop, self.process, self._conn, self._folder)
        spec = _Spec(config, engine, rewards, tokenizer, success_threshold, threads, device)
        _send(self._conn, ("init", list(sys.path), spec))
        self._buffers: dict[str, torch.Tensor] = {}
        self._pushed = self._loaded = -1
        self._ticket = 0
        self._replies: dict[int, GenerationReply] = {}

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    # -- weights ------------------------------------------------------------------------------------------
    def push(self, policy: nn.Module, version: int, full: bool = False) -> None:
        """Make requests submitted from now on sample from ``policy``'s weights (``version``): its trainable
        parameters, or with ``full`` every parameter and buffer. Waits (bounded) until the process has loaded the
        previous push, then writes the shared files and returns; the process loads between requests. Every rank
        calls this (an FSDP2 shard is gathered)."""
        self._wait(lambda: self._loaded == self._pushed, "load the weights pushed before")
        named = list(policy.named_parameters()) + (list(policy.named_buffers()) if full else [])
        tensors = {n: _whole(t).detach() for n, t in named if full or t.requires_grad}
        files = {}
        for name, t in tensors.items():
            if name not in self._buffers:  # a file each, created once, mapped by both processes
                files[name] = (str(Path(self._folder) / f"{len(self._buffers)}.bin"), t.dtype, tuple(t.shape))
                self._buffers[name] = _shared(*files[name])
            self._buffers[name].copy_(t)
        _send(self._conn, ("weights", int(version), files or None, list(tensors)))
        self._pushed = int(version)

    # -- requests ------------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> int:
        """Queue ``request`` (returns at once); its ticket."""
        self._ticket += 1
        request.ticket = self._ticket
        _send(self._conn, ("rollout", request))
        return self._ticket

    def result(self, ticket: int) -> GenerationReply:
        """The reply to ``ticket`` (waiting for it, bounded by ``timeout_s``). Raises :class:`GenerationError`
        with the process's traceback when it failed, died or stopped answering."""
        self._wait(lambda: ticket in self._replies, f"answer request {ticket}")
        reply = self._replies.pop(ticket)
        if reply.error is not None:
            raise GenerationError(f"the generation process (pid {self.pid}) failed:\n{reply.error}")
        return reply

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
            elif reply.ticket == _FAILED:  # it could not build or load: nothing more will come
                raise GenerationError(f"the generation process (pid {self.pid}) failed:\n{reply.error}")
            else:
                self._replies[reply.ticket] = reply

    def _wait(self, done: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            if not self.alive:
                self._read(0.0)  # what it said before it ended
                if done():
                    return
                raise GenerationError(f"the generation process (pid {self.pid}) died (exit code "
                                      f"{self.process.returncode}) before it could {what}")
            if time.monotonic() > deadline:
                raise GenerationError(f"the generation process (pid {self.pid}) did not {what} within "
                                      f"{self.timeout_s:g} s (model.generation.async_timeout_s): it hangs or is far "
                                      "slower than expected")
            self._read(min(_POLL_S, max(deadline - time.monotonic(), 0.0)))

    def close(self) -> None:
        """Stop the process (idempotent)."""
        self._finalizer()


def _whole(t: torch.Tensor) -> torch.Tensor:
    """An FSDP2 shard gathered (a collective), or the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t

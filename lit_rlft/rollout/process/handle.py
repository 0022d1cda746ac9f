"""The trainer's handle on one generation process (:class:`GenerationProcess`): starting it in a session of its own,
pushing weights, submitting requests and waiting for their replies (bounded), naming how it failed or ended, and
stopping it and what it started."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_rlft.rollout.process.wire import (
    FAILED,
    LOADED,
    POLL_S,
    REAP_S,
    STOPPING_S,
    ProcessSpec,
    Reply,
    recv,
    send,
    shared_tensor,
)
from lit_rlft.rollout.source import RolloutReply, RolloutRequest
from lit_rlft.runtime.processes import kill_group, set_parent_death_signal, watch_group

__all__ = ["GenerationError", "GenerationProcess", "default_threads", "how_it_ended", "stop_process"]


class GenerationError(RuntimeError):
    """The generation process failed, died or stopped answering; the message names it, how it ended and what the
    trainer was doing."""


def default_threads() -> int:
    """The generation process's torch threads: half the cores of this rank's share of the node (at least 1)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, (os.cpu_count() or 2) // (2 * local))


def stop_process(process: subprocess.Popen, conn: Connection, folder: str) -> None:
    """Stop the process and its group, remove the shared weights (module-level, so that ``weakref.finalize`` can
    call it)."""
    if process.poll() is None:
        with contextlib.suppress(Exception):
            send(conn, ("stop",))
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


def _whole(t: torch.Tensor) -> torch.Tensor:
    """An FSDP2 shard gathered (a collective), or the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class GenerationProcess:
    """One generation process (see the module docstring).

    Args:
        spec: what it is built from (its policy factory, engine settings, scorer, tokenizer, episodes).
        timeout_s: longest a call waits for the process (a reply, or its loading of the previous weights).
    """

    def __init__(self, spec: ProcessSpec, timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        ours, theirs = socket.socketpair()
        self._conn = Connection(os.dup(ours.fileno()))
        ours.close()
        code = f"from lit_rlft.rollout.process.child import main; main({theirs.fileno()}, {os.getpid()})"
        self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                        start_new_session=True, preexec_fn=set_parent_death_signal)
        theirs.close()
        watch_group(self.process.pid)  # the trainer's reaper kills its group if the trainer dies
        self._folder = _shm_folder()
        self._finalizer = weakref.finalize(self, stop_process, self.process, self._conn, self._folder)
        self._buffers: dict[str, torch.Tensor] = {}
        self._pushed = self._loaded = -1
        self._ticket = 0
        self._replies: dict[int, Reply] = {}
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
                self._buffers[name] = shared_tensor(*files[name])
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
            raise self.died(doing)
        try:
            send(self._conn, message)
        except (OSError, EOFError):  # BrokenPipeError, ConnectionResetError: it died meanwhile
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=REAP_S)
            raise self.died(doing) from None

    def _read(self, timeout: float) -> None:
        """Take what the process sent (waiting up to ``timeout`` for the first)."""
        while True:
            try:
                reply = recv(self._conn, timeout)
            except (EOFError, OSError):
                return
            if reply is None:
                return
            timeout = 0.0
            if reply.ticket == LOADED:
                self._loaded = reply.version
            elif reply.ticket == FAILED:  # it could not start or load: nothing more will come
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
                raise self.died(doing)
            if time.monotonic() > deadline:
                self._kill()
                raise self._error(f"did not {what or 'answer'} within {self.timeout_s:g} s "
                                  f"(model.asynchronous.timeout_s) while the trainer was {doing}: it hangs or is "
                                  "far slower than expected; it was killed")
            self._read(min(POLL_S, max(deadline - time.monotonic(), 0.0)))

    def died(self, doing: str) -> GenerationError:
        """The error for a process that ended (or said it cannot go on) while the trainer was ``doing``."""
        self._read(0.0)  # what it said before it ended
        if self._last_words is not None and self.alive:  # it reported a failure and is stopping: let it end (an
            # interpreter's exit takes seconds on a loaded machine; it is not hanging)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOPPING_S)
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
            self.process.wait(timeout=REAP_S)

    def close(self) -> None:
        """Stop the process and its group, remove the shared weights (idempotent). A process found dead here whose
        end no error reported is named in a warning."""
        if self._finalizer.alive and not self.alive and not self._named:
            warnings.warn(f"the generation process (pid {self.pid}) {how_it_ended(self.process.returncode)} before "
                          "it was closed; the batches it held were dropped (the step's ledger keeps their ids)",
                          RuntimeWarning, stacklevel=2)
        self._finalizer()



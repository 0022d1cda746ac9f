"""Process lifetimes: nothing a process starts outlives it, however it ends.

Two tools, for the children this process starts (the worker pools' workers, the generation process):

- **The parent-death signal** (:func:`set_parent_death_signal`, Linux): the kernel kills a child when its parent
  dies, ``SIGKILL`` included. It reaches the child only, not what the child started in turn.
- **Process groups and a reaper.** A child that runs in a session of its own (``os.setsid()`` first thing, or
  ``subprocess.Popen(..., start_new_session=True)``) leads a process group whose id is its pid, and everything it
  starts joins that group, so :func:`kill_group` ends the child and every process it left behind at once. For this
  process's own death, :func:`watch_group` registers the group with a *reaper*: a small process (started on the
  first registration, one per process) that holds the read end of a pipe whose write end only this process holds.
  When this process dies, however it dies, the pipe reaches end-of-file and the reaper kills every group still
  registered, then exits. A group that ended the ordinary way is unregistered (:func:`forget_group`, done by
  :func:`kill_group`).

Typical use, for a child started with ``subprocess.Popen``::

    process = subprocess.Popen(argv, start_new_session=True)
    watch_group(process.pid)
    ...
    kill_group(process.pid)  # the child and whatever it started; safe after process.wait() too
    process.wait()

The reaper:

- reads ``+<pgid>`` / ``-<pgid>`` lines; imports ``os`` and ``signal`` only (``python -I -S``: a few ms to start);
- ignores ``SIGINT`` and ``SIGHUP`` (it runs in a session of its own: a terminal's Ctrl-C is its parent's to handle),
  and on ``SIGTERM`` does as on end-of-file; every 0.5 s it also checks that its parent is still there, for the
  case where a process that outlives this one holds the write end (a child forked by C code that skipped Python's
  at-fork hooks);
- its write end is not inherited: it is close-on-exec, and a child forked through Python closes it and forgets the
  reaper (an at-fork hook), so the reaper sees its parent's death; a forked child that registers groups itself
  starts its own reaper;
- is restarted, with every registered group, when it is found dead at a registration; where none can be started
  (no interpreter to run it, no file descriptors left), groups are still killed by :func:`kill_group` but not at this
  process's death (the parent-death signal still ends the children themselves).

Limits: a process that leaves the group (one that calls ``setsid`` or ``setpgid`` itself, e.g.
``subprocess.Popen(..., start_new_session=True)`` inside a reward function) is not covered; and a group id names
whatever group holds it when the signal is sent: a group that ended on its own and was not forgotten, whose number
the kernel then reused for an unrelated group leader, would be killed in its place (Linux does not reuse a pid while
a group of that id has a member, so the window is only between the group's last process and the forget).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

__all__ = ["forget_group", "kill_group", "new_session", "set_parent_death_signal", "watch_group", "watched_groups"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


# ------------------------------------------------------------------------------------------- parent-death signal
def _libc_prctl() -> Callable[..., int] | None:
    """``prctl`` from the C library on Linux, else None (looked up once, in the parent: a forked child only calls
    it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # no usable libc: the callers' polling fallbacks still end their children
        return None


_PRCTL = _libc_prctl()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Linux: have the kernel send this process ``sig`` when the thread that forked it ends; False where that is
    not available. Also usable as (part of) a ``subprocess.Popen`` ``preexec_fn``: it only makes the system call.

    The parent may have died before this call: check ``os.getppid()`` right after it.
    """
    if _PRCTL is None:
        return False
    zero = ctypes.c_ulong(0)
    return _PRCTL(_PR_SET_PDEATHSIG, ctypes.c_ulong(sig), zero, zero, zero) == 0


# ------------------------------------------------------------------------------------------------ process groups
def new_session() -> bool:
    """Make this process the leader of a new session and process group (id: its pid), so that what it starts can be
    killed with it (:func:`kill_group`); False where that is not possible (already a group leader)."""
    try:
        os.setsid()
    except OSError:
        return False
    return True


def _check(pgid: int) -> int:
    pgid = int(pgid)
    if pgid <= 1:
        raise ValueError(f"not a process group of a child: {pgid}")
    if pgid == os.getpgrp():
        raise ValueError(f"process group {pgid} is this process's own: start the child with a session of its own")
    return pgid


def _unreaped_child(pid: int) -> bool:
    """Whether ``pid`` is a child of this process that has not been waited for (running, or a zombie): a number
    that cannot have been reused. Where that cannot be asked (no ``waitid``), assumed."""
    if not hasattr(os, "waitid"):  # pragma: no cover - Linux has it
        return True
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)  # looks, leaves it to its owner to reap
    except ChildProcessError:
        return False
    return True


def kill_group(pgid: int) -> None:
    """``SIGKILL`` the process group ``pgid`` (a child started in a session of its own, and all it started) and stop
    watching it. Where no such group exists yet (a child that has not reached its ``setsid``), the child ``pgid`` is
    killed alone, if it is an unreaped child of this process; a group already gone is no error.

    Raises:
        ValueError: ``pgid`` is not a child's group (``<= 1``, or this process's own group).
    """
    pgid = _check(pgid)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        if _unreaped_child(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pgid, signal.SIGKILL)
    except PermissionError:  # members that are not ours to signal (none of our children's making): nothing to do
        pass
    forget_group(pgid)


# --------------------------------------------------------------------------------------------------------- reaper
_REAPER_CODE = """\
# lit_rlft.runtime.processes reaper: kills the registered process groups when its parent dies
import os, signal, sys
fd, parent = int(sys.argv[1]), int(sys.argv[2])
groups, pending, quiet = set(), [b""], {signal.SIGALRM, signal.SIGTERM}
def take(data):
    signal.pthread_sigmask(signal.SIG_BLOCK, quiet)  # end() must not run halfway through a line
    *lines, pending[0] = (pending[0] + data).split(b"\\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, quiet)
def end(*_):
    signal.setitimer(signal.ITIMER_REAL, 0)
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 65536)
        while data:  # what the parent wrote before it died
            take(data)
            data = os.read(fd, 65536)
    except OSError:
        pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)
def check(*_):
    if os.getppid() != parent:
        end()
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGTERM, end)
signal.signal(signal.SIGALRM, check)
signal.setitimer(signal.ITIMER_REAL, 0.5, 0.5)
check()
while True:
    data = os.read(fd, 65536)
    if not data:
        end()
    take(data)
"""
"""The reaper's program (see the module docstring): ``python -I -S -c <code> <read fd> <parent pid>``."""


def _write_all(fd: int, text: str) -> None:
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]


class _ReaperProcess(subprocess.Popen):
    """The reaper's ``Popen``, dropped without a "still running" warning: the reaper outlives it on purpose (at
    interpreter exit it ends by itself once this process is gone; in a forked child it is the parent's)."""

    def __del__(self) -> None:
        pass


class _Reaper:
    """This process's reaper: the process, the pipe's write end, and the groups it was told about."""

    def __init__(self) -> None:
        self.process: _ReaperProcess | None = None
        self.fd: int | None = None
        self.groups: set[int] = set()
        self.lock = threading.Lock()
        self.disabled = False  # a start failed: no reaper in this process (groups are still killed by kill_group)

    def _start(self) -> bool:
        """Start the reaper and tell it every registered group; False where it cannot be started."""
        read, write = os.pipe()  # both non-inheritable (PEP 446); pass_fds makes the read end the child's alone
        try:
            self.process = _ReaperProcess(
                [sys.executable, "-I", "-S", "-c", _REAPER_CODE, str(read), str(os.getpid())], pass_fds=(read,),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        except (OSError, ValueError):  # no interpreter to run it, no file descriptors left
            os.close(write)
            self.disabled = True
            return False
        finally:
            os.close(read)
        self.fd = write
        try:
            _write_all(write, "".join(f"+{group}\n" for group in sorted(self.groups)))
        except OSError:  # died at once: no reaper in this process
            self._stop()
            self.disabled = True
            return False
        return True

    def _stop(self) -> None:
        """Close the pipe (a live reaper kills what is registered and exits) and reap the reaper."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        if self.process is not None:
            with contextlib.suppress(Exception):
                self.process.wait(timeout=5)
        self.process = self.fd = None

    def _send(self, text: str) -> bool:
        """Tell the reaper ``text``, starting it first where none runs (a replacement for a dead one is told every
        registered group at its start); False where none can run."""
        for _attempt in range(2):
            if self.process is None or self.fd is None or self.process.poll() is not None:
                self._stop()
                return not self.disabled and self._start()
            try:
                _write_all(self.fd, text)
                return True
            except OSError:  # BrokenPipeError: it died since the poll
                self._stop()
        return False

    def watch(self, pgid: int) -> bool:
        with self.lock:
            self.groups.add(pgid)
            return self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        with self.lock:
            if pgid not in self.groups:
                return
            self.groups.discard(pgid)
            if self.process is not None and self.fd is not None:  # a dead reaper forgets by itself
                with contextlib.suppress(OSError):
                    os.write(self.fd, f"-{pgid}\n".encode())

    def forget_all_in_child(self) -> None:
        """In a forked child: the reaper and its groups are the parent's; close the inherited write end."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.process, self.fd = None, None
        self.groups = set()
        self.lock = threading.Lock()  # another thread of the parent may have held it at the fork
        self.disabled = False


_REAPER = _Reaper()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REAPER.forget_all_in_child)


def watch_group(pgid: int) -> bool:
    """Have the process group ``pgid`` killed when this process dies (registered with this process's reaper,
    started on the first call). Register a child right after starting it in a session of its own; unregister it
    with :func:`forget_group` or :func:`kill_group`. Returns whether a reaper watches it (False where none can run:
    the group is then not killed at this process's death).

    Raises:
        ValueError: ``pgid`` is not a child's group (``<= 1``, or this process's own group).
    """
    return _REAPER.watch(_check(pgid))


def forget_group(pgid: int) -> None:
    """Stop watching the process group ``pgid`` (it ended, or is no longer this process's to end); a group not
    watched is no error."""
    _REAPER.forget(int(pgid))


def watched_groups() -> set[int]:
    """The process groups this process's reaper watches now (a copy)."""
    with _REAPER.lock:
        return set(_REAPER.groups)

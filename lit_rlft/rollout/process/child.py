"""The generation process's side: started as ``python -c "from lit_rlft.rollout.process.child import main; main(fd,
parent)"``, it builds its copy of the policy, its engine and its scorer, then serves weight pushes and rollout
requests in order until told to stop or orphaned."""

from __future__ import annotations

import copy
import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import nn

from lit_rlft.rollout.process.wire import FAILED, LOADED, POLL_S, ProcessSpec, Reply, recv, send, shared_tensor

__all__ = ["main"]


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
        send(conn, Reply(FAILED, error="starting failed:\n" + traceback.format_exc()))
        return
    named = {**dict(policy.named_parameters()), **dict(policy.named_buffers())}
    buffers: dict[str, torch.Tensor] = {}
    version, idle_since = -1, time.perf_counter()
    while True:
        try:
            message = recv(conn, POLL_S)
        except (EOFError, OSError):
            return
        if message is None:
            if os.getppid() != parent:  # orphaned (where the parent-death signal is not available)
                return
            continue
        kind = message[0]
        if kind == "stop":
            worker.scorer.close()
            if worker.episodes is not None:
                worker.episodes.close()
            return
        try:
            if kind == "weights":
                _, version, files, names = message
                buffers.update({n: shared_tensor(*spec_) for n, spec_ in (files or {}).items()})
                with torch.no_grad():
                    for name in names:
                        named[name].copy_(buffers[name])
                worker.engine.sync_weights(policy)
                send(conn, Reply(LOADED, version=version))
                continue
            _, ticket, request = message
            idle = time.perf_counter() - idle_since
            if request.seed is not None:
                torch.manual_seed(request.seed)
            request.version = version  # the rows' birth step: the weights that sample them
            reply = worker.rollout(request)
            reply.idle_s = idle
            send(conn, Reply(ticket, reply, version))
        except Exception:
            ticket = message[1] if kind == "rollout" else FAILED
            send(conn, Reply(ticket, error=traceback.format_exc()))
            if kind == "weights":
                return  # a half-loaded policy must not sample
        idle_since = time.perf_counter()


def _build(spec: ProcessSpec) -> tuple[Any, nn.Module]:
    from lit_rlft.rollout.engines.hf import HFEngine
    from lit_rlft.rollout.worker import RolloutWorker

    policy = spec.policy().to(spec.device).eval().requires_grad_(False)
    engine = spec.engine
    if isinstance(engine, HFEngine):
        engine = copy.copy(engine)
        engine.return_logprobs = True  # mu: what this copy of the weights sampled from
    engine.setup(policy, spec.tokenizer, sharded=False)
    return RolloutWorker(engine, spec.scorer, spec.tokenizer, spec.success_threshold, episodes=spec.episodes), policy



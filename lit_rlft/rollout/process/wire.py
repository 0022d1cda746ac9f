"""What the trainer and its generation process exchange over their one connection: the messages (pickled, in
order), the replies, what the process is built from, and the weight files in shared memory that both map."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
from torch import nn

from lit_rlft.rewards.scorer import Scorer
from lit_rlft.rollout.engines.base import RolloutEngine
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.rollout.source import RolloutReply

__all__ = ["FAILED", "LOADED", "POLL_S", "REAP_S", "STOPPING_S", "ProcessSpec", "Reply", "recv", "send", "shared_tensor"]

POLL_S = 0.2  # how often a waiting side checks that the other is alive
REAP_S = 2.0  # how long a broken pipe waits for the process's exit status
STOPPING_S = 15.0  # how long a process that reported its failure is given to exit
LOADED = -2  # the ticket of a reply that acknowledges a weight push
FAILED = -1  # the ticket of an error outside a request (starting, loading weights)


@dataclass
class Reply:
    ticket: int
    reply: RolloutReply | None = None
    version: int = -1
    error: str | None = None


@dataclass
class ProcessSpec:
    """What the process is built from."""

    policy: Callable[[], nn.Module]
    engine: RolloutEngine  # not set up
    scorer: Scorer
    tokenizer: Any
    success_threshold: float
    episodes: EpisodeRunner | None
    threads: int
    device: str


def send(conn: Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection, timeout: float) -> Any:
    """The next object, or None when nothing came within ``timeout``."""
    return pickle.loads(conn.recv_bytes()) if conn.poll(timeout) else None


def shared_tensor(path: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A CPU tensor mapped onto the file ``path`` (created with the right size if missing), shared between
    processes."""
    numel = int(np.prod(shape)) if shape else 1
    return torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)



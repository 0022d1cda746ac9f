"""What the ranks of a data-parallel run share, and how: one small interface over ``torch.distributed``.

lit_rlft keeps every decision global. Each step has one plan of ``B`` prompts (the same on every rank), rank ``r``
rolls out the ``r``-th slice of it, and the outcome of every group rolled out (all ranks, all rounds) is gathered,
so every selection callback observes the whole global batch and holds the same state on every rank. The calls that
need the other ranks go through a :class:`Collective`:

- :class:`LocalCollective` for one process: every call is a no-op (no cost for single-process runs);
- :class:`TorchCollective` over the default ``torch.distributed`` process group, which both Lightning's strategies
  and Fabric initialise (gloo on CPU, NCCL on GPU).

Every rank must make the same collective calls in the same order: the step is written so that it does (equal slices,
global decisions), and :meth:`Collective.gather_checked` turns a failure on one rank (a reward function that raises,
an engine error) into the same error on every rank, naming the rank, instead of a hang.

Lightning-free (torch only, at the bottom of the layers with the maths): usable from the Trainer glue, the Fabric loop or a plain ``torchrun`` script.
"""

from __future__ import annotations

import hashlib
import pickle
import time
import traceback
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
from torch import Tensor

__all__ = ["Collective", "LocalCollective", "RankFailure", "Ranks", "TorchCollective", "get_collective", "shard_slice",
           "padded_shard", "split_to"]


class RankFailure(RuntimeError):
    """A step failed on one or more ranks; raised on every rank so that none waits forever for the others."""


#: How long a rank whose collective broke waits for the rank that caused it to post its failure.
PEER_FAILURE_WAIT_S = 5.0


@runtime_checkable
class Ranks(Protocol):
    """What a part that coordinates the trainer's ranks itself may know of them (the rollout source of generation
    servers: rank 0 sends the weights, the ranks meet around a push): a :class:`Collective` is one."""

    rank: int
    world_size: int

    def barrier(self) -> None: ...


class Collective:
    """The collective calls the GRPO step needs. Subclasses implement :meth:`all_gather` and :meth:`broadcast`, and
    may keep a failure board (:meth:`post_failure` / :meth:`failures`) outside the collectives."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def all_gather(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every rank (any picklable object)."""
        raise NotImplementedError

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Every rank here before any goes on (one process: nothing)."""
        raise NotImplementedError

    def post_failure(self, detail: str) -> bool:
        """Record that this rank failed with ``detail``, where every rank can read it without a collective; whether
        there is such a board."""
        return False

    def failures(self, wait_s: float = 0.0) -> dict[int, str]:
        """``{rank: detail}`` of every rank that posted a failure, in the order they were posted (waiting up to
        ``wait_s`` for one to appear)."""
        return {}

    # -- derived calls ------------------------------------------------------------------------------------------
    def reduce_metrics(self, values: dict[str, float]) -> dict[str, float]:
        """Combine per-rank metrics: keys ending in ``/min`` take the minimum, ``/max`` the maximum, others the mean.

        Keys present on some ranks only are combined over the ranks that have them.
        """
        if not self.is_distributed:
            return dict(values)
        parts = self.all_gather(values)
        out: dict[str, float] = {}
        for key in sorted({k for p in parts for k in p}):
            vals = [p[key] for p in parts if key in p]
            if key.endswith("/min"):
                out[key] = float(min(vals))
            elif key.endswith("/max"):
                out[key] = float(max(vals))
            else:
                out[key] = float(np.mean(vals))
        return out

    def gather_checked(self, payload: Any, error: BaseException | None, what: str, *, join: bool = True) -> list[Any]:
        """All-gather ``payload``; if any rank passes an ``error``, raise :class:`RankFailure` on every rank.

        Run the work that may fail inside ``try``, then call this on every rank whatever happened::

            try:
                payload, error = work(), None
            except Exception as exc:
                payload, error = None, exc
            parts = collective.gather_checked(payload, error, "generating and scoring rollouts")

        The message names the failed ranks and their errors, first failure first; on a failed rank the original
        exception is chained. A failed rank posts its error on the failure board, then joins the gather with its
        failure (``(detail, None)``), and every rank raises together as soon as the gather completes, on any backend,
        whether or not the failed rank's process ends. A rank whose collective breaks instead (a peer failed while
        it was elsewhere, or left) names the root cause from the board rather than the broken collective.

        ``join=False``: a failed rank posts its error and raises at once, without entering the gather. For a failure
        while the other ranks may be inside other collectives (generating with an FSDP2-sharded policy: every
        forward is an all-gather), where a mismatched gather aborts the process (gloo) or hangs (NCCL). The others
        stop only when their collective breaks (gloo: when the failed process ends; NCCL: at the collective timeout)
        and name the cause from the board. Without a board (a process group without a store) a failed rank always
        joins the gather: there is no other way to tell the others. ``join`` is ignored on ranks without an error.
        """
        detail = None
        if error is not None:
            detail = f"{type(error).__name__}: {error}"
            if not self.is_distributed:
                raise error
            if self.post_failure(detail) and not join:
                raise self._failure(what, self.failures() or {self.rank: detail}, error) from error
        try:
            parts = self.all_gather((detail, None if error is not None else payload))
        except Exception as broken:  # a rank failed elsewhere and left (or broke) this collective
            posted = self.failures(wait_s=PEER_FAILURE_WAIT_S)
            if not posted:
                raise
            raise self._failure(what, posted, error) from (error or broken)
        failed = {r: d for r, (d, _) in enumerate(parts) if d is not None}
        if failed:
            posted = self.failures()  # the order the ranks failed in, where the board knows it
            ordered = {**{r: posted[r] for r in posted if r in failed}, **failed}
            raise self._failure(what, ordered, error) from error
        return [p for _, p in parts]

    def _failure(self, what: str, failed: dict[int, str], error: BaseException | None) -> RankFailure:
        lines = "; ".join(f"rank {r}: {d}" for r, d in failed.items())
        message = f"{what} failed on rank {', '.join(str(r) for r in failed)} of {self.world_size} ({lines})"
        if error is not None:
            message += "\n" + "".join(traceback.format_exception(error)).rstrip()
        return RankFailure(message)

    def check_same(self, value: Any, what: str) -> None:
        """Raise :class:`RankFailure` on every rank, naming the ranks, unless every rank holds the same ``value``
        (compared by a digest of its pickle)."""
        if not self.is_distributed:
            return
        digests = self.all_gather(hashlib.sha256(pickle.dumps(value)).hexdigest())
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise RankFailure(
                f"{what} differs between ranks: rank {', '.join(map(str, differ))} of {self.world_size} disagree with "
                "rank 0. Every rank must compute the same global decisions from the same gathered outcomes (a "
                "callback whose state or random generator differs between ranks does this); stopping before any "
                "rank makes a collective call the others do not"
            )


class LocalCollective(Collective):
    """One process: gathers return ``[obj]``, broadcasts return ``obj``."""

    rank = 0
    world_size = 1

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self) -> None:
        pass


class TorchCollective(Collective):
    """The default ``torch.distributed`` process group (initialised by Lightning or Fabric).

    Its failure board is the process group's key-value store (the rendezvous ``TCPStore``), which every rank reaches
    without a collective: ``lit_rlft/failure/<rank>`` holds a rank's error, numbered by an atomic counter.
    """

    def __init__(self) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("TorchCollective needs an initialised torch.distributed process group")
        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=src)
        return box[0]

    def barrier(self) -> None:
        if self.world_size > 1:
            self._dist.barrier()

    def _store(self) -> Any:
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            return _get_default_store()
        except Exception:  # pragma: no cover - a process group without a store: no board, plain collectives
            return None

    def post_failure(self, detail: str) -> bool:
        store = self._store()
        if store is None:
            return False
        try:
            order = store.add("lit_rlft/failures", 1)
            store.set(f"lit_rlft/failure/{self.rank}", f"{order}|{detail}")
        except Exception:  # pragma: no cover - the store is gone: fall back to gathering the failure
            return False
        return True

    def failures(self, wait_s: float = 0.0) -> dict[int, str]:
        store = self._store()
        if store is None:
            return {}
        deadline = time.monotonic() + wait_s
        while True:
            found: list[tuple[int, int, str]] = []
            try:
                for r in range(self.world_size):
                    key = f"lit_rlft/failure/{r}"
                    if store.check([key]):
                        order, _, detail = store.get(key).decode().partition("|")
                        found.append((int(order), r, detail))
            except Exception:  # pragma: no cover - the store's host is gone
                return {}
            if found or time.monotonic() >= deadline:
                return {r: detail for _, r, detail in sorted(found)}
            time.sleep(0.1)


def get_collective() -> Collective:
    """:class:`TorchCollective` when a process group with more than one rank is initialised, else local."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return TorchCollective()
    return LocalCollective()


def shard_slice(n: int, rank: int, world_size: int, what: str = "batch") -> slice:
    """The rows ``[rank * n / W, (rank + 1) * n / W)`` of ``n`` global rows; ``n`` must divide by ``W``."""
    if n % world_size:
        raise ValueError(f"the global {what} of {n} does not divide by the {world_size} ranks: every rank must "
                         "train on the same number of groups")
    k = n // world_size
    return slice(rank * k, (rank + 1) * k)


def padded_shard(ids: np.ndarray, rank: int, world_size: int) -> tuple[np.ndarray, int]:
    """Rank ``rank``'s contiguous share of ``ids`` ``[n]``, padded to ``ceil(n / W)`` by repeating its last id.

    For work whose per-rank size must be equal (sharded generation, embedding) but whose global size need not
    divide by ``W`` (reference sets, validation). Returns ``(ids [ceil(n / W)], valid)``: only the first ``valid``
    rows are real; concatenating every rank's first ``valid`` rows gives ``ids`` back in order.
    """
    ids = np.asarray(ids)
    n = ids.shape[0]
    per = -(-n // world_size) if n else 0
    start = min(rank * per, n)
    local = ids[start : start + per]
    valid = local.shape[0]
    if valid < per:
        filler = local[-1:] if valid else ids[:1]
        local = np.concatenate([local, np.repeat(filler, per - valid, axis=0)]) if filler.size else local
    return local, valid


ChunkT = TypeVar("ChunkT", list[int], Tensor)


def split_to(chunks: Sequence[ChunkT], count: int) -> list[ChunkT]:
    """``chunks`` (lists or 1-D tensors of row indices) split further, the largest halved (first half first), until
    there are ``count`` of them; empty chunks are appended when there are fewer rows than ``count``. Halving a chunk
    keeps it within its budget. Under a sharded policy every rank must run as many generation calls and training
    forwards as the rank that needs most: both the engine and the updater bring their chunks to that count here."""
    out = list(chunks)
    while len(out) < count:
        largest = max(range(len(out)), key=lambda i: len(out[i])) if out else None
        if largest is None or len(out[largest]) < 2:
            out.append(out[0][:0] if out else [])
            continue
        chunk = out[largest]
        half = (len(chunk) + 1) // 2
        out[largest : largest + 1] = [chunk[:half], chunk[half:]]
    return out

"""The weight-sync group between a trainer and its generation servers: rendezvous, process group, byte layout.

Both ends use this module: the trainer (:mod:`lit_rlft.rollout.servers.weight_sync`) and the worker extension inside each vLLM
server (:mod:`lit_rlft.rollout.servers.vllm_extension`, through :class:`WeightReceiver`). It imports torch and the standard library
only, so the trainer's environment needs no vLLM and the CPU tests run a stand-in server with the extension's own
receive code.

The group (one per :meth:`WeightSync.connect <lit_rlft.rollout.servers.weight_sync.WeightSync.connect>`):

- rank 0 is the trainer, ranks 1..N the servers' workers (one worker per server: TP = PP = DP = 1);
- rendezvous through a ``TCPStore`` whose master is the trainer, listening on the given ``host:port`` only (the
  socket is bound here and handed to the store; torch's own would listen on every interface);
- a ``PrefixStore`` namespace ``lit_rlft/weights/<generation>``: every connect is a new generation, so the group can
  be re-formed on the same store with another server list (a server dropped, a restarted one taken back);
- ``ProcessGroupGloo`` (CPU tensors) or ``ProcessGroupNCCL`` (CUDA tensors, each process on its own device), built
  directly (no ``torch.distributed.init_process_group``: the trainer's own default group is left alone); the group's
  timeout bounds every collective and the rendezvous (gloo raises "Timed out waiting ..." or "Connection closed by
  peer"; NCCL: :func:`wait_work` aborts the group at its deadline).

The byte layout (both sides derive it from the same metadata and ``bucket_bytes``, :func:`plan_layout`): the tensors
one after the other in one byte stream, each at an offset aligned to 64 bytes (so that every tensor is a valid
``view(dtype)`` of the stream), and the stream cut into chunks of at most ``bucket_bytes``, one broadcast each (a
tensor may span chunks). What it costs:

- the trainer holds one chunk buffer (``bucket_bytes``, on the group's device) at a time, plus a contiguous copy of a
  non-contiguous tensor while it is packed;
- a server's staged receive holds the whole stream in host memory (the bytes sent plus at most 63 bytes of padding
  per tensor), received chunk by chunk straight into it (NCCL: through one device buffer of ``bucket_bytes``); the
  tensors handed to the loader are views of it, so nothing is loaded before everything has arrived (a failed
  transfer leaves the model as it was), and the staged copy is freed after the load.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = ["ALIGN", "RENDEZVOUS_ENV", "TOKEN_ENV", "TRANSFER_FAILED", "Layout", "SyncRefused", "WeightReceiver",
           "broadcast", "check_rendezvous", "check_token", "dtype_of", "join_group", "local_address", "open_store",
           "pack_chunks", "parse_rendezvous", "plan_layout", "receive_staged", "unpack", "wait_work"]

Backend = Literal["gloo", "nccl"]
#: The shared secret every join and update must carry (read from the server's environment).
TOKEN_ENV = "LIT_RLFT_SYNC_TOKEN"
#: Optional ``host:port``: the only rendezvous a server agrees to join.
RENDEZVOUS_ENV = "LIT_RLFT_SYNC_RENDEZVOUS"
#: Byte alignment of every tensor in the stream (the largest element, complex128, is 16 bytes; 64 is a cache line).
ALIGN = 64
GROUP_PREFIX = "lit_rlft/weights"
#: What a server's error says when its receive failed because the group broke (a symptom: another rank left).
TRANSFER_FAILED = "the transfer failed"


class SyncRefused(PermissionError):
    """A join or update whose token or rendezvous the server does not accept."""


# -- security ----------------------------------------------------------------------------------------------------
def check_token(token: str | None) -> None:
    """Accept ``token`` only if it equals the server's ``LIT_RLFT_SYNC_TOKEN`` (constant-time comparison).

    Raises:
        SyncRefused: a wrong or missing token, or a server without a token (weight sync off).
    """
    expected = os.environ.get(TOKEN_ENV, "")
    if not expected:
        raise SyncRefused(f"lit_rlft weight sync is off on this server: {TOKEN_ENV} is not set in its environment")
    if not hmac.compare_digest(str(token or "").encode(), expected.encode()):
        raise SyncRefused(f"lit_rlft weight sync: wrong or missing token (the server's {TOKEN_ENV})")


def parse_rendezvous(rendezvous: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:port"`` for IPv6) -> ``(host, port)``.

    Raises:
        ValueError: naming the value when it is not ``host:port`` with a port in 0..65535.
    """
    host, sep, port = str(rendezvous).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"rendezvous must be 'host:port', got {rendezvous!r}")
    if host in ("0.0.0.0", "::"):
        raise ValueError(f"rendezvous {rendezvous!r}: give the trainer's own address (the servers connect to it), "
                         "not a wildcard")
    return host, int(port)


def check_rendezvous(rendezvous: str) -> tuple[str, int]:
    """``rendezvous`` parsed, if the server may join it: any, unless ``LIT_RLFT_SYNC_RENDEZVOUS`` pins one.

    Raises:
        SyncRefused: the server is pinned to another rendezvous.
    """
    host, port = parse_rendezvous(rendezvous)
    pinned = os.environ.get(RENDEZVOUS_ENV, "").strip()
    if pinned and (host, port) != parse_rendezvous(pinned):
        raise SyncRefused(f"lit_rlft weight sync: this server joins only {pinned} ({RENDEZVOUS_ENV}), "
                          f"not {rendezvous}")
    return host, port


# -- the group ---------------------------------------------------------------------------------------------------
def local_address(towards: str) -> str:
    """This machine's address on the interface that reaches ``towards`` (127.0.0.1 for a loopback host): where the
    group's connections are accepted, so that a server on 127.0.0.1 never listens on a public interface."""
    try:
        if ipaddress.ip_address(towards).is_loopback:
            return str(towards)
    except ValueError:
        if towards == "localhost":
            return "127.0.0.1"
    info = socket.getaddrinfo(towards, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(info[0], socket.SOCK_DGRAM) as s:
        s.connect(info[4])  # UDP: no packet sent, only the route chosen
        return s.getsockname()[0]


def open_store(host: str, port: int, *, master: bool, timeout_s: float) -> Any:
    """The rendezvous store.

    The master binds ``host:port`` itself (port 0: any free port, read it from ``store.port``) and listens there
    only (the store owns the socket); a client connects, retrying until ``timeout_s``.
    """
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=timeout_s)
    if not master:
        return TCPStore(host, port, None, False, timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=128)
    try:
        store = TCPStore(host, sock.getsockname()[1], None, True, timeout, wait_for_workers=False,
                         master_listen_fd=sock.fileno(), use_libuv=True)
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store closes it
    return store


def join_group(store: Any, generation: int, rank: int, world_size: int, *, timeout_s: float,
               backend: Backend = "gloo", local_host: str | None = None) -> Any:
    """The group's backend object for this process (blocks until all ``world_size`` ranks have joined, at most
    ``timeout_s``). ``local_host``: the address gloo accepts connections on (see :func:`local_address`); NCCL uses
    the current CUDA device (``torch.cuda.set_device`` first)."""
    from torch.distributed import PrefixStore

    prefix = PrefixStore(f"{GROUP_PREFIX}/{generation}", store)
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        opts = ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [ProcessGroupGloo.create_device(hostname=local_host) if local_host
                         else ProcessGroupGloo.create_default_device()]
        return ProcessGroupGloo(prefix, rank, world_size, opts)
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL

        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return ProcessGroupNCCL(prefix, rank, world_size, opts)
    raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")


def group_device(backend: Backend) -> torch.device:
    """Where the group's buffers live: the CPU for gloo, the current CUDA device for NCCL."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def wait_work(work: Any, timeout_s: float, what: str, poll: Callable[[], None] | None = None,
              on_timeout: Callable[[], None] | None = None) -> None:
    """Wait for a collective, at most ``timeout_s``; ``poll()`` runs while waiting (raise there to give up early, as
    the trainer does when a server's HTTP call fails), ``on_timeout()`` before the ``TimeoutError`` (NCCL: abort the
    group; gloo ends its own collectives at the group's timeout, with an error ``work.wait()`` raises).

    Raises:
        TimeoutError: the collective did not complete in time.
        RuntimeError: gloo's or NCCL's own failure (a peer gone, their timeout).
    """
    # a failed work keeps its group alive (and the group's connections open, so that the other ranks wait for
    # their timeout): no frame of a raised error may hold it
    deadline = time.monotonic() + timeout_s
    delay = 1e-4
    while not work.is_completed():
        if poll is not None:
            try:
                poll()
            except BaseException:
                del work
                raise
        if time.monotonic() > deadline:
            del work
            if on_timeout is not None:
                on_timeout()
            raise TimeoutError(f"{what}: not complete within {timeout_s:g} s")
        time.sleep(delay)
        delay = min(2 * delay, 0.005)
    try:
        work.wait()
    except Exception as exc:
        message = f"{what}: {exc}"
    else:
        return
    del work
    raise RuntimeError(message)


def broadcast(group: Any, buffer: Tensor) -> Any:
    """Start broadcasting ``buffer`` from rank 0 (returns the work; see :func:`wait_work`)."""
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return group.broadcast([buffer], opts)


# -- the byte layout ---------------------------------------------------------------------------------------------
def dtype_of(name: str) -> torch.dtype:
    """``torch.<name>`` if it is a dtype (names arrive from the network: nothing else of torch is reachable).

    Raises:
        ValueError: not a torch dtype name.
    """
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return value


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def nbytes(dtype: str, shape: Sequence[int]) -> int:
    numel = 1
    for n in shape:
        if int(n) < 0:
            raise ValueError(f"negative dimension in shape {list(shape)}")
        numel *= int(n)
    return numel * dtype_of(dtype).itemsize


@dataclass(frozen=True)
class Layout:
    """Where each tensor lies in the byte stream and how the stream is cut into broadcasts."""

    offsets: list[int]
    """byte offset of each tensor (a multiple of :data:`ALIGN`)"""
    sizes: list[int]
    """bytes of each tensor"""
    total: int
    """bytes of the stream (tensors and padding)"""
    chunks: list[tuple[int, int]]
    """``[start, end)`` of each broadcast, at most ``bucket_bytes`` long"""

    @property
    def chunk_bytes(self) -> int:
        """The largest chunk: the buffer each side needs for one broadcast."""
        return max((end - start for start, end in self.chunks), default=0)


def plan_layout(dtypes: Sequence[str], shapes: Sequence[Sequence[int]], bucket_bytes: int) -> Layout:
    """The layout of tensors with these dtypes (``"float32"``) and shapes, broadcast ``bucket_bytes`` at a time."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes must be >= {ALIGN}, got {bucket_bytes}")
    if len(dtypes) != len(shapes):
        raise ValueError(f"{len(dtypes)} dtypes for {len(shapes)} shapes")
    offsets, sizes, pos = [], [], 0
    for dtype, shape in zip(dtypes, shapes):
        pos = -(-pos // ALIGN) * ALIGN
        offsets.append(pos)
        sizes.append(nbytes(dtype, shape))
        pos += sizes[-1]
    chunks = [(start, min(start + bucket_bytes, pos)) for start in range(0, pos, bucket_bytes)]
    return Layout(offsets, sizes, pos, chunks)


def _as_bytes(tensor: Tensor) -> Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def pack_chunks(tensors: Iterable[Tensor], layout: Layout, device: torch.device | str = "cpu") -> Iterator[Tensor]:
    """Yield the bytes of each chunk of ``layout``, filled from ``tensors`` (consumed in order, one at a time).

    The same buffer is reused for every chunk: broadcast it completely before asking for the next one. Padding
    bytes are zero.

    Raises:
        ValueError: ``tensors`` do not match the layout (another count, or other sizes).
    """
    buffer = torch.zeros(layout.chunk_bytes, dtype=torch.uint8, device=device)
    chunks = iter(layout.chunks)
    start, end = next(chunks, (0, 0))
    count = 0
    for i, tensor in enumerate(tensors):
        if i >= len(layout.sizes) or tensor.numel() * tensor.element_size() != layout.sizes[i]:
            raise ValueError(f"tensor {i} does not match the planned layout")
        data = _as_bytes(tensor)
        off, size = layout.offsets[i], layout.sizes[i]
        pos = off
        while pos < off + size:
            while pos >= end:  # the current chunk is complete
                yield buffer[: end - start]
                buffer.zero_()
                start, end = next(chunks)
            hi = min(off + size, end)
            buffer[pos - start: hi - start].copy_(data[pos - off: hi - off])
            pos = hi
        count += 1
    if count != len(layout.sizes):
        raise ValueError(f"{count} tensors for a layout of {len(layout.sizes)}")
    if layout.chunks:
        yield buffer[: end - start]


def unpack(stream: Tensor, layout: Layout, dtypes: Sequence[str], shapes: Sequence[Sequence[int]]) -> list[Tensor]:
    """The tensors of a received byte ``stream`` (views of it: no copy)."""
    return [stream[off: off + size].view(dtype_of(dtype)).view([int(n) for n in shape])
            for off, size, dtype, shape in zip(layout.offsets, layout.sizes, dtypes, shapes)]


def receive_staged(group: Any, layout: Layout, dtypes: Sequence[str], shapes: Sequence[Sequence[int]], *,
                   timeout_s: float, device: torch.device | str = "cpu") -> list[Tensor]:
    """Receive every chunk from rank 0 into one host buffer, then return the tensors (views of it).

    Nothing is returned before everything has arrived, so a failed transfer leaves whatever the caller would load
    into untouched. ``device``: the group's device (NCCL: each chunk lands in one device buffer, then is copied to
    the host).
    """
    device = torch.device(device)
    stream = torch.empty(layout.total, dtype=torch.uint8)
    landing = None if device.type == "cpu" else torch.empty(layout.chunk_bytes, dtype=torch.uint8, device=device)
    abort = getattr(group, "abort", None) if device.type != "cpu" else None
    for k, (start, end) in enumerate(layout.chunks):
        target = stream[start:end] if landing is None else landing[: end - start]
        wait_work(broadcast(group, target), timeout_s, f"receiving chunk {k + 1} of {len(layout.chunks)}",
                  on_timeout=abort)
        if landing is not None:
            stream[start:end].copy_(target)
    return unpack(stream, layout, dtypes, shapes)


# -- the server's end --------------------------------------------------------------------------------------------
class WeightReceiver:
    """A server worker's end of the group (no vLLM: the extension wraps it, the CPU tests run it as is).

    Every call checks the token (:func:`check_token`); :meth:`join` also the rendezvous (:func:`check_rendezvous`).
    ``boot_id`` names this process's life: the trainer keeps its digests across re-formed groups only while it
    talks to the same processes.

    Args:
        device: the worker's device: NCCL groups use it (a CUDA device); gloo groups use the CPU whatever it is (a
            GPU server may be synced over gloo: the received weights are loaded from host memory either way).
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.boot_id = uuid.uuid4().hex
        self.group: Any = None
        self.store: Any = None
        self.backend: Backend = "gloo"
        self.generation: int | None = None
        self.rank = 0
        self.timeout_s = 60.0

    def join(self, *, rendezvous: str, generation: int, rank: int, world_size: int, token: str,
             timeout_s: float = 60.0, backend: Backend = "gloo") -> dict[str, Any]:
        """Leave any previous group and join ``generation`` at ``rendezvous`` as ``rank`` (blocks until every rank
        has joined, at most ``timeout_s``)."""
        check_token(token)
        host, port = check_rendezvous(rendezvous)
        if not 1 <= int(rank) < int(world_size):
            raise ValueError(f"rank {rank} is not a server rank of a group of {world_size}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError("lit_rlft weight sync: backend 'nccl' needs a GPU worker (this one is on the CPU)")
        self.leave()
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        store = open_store(host, port, master=False, timeout_s=float(timeout_s))
        self.group = join_group(store, int(generation), int(rank), int(world_size), timeout_s=float(timeout_s),
                                backend=backend, local_host=local_address(host))
        self.store, self.generation, self.rank, self.timeout_s = store, int(generation), int(rank), float(timeout_s)
        self.backend = backend
        return {"rank": self.rank, "world_size": int(world_size), "generation": self.generation,
                "boot_id": self.boot_id}

    def receive(self, *, generation: int, names: list[str], dtypes: list[str], shapes: list[list[int]],
                bucket_bytes: int, token: str) -> list[tuple[str, Tensor]]:
        """Receive one push, staged (see the module docstring); on a transport failure the group is left (it cannot
        be used again) and the error says so.

        Raises:
            SyncRefused: a wrong token.
            RuntimeError: not in group ``generation``, or the transfer failed (nothing was received for loading).
        """
        check_token(token)
        if self.group is None or int(generation) != self.generation:
            raise RuntimeError(f"lit_rlft weight sync: this server is not in group generation {generation} "
                               f"(it is in {self.generation}); connect first")
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes")
        layout = plan_layout(dtypes, shapes, int(bucket_bytes))
        try:
            tensors = receive_staged(self.group, layout, dtypes, shapes, timeout_s=self.timeout_s,
                                     device=self.device if self.backend == "nccl" else "cpu")
        except Exception as exc:
            self.leave()
            raise RuntimeError(f"lit_rlft weight sync: {TRANSFER_FAILED} ({exc}); the weights are unchanged, the "
                               "group is left (the trainer connects again)") from exc
        return list(zip(names, tensors))

    def leave(self) -> None:
        """Drop the group and the store connection (a broken group closes its connections, so the trainer and the
        other servers see "Connection closed" at once)."""
        group, self.group, self.store, self.generation = self.group, None, None, None
        if group is not None:
            with contextlib.suppress(Exception):  # a broken group may refuse; dropping it is what matters
                group.shutdown()
            del group

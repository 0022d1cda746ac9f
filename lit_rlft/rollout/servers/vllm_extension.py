"""lit_rlft inside a vLLM server: the worker extension through which a trainer pushes weights and LoRA adapters.

    VLLM_SERVER_DEV_MODE=1 LIT_RLFT_SYNC_TOKEN=<secret> python -m vllm.entrypoints.launchers.api_server.entry \\
        --model DIR --worker-extension-cls lit_rlft.rollout.servers.vllm_extension.LitRLFTWorkerExtension ...

(:class:`~lit_rlft.rollout.servers.launcher.VLLMServer` and ``lit-rlft serve`` start it so.) vLLM mixes the class into its
worker class, and its methods are called by name, on the worker, through the dev route ``POST /collective_rpc
{"method": "lit_join", "kwargs": {...}}``; the trainer's side is :class:`~lit_rlft.rollout.servers.weight_sync.WeightSync`:

- ``lit_join(rendezvous, generation, rank, world_size, token, timeout_s, backend)``: join the trainer's group
  (gloo, or NCCL on the worker's GPU) -> ``{"rank", "world_size", "generation", "boot_id"}``;
- ``lit_update_weights(generation, names, dtypes, shapes, bucket_bytes, token)``: receive a push, staged, then load
  it -> ``{"tensors", "bytes"}``;
- ``lit_update_adapter(..., adapter_config, version)``: receive a LoRA adapter and write it as a peft folder, a new
  one per version (the trainer then loads it with ``/v1/load_lora_adapter``) -> ``{"path", "tensors", "bytes"}``;
- ``lit_leave(token)``: leave the group.

Why ``/collective_rpc`` and not a weight-transfer engine registered for vLLM's ``/init_weight_transfer_engine``,
``/update_weights`` routes (the research prototype had both, equally robust and fast): here ``self`` is the worker,
so a load is ``Worker.reload_weights``, the very call the in-process :class:`~lit_rlft.rollout.engines.vllm.VLLMEngine` makes
on CPU (vLLM's layerwise reload, which reaches vLLM-CPU's repacked linear weights, then the LoRA, encoder and
multimodal caches reset); one mechanism carries weights and adapters, and returns results (the adapter's folder); no
engine has to be registered before ``load_model`` (an import-order dependency) nor ``--weight-transfer-config`` be
passed; and vLLM's start/update/finish bookkeeping, which a trainer that fails between start and finish leaves
"update active" (refusing the next start), is not involved. The version is set with ``/update_weight_version``.

Security: every call carries the shared token, checked against the server's ``LIT_RLFT_SYNC_TOKEN`` with
``hmac.compare_digest`` (no token in the environment: weight sync off); a server whose environment has
``LIT_RLFT_SYNC_RENDEZVOUS=host:port`` joins that rendezvous only, so nobody who reaches its port can push weights or
point it at a store of theirs. vLLM's ``--api-key`` does not guard the dev and RL routes (``/collective_rpc``,
``/pause``, ...): every server runs :class:`~lit_rlft.rollout.servers.route_guard.RouteGuard`, which puts every route
but ``/health`` behind the key and lets ``/collective_rpc`` call only these methods (``docs/servers.md``).

Loading: staged (:class:`~lit_rlft.rollout.servers.weight_group.WeightReceiver`: everything received before anything is
loaded, so a failed transfer leaves the model as it was; streaming into the layerwise reload left the model on the
meta device and killed the engine at the next request, measured); a push that carries only one of a tied
``model.embed_tokens.weight`` / ``lm_head.weight`` is completed with the other name (vLLM-CPU keeps a packed copy of
a tied output layer, stale otherwise); the prefix cache is reset by the trainer's ``/pause`` (nothing is scheduled
between the pause and the resume, so no block is computed with the old weights after it).

GPU servers: over NCCL the group is built on the worker's device, chunks land in one device buffer and are staged
in host memory, then loaded; over gloo (a trainer without a GPU for the group, or one GPU shared: NCCL refuses two
ranks on one device) they arrive in host memory directly. A failed NCCL collective must not take the worker down:
the launcher sets ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (abort the communicator, keep the process). Neither has run
on a GPU yet.

vLLM is imported inside the methods only: the module imports without vLLM (the CPU tests drive it with a stand-in
worker).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lit_rlft.rollout.servers.weight_group import Backend, WeightReceiver, check_token

__all__ = ["ADAPTER_DIR_ENV", "LitRLFTWorkerExtension", "complete_tied", "write_adapter"]

#: Where a server writes the adapters it receives, in a folder of its own (default: a temporary folder per worker,
#: removed at its exit).
ADAPTER_DIR_ENV = "LIT_RLFT_ADAPTER_DIR"
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


def complete_tied(staged: list[tuple[str, Tensor]], tied: bool) -> list[tuple[str, Tensor]]:
    """``staged`` with the other name of a tied embedding / output layer when only one arrived (``tied``: the model
    ties them)."""
    if not tied:
        return staged
    names = {n for n, _ in staged}
    embed = next((t for n, t in staged if n.endswith("embed_tokens.weight")), None)
    if embed is not None and LM_HEAD not in names:
        return [*staged, (LM_HEAD, embed)]
    head = next((t for n, t in staged if n == LM_HEAD), None)
    if head is not None and not any(n.endswith("embed_tokens.weight") for n in names):
        return [*staged, (EMBED, head)]
    return staged


def write_adapter(root: str | Path, version: str, tensors: list[tuple[str, Tensor]], config: dict[str, Any],
                  keep: int = 2) -> str:
    """Write a peft adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) for ``version`` under
    ``root``, a new folder each time (vLLM's prefix cache keys adapters by path), and remove all but the ``keep``
    newest. Returns the folder's absolute path."""
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", str(version))[:64]
    folder = root / f"v{tag}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    # the received tensors are views of one buffer: safetensors refuses shared storage
    save_file({n: t.clone() for n, t in tensors}, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    older = sorted((p for p in root.iterdir() if p.is_dir() and p != folder), key=lambda p: p.stat().st_mtime)
    for old in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return str(folder.resolve())


class LitRLFTWorkerExtension:
    """Mixed into vLLM's worker class (``self`` is the worker; see the module docstring). Every name starts with
    ``lit_`` or ``_lit_``: vLLM refuses an extension attribute its worker already has."""

    def _lit_receiver(self) -> WeightReceiver:
        receiver = getattr(self, "_lit_weight_receiver", None)
        if receiver is None:
            device = getattr(self, "device", None)
            device = device if isinstance(device, torch.device) and device.type == "cuda" else torch.device("cpu")
            receiver = self._lit_weight_receiver = WeightReceiver(device)
        return receiver

    def lit_join(self, rendezvous: str, generation: int, rank: int, world_size: int, token: str,
                 timeout_s: float = 60.0, backend: Backend = "gloo") -> dict[str, Any]:
        """Join the trainer's group as ``rank`` (one worker per server); see :meth:`WeightReceiver.join`."""
        check_token(token)
        parallel = self.vllm_config.parallel_config
        workers = parallel.world_size * parallel.data_parallel_size
        if workers != 1:
            raise ValueError(f"lit_rlft weight sync supports one worker per server (TP = PP = DP = 1); this server "
                             f"has {workers}")
        return self._lit_receiver().join(rendezvous=rendezvous, generation=generation, rank=rank, world_size=world_size,
                             token=token, timeout_s=timeout_s, backend=backend)

    def lit_update_weights(self, generation: int, names: list[str], dtypes: list[str], shapes: list[list[int]],
                           bucket_bytes: int, token: str) -> dict[str, Any]:
        """Receive a push (staged), then load it with vLLM's layerwise reload (what ``Worker.reload_weights`` does;
        a vLLM layer that receives nothing keeps its weights, and vLLM logs "Failed to load weights" for it)."""
        staged = self._lit_receiver().receive(generation=generation, names=names, dtypes=dtypes, shapes=shapes,
                                              bucket_bytes=bucket_bytes, token=token)
        config = self.vllm_config.model_config
        text_config = getattr(config, "hf_text_config", None) or config.hf_config
        staged = complete_tied(staged, bool(getattr(text_config, "tie_word_embeddings", False)))
        received = sum(t.numel() * t.element_size() for _, t in staged)
        self.reload_weights(weights_iterator=iter(staged))
        return {"tensors": len(staged), "bytes": received}

    def lit_update_adapter(self, generation: int, names: list[str], dtypes: list[str], shapes: list[list[int]],
                           bucket_bytes: int, token: str, adapter_config: dict[str, Any],
                           version: str) -> dict[str, Any]:
        """Receive a LoRA adapter (peft's names) and write it as a new peft folder (:func:`write_adapter`); the
        trainer loads it with ``/v1/load_lora_adapter``."""
        staged = self._lit_receiver().receive(generation=generation, names=names, dtypes=dtypes, shapes=shapes,
                                              bucket_bytes=bucket_bytes, token=token)
        path = write_adapter(self._lit_adapter_root(), version, staged, adapter_config)
        return {"path": path, "tensors": len(staged), "bytes": sum(t.numel() * t.element_size() for _, t in staged)}

    def lit_leave(self, token: str) -> None:
        """Leave the group (a trainer's close)."""
        check_token(token)
        self._lit_receiver().leave()

    def _lit_adapter_root(self) -> str:
        root = getattr(self, "_lit_adapters", None)
        if root is None:
            shared = os.environ.get(ADAPTER_DIR_ENV)
            if shared:  # one folder per worker process: servers sharing the directory prune only their own
                root = os.path.join(shared, self._lit_receiver().boot_id)
            else:
                root = tempfile.mkdtemp(prefix="lit_rlft_adapters_")
                atexit.register(shutil.rmtree, root, ignore_errors=True)
            self._lit_adapters = root
        return root

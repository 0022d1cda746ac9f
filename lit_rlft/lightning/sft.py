"""Supervised warm start: teach a (tiny) policy the answer format before GRPO, and save an HF checkpoint.

``lit-rlft sft --config configs/sft_countdown_tiny.yaml`` trains on ``prompt -> target`` pairs (the loss covers the
target and EOS only) and writes ``output_dir`` (model + tokenizer) at the end, which a GRPO config then loads
as ``model.model``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from lit_rlft.data.loading import load_records
from lit_rlft.data.pool import build_pool
from lit_rlft.data.tasks import Task
from lit_rlft.data.templates import render_prompt
from lit_rlft.lightning.progress import rollout_progress_bar
from lit_rlft.models.loading import LoRAConfig, apply_lora, load_policy
from lit_rlft.models.tiny import TinyConfig
from lit_rlft.step.optim import adamw_with_warmup


class _Pairs(Dataset):
    def __init__(self, prompts: list[str], targets: list[str]):
        self.prompts, self.targets = prompts, targets

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> tuple[str, str]:
        return self.prompts[i], self.targets[i]


class SFTDataModule(L.LightningDataModule):
    """``prompt -> target`` pairs from a file, HF data set or generated task.

    Args:
        train: source of the pairs (see ``PromptDataModule.train``).
        prompt_field: field with the prompt.
        target_field: field with the target completion (e.g. ``solution``).
        split: split name for directories and hub names.
        batch_size: pairs per optimizer step.
        seed: shuffling seed.
        template: a ``str.format`` template over a row's fields building the prompt (as ``PromptDataModule``'s).
        chat_template: render prompts with the tokenizer's chat template, as GRPO's ``data.chat_template`` does (the
            target is then the assistant's reply, ended by the tokenizer's EOS).
        system_prompt: system message (chat template) or first line (plain prompts).
        prompt_prefix: text before the prompt (plain prompts only).
        prompt_suffix: text after the prompt (plain prompts only).

    Give the GRPO config's rendering options here too, so that the warm start learns the prompts GRPO will show.
    """

    def __init__(
        self,
        train: str | Task,
        prompt_field: str = "prompt",
        target_field: str = "solution",
        split: str = "train",
        batch_size: int = 128,
        seed: int = 0,
        template: str | None = None,
        chat_template: bool = False,
        system_prompt: str | None = None,
        prompt_prefix: str = "",
        prompt_suffix: str = "",
    ):
        super().__init__()
        self.source, self.split = train, split
        self.prompt_field, self.target_field, self.template = prompt_field, target_field, template
        self.batch_size, self.seed = batch_size, seed
        self.render = dict(chat_template=chat_template, system_prompt=system_prompt, prefix=prompt_prefix,
                           suffix=prompt_suffix)
        self.dataset: _Pairs | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.dataset is not None:
            return
        records = self.source.records() if isinstance(self.source, Task) else load_records(self.source, self.split)
        pool = build_pool(records, prompt_field=self.prompt_field, answer_field=None, columns=[self.target_field],
                          template=self.template)
        self.dataset = _Pairs(pool.prompts, [str(t) for t in pool.columns[self.target_field]])

    def rendered(self, prompts: list[str], tokenizer: Any) -> list[str]:
        """The prompts as the policy sees them (``render_prompt`` with this module's options)."""
        return [render_prompt(p, tokenizer, **self.render) for p in prompts]

    def train_dataloader(self) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True, generator=gen,
                          collate_fn=lambda b: ([p for p, _ in b], [t for _, t in b]), drop_last=True)


class SFTModule(L.LightningModule):
    """Next-token cross-entropy on the target tokens of ``prompt + target + EOS``.

    Args:
        model: HF causal-LM path or ``"tiny"``.
        tiny: size of the tiny model.
        lora: optional LoRA adapters.
        learning_rate: AdamW learning rate.
        adam_betas: AdamW betas.
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up steps, then ``lr_scheduler``.
        lr_scheduler: ``constant`` or ``cosine`` (over ``trainer.max_steps``).
        output_dir: where the HF checkpoint (model + tokenizer) is written when training ends.
    """

    def __init__(
        self,
        model: str = "tiny",
        tiny: TinyConfig | None = None,
        lora: LoRAConfig | None = None,
        learning_rate: float = 1.5e-3,
        adam_betas: tuple[float, float] = (0.9, 0.98),
        weight_decay: float = 0.01,
        warmup_steps: int = 100,
        lr_scheduler: Literal["constant", "cosine"] = "constant",
        output_dir: str = "runs/sft/model",
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["tiny", "lora"])
        # Plain types only: Lightning loads checkpoints with weights_only=True, which refuses dataclasses.
        self.hparams["tiny"] = _plain(tiny)
        self.hparams["lora"] = _plain(lora)
        self.policy, self.tokenizer = load_policy(model, tiny=tiny)
        self.lora = lora  # kept as given: under LightningCLI, hparams hold the raw config
        if lora is not None:
            self.policy = apply_lora(self.policy, lora)

    def _encode(self, prompts: list[str], targets: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tok = self.tokenizer
        data = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if isinstance(data, SFTDataModule):
            prompts = data.rendered(prompts, tok)
        rows, labels = [], []
        for p, t in zip(prompts, targets):
            p_ids = tok(p, add_special_tokens=False)["input_ids"]
            t_ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows.append(p_ids + t_ids)
            labels.append([-100] * len(p_ids) + t_ids)
        n = max(len(r) for r in rows)
        ids = torch.full((len(rows), n), tok.pad_token_id, dtype=torch.long)
        lab = torch.full((len(rows), n), -100, dtype=torch.long)
        attn = torch.zeros((len(rows), n), dtype=torch.long)
        for i, (r, lb) in enumerate(zip(rows, labels)):  # right padding: positions need no care
            ids[i, : len(r)], lab[i, : len(r)], attn[i, : len(r)] = torch.tensor(r), torch.tensor(lb), 1
        return ids.to(self.device), attn.to(self.device), lab.to(self.device)

    def training_step(self, batch: tuple[list[str], list[str]], batch_idx: int) -> torch.Tensor:
        ids, attn, labels = self._encode(*batch)
        loss = self.policy(input_ids=ids, attention_mask=attn, labels=labels).loss
        self.log("sft/loss", loss, prog_bar=True, on_step=True, batch_size=len(batch[0]))
        return loss

    def configure_callbacks(self) -> list[Any]:
        """Lightning's progress bar without ``Epoch 0/-2`` (see :mod:`lit_rlft.lightning.progress`)."""
        bar = rollout_progress_bar(self.trainer.progress_bar_callback, 1)
        return [bar] if bar is not None else []

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        total = self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else None
        return adamw_with_warmup(self.policy.parameters(), hp.learning_rate, hp.adam_betas, hp.weight_decay,
                                 hp.warmup_steps, hp.lr_scheduler, total)

    def on_train_end(self) -> None:
        if self.trainer.is_global_zero:
            out = Path(self.hparams.output_dir)
            model = self.policy.merge_and_unload() if self.lora is not None else self.policy
            model.save_pretrained(out)
            self.tokenizer.save_pretrained(out)


def _plain(obj: Any) -> Any:
    """A dataclass (or a dict from the CLI) as a plain dict, for hyper-parameters."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj

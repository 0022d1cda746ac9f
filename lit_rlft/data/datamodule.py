"""PromptDataModule: a pool of prompts (file, HF data set or generated task), its batch plan, and rendering.

The train loader yields step tokens only (see :mod:`lit_rlft.data.plan`); the module resolves prompts through
:meth:`PromptDataModule.prompt_tokens` and :meth:`PromptDataModule.reward_columns` when the step runs.

Both loaders are iterable data sets with a length, which Lightning never shards: every rank sees every step token
and every validation batch of *global* prompt ids, and the module splits the work between ranks itself (the same
global plan everywhere, each rank its slice). A ``DistributedSampler`` would shuffle the step tokens and pad the
validation ids with repeats, counting some prompts twice.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.data.loading import DataValidationError, load_records
from lit_rlft.data.plan import BatchPlan
from lit_rlft.data.pool import PromptPool, build_pool
from lit_rlft.data.tasks import Task
from lit_rlft.data.templates import render_prompt

Split = Literal["train", "val"]

# Lightning warns about any IterableDataset with a length, in case loader workers duplicate its items; _StepTokens
# splits its tokens between workers (get_worker_info), so the length is exact and the warning would only be noise.
warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined", category=UserWarning)


class _StepTokens(IterableDataset):
    """``length`` integer tokens, one per training step of an epoch (split between loader workers, in order)."""

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        info = get_worker_info()
        start, stride = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.length, stride))


class StepTokenLoader(DataLoader):
    """The train loader: step tokens, resumable mid-epoch.

    Its position in the epoch is part of Lightning's checkpoint (``state_dict``) and a resumed run skips the tokens
    already consumed, so the epoch ends where the uninterrupted run's would. The tokens carry no data (the plan, in
    the datamodule's own state, decides the prompts), so this is bookkeeping; it also means Lightning no longer warns
    that a mid-epoch resume with a "non-resumable" loader could replay data, which never applied here.
    """

    def __init__(self, num_steps: int, num_workers: int = 0):
        super().__init__(_StepTokens(num_steps), batch_size=None, num_workers=num_workers,
                         persistent_workers=num_workers > 0)
        self.position = 0
        self._skip = 0

    def __iter__(self):
        skip, self._skip, self.position = self._skip, 0, 0
        for token in super().__iter__():
            self.position += 1
            if self.position > skip:
                yield token

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        position = int(state.get("position", 0))
        self._skip = position if position < len(self.dataset) else 0  # a finished epoch: start the next one


class _GlobalBatches(IterableDataset):
    """Consecutive batches of ``batch_size`` ids (the last one shorter), the same on every rank."""

    def __init__(self, ids: np.ndarray, batch_size: int):
        self.ids, self.batch_size = np.asarray(ids, dtype=np.int64), batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.ids) / self.batch_size)

    def __iter__(self):
        for start in range(0, len(self.ids), self.batch_size):
            yield torch.as_tensor(self.ids[start : start + self.batch_size])


class PromptDataModule(L.LightningDataModule):
    """Prompts for GRPO.

    Args:
        train: a local ``.jsonl`` / ``.json`` / ``.parquet`` file, a directory (``datasets.save_to_disk`` or
            ``<split>.jsonl``), an HF hub name, or a generated task (``CountdownTask``, ``ArithmeticTask``).
        val: the held-out prompts, same forms; ``None`` disables validation.
        train_split: split name when ``train`` is a directory or hub name.
        val_split: split name for ``val``.
        prompt_field: the field holding the prompt (question) text.
        answer_field: the field passed to reward functions as ``answer`` (``None``: no answer).
        columns: other fields passed to reward functions (``None``: all).
        template: ``str.format`` template over a row's fields building the prompt, e.g. ``"Q: {question}\\nA:"``.
        chat_template: render prompts with the tokenizer's chat template.
        system_prompt: system message (chat template) or first line (plain prompts).
        prompt_prefix: text before the prompt (plain prompts only).
        prompt_suffix: text after the prompt (plain prompts only).
        batch_size: prompts per training step (``B``); each is rolled out ``num_generations`` times.
        val_batch_size: prompts per validation batch.
        val_size: use only the first ``val_size`` validation prompts (``None``: all).
        max_prompt_length: prompts longer than this many tokens are rejected before training: every prompt is
            tokenised once when both the pool and the tokenizer are there (``setup``), and the error names how many
            are too long and the first one's origin (``file:line``).
        seed: seed of the default uniform batch order.
        num_workers: loader workers (the train loader carries step tokens only, so this is rarely useful;
            selection stays exact with any value because prompts are resolved when the step runs).
    """

    def __init__(
        self,
        train: str | Task,
        val: str | Task | None = None,
        train_split: str = "train",
        val_split: str = "test",
        prompt_field: str = "prompt",
        answer_field: str | None = "answer",
        columns: list[str] | None = None,
        template: str | None = None,
        chat_template: bool = False,
        system_prompt: str | None = None,
        prompt_prefix: str = "",
        prompt_suffix: str = "",
        batch_size: int = 32,
        val_batch_size: int = 128,
        val_size: int | None = None,
        max_prompt_length: int = 1024,
        seed: int = 0,
        num_workers: int = 0,
    ):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        self.train_source, self.val_source = train, val
        self.train_split, self.val_split = train_split, val_split
        self.fields = dict(prompt_field=prompt_field, answer_field=answer_field, columns=columns, template=template)
        self.render = dict(
            chat_template=chat_template, system_prompt=system_prompt, prefix=prompt_prefix, suffix=prompt_suffix
        )
        self.batch_size, self.val_batch_size, self.val_size = batch_size, val_batch_size, val_size
        self.max_prompt_length = max_prompt_length
        self.seed, self.num_workers = seed, num_workers
        self.tokenizer: Any = None
        self.train_pool: PromptPool | None = None
        self.val_pool: PromptPool | None = None
        self.plan: BatchPlan | None = None
        self._token_cache: dict[tuple[str, int], list[int]] = {}
        self._length_checked: set[str] = set()  # splits whose every prompt is tokenised and within the limit
        self._pending_state: dict[str, Any] | None = None

    # -- building the pools -------------------------------------------------------------------------------
    def _load(self, source: str | Task, split: str, option: str) -> PromptPool:
        """The pool of ``source``; a data error is prefixed with the option that names the source."""
        try:
            records = source.records() if isinstance(source, Task) else load_records(source, split=split)
            return build_pool(records, **self.fields)
        except DataValidationError as e:
            raise DataValidationError(f"{option}: {e}") from e

    def setup(self, stage: str | None = None) -> None:
        if self.train_pool is None and stage in (None, "fit"):
            self.train_pool = self._load(self.train_source, self.train_split, "data.train")
            self.plan = BatchPlan(len(self.train_pool), self.batch_size, seed=self.seed)
            if self._pending_state is not None:
                self.plan.load_state_dict(self._pending_state)
                self._pending_state = None
        if self.val_pool is None and self.val_source is not None:
            pool = self._load(self.val_source, self.val_split, "data.val")
            if self.val_size is not None:
                pool = pool.subset(np.arange(min(self.val_size, len(pool))))
            self.val_pool = pool
        self.check_prompt_lengths()

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Attach the policy's tokenizer (the module calls this in its ``setup``) and check the prompt lengths."""
        if tokenizer is not self.tokenizer:
            self.tokenizer = tokenizer
            self._token_cache.clear()
            self._length_checked.clear()
        self.check_prompt_lengths()

    def set_tools(self, schemas: list[dict[str, Any]]) -> None:
        """Render prompts with these tool schemas (the environment's, for tool-calling episodes): the chat template
        describes the tools to the policy, as TRL's ``tools`` does. Plain-text prompts (no chat template) are left
        as they are: their instructions name the tools themselves."""
        if not self.render["chat_template"] or self.render.get("tools") == schemas:
            return
        self.render["tools"] = list(schemas)
        self._token_cache.clear()
        self._length_checked.clear()

    def check_prompt_lengths(self, chunk_size: int = 4096) -> None:
        """Tokenise every prompt of the built pools once (in batches, filling the token cache), before training.

        Nothing happens until both a pool and the tokenizer are there (``setup`` and :meth:`set_tokenizer` both call
        this). Raises :class:`~lit_rlft.data.loading.DataValidationError` naming ``data.max_prompt_length``, how many
        prompts exceed it and the first one's origin.
        """
        if self.tokenizer is None:
            return
        for split, pool in (("train", self.train_pool), ("val", self.val_pool)):
            if pool is None or split in self._length_checked:
                continue
            ids = pool.ids.tolist()
            lengths: list[int] = []
            for start in range(0, len(ids), chunk_size):
                lengths += self._encode(ids[start : start + chunk_size], split)
            self._raise_if_too_long(ids, lengths, split)
            self._length_checked.add(split)

    def pool(self, split: Split) -> PromptPool:
        pool = self.train_pool if split == "train" else self.val_pool
        if pool is None:
            raise RuntimeError(f"PromptDataModule: no {split} pool (call setup first, or give data.val)")
        return pool

    # -- what the module asks for -------------------------------------------------------------------------
    def prompt_texts(self, ids: np.ndarray, split: Split = "train") -> list[str]:
        """Rendered prompt strings for pool ids ``[b]``."""
        pool = self.pool(split)
        return [render_prompt(pool.prompts[i], self.tokenizer, **self.render) for i in pool.index_of(ids)]

    def prompt_tokens(self, ids: np.ndarray, split: Split = "train") -> list[list[int]]:
        """Tokenised prompts for pool ids ``[b]`` (cached per id)."""
        if self.tokenizer is None:
            raise RuntimeError("PromptDataModule: no tokenizer attached (the module attaches it in setup)")
        missing = [int(i) for i in ids if (split, int(i)) not in self._token_cache]
        if missing:
            self._raise_if_too_long(missing, self._encode(missing, split), split)
        return [self._token_cache[(split, int(i))] for i in ids]

    def _encode(self, ids: list[int], split: Split) -> list[int]:
        """Tokenise the prompts of pool ids ``ids`` (one batch) into the cache, those within
        ``data.max_prompt_length`` only; return every prompt's length."""
        add_special = not self.render["chat_template"]
        enc = self.tokenizer(self.prompt_texts(np.asarray(ids, dtype=np.int64), split),
                             add_special_tokens=add_special)["input_ids"]
        lengths = [len(toks) for toks in enc]
        for i, toks, n in zip(ids, enc, lengths):
            if n <= self.max_prompt_length:
                self._token_cache[(split, i)] = list(toks)
        return lengths

    def _raise_if_too_long(self, ids: list[int], lengths: list[int], split: Split) -> None:
        """One line: how many prompts exceed ``data.max_prompt_length``, the first one's origin, id and length."""
        over = [k for k, n in enumerate(lengths) if n > self.max_prompt_length]
        if not over:
            return
        pool, first = self.pool(split), over[0]
        origin = pool.origins[int(pool.index_of([ids[first]])[0])]
        raise DataValidationError(
            f"{len(over)} of {len(ids)} {split} prompts are longer than data.max_prompt_length="
            f"{self.max_prompt_length} tokens (first: {origin}, id {ids[first]}, {lengths[first]} tokens; longest: "
            f"{max(lengths)}): raise data.max_prompt_length or remove them"
        )

    def reward_columns(self, ids: np.ndarray, split: Split = "train") -> dict[str, list[Any]]:
        """The data set's columns for pool ids ``[b]`` (one entry per prompt), for reward functions."""
        pool = self.pool(split)
        return pool.rows(pool.index_of(ids))

    # -- loaders ------------------------------------------------------------------------------------------
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.pool("train")) / self.batch_size)

    def train_dataloader(self) -> DataLoader:
        return StepTokenLoader(self.steps_per_epoch(), self.num_workers)

    def val_dataloader(self) -> DataLoader | list:
        if self.val_pool is None:
            return []  # no held-out prompts: validation is skipped
        return DataLoader(_GlobalBatches(self.pool("val").ids, self.val_batch_size), batch_size=None)

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"plan": encode_state(self.plan.state_dict())} if self.plan is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "plan" not in state:
            return
        plan_state = decode_state(state["plan"])
        if self.plan is None:
            self._pending_state = plan_state
        else:
            self.plan.load_state_dict(plan_state)

"""A sequence-classification reward model as a reward: scored in micro-batches bounded by tokens, on the rank's device.

TRL loads ``AutoModelForSequenceClassification(num_labels=1)`` for a model id in ``reward_funcs`` and scores each
rank's completions in one padded forward (TRL #4419: out of memory on long completions). Here the texts are sorted
by length and cut into micro-batches of at most ``max_batch_tokens`` padded tokens, so memory is bounded by the
budget whatever the batch, and short texts are not padded to the longest of the batch.

A completion's score is the model's own forward on its text (prompt and completion, through the reward model's chat
template when its tokenizer has one): explicit position ids make left padding give what an unpadded forward gives,
and the model pools its logits at the last token that is not padding, as it does on one unpadded text.

Example:
    >>> reward = RewardModel("runs/rm", max_batch_tokens=4096, dtype="bfloat16")  # doctest: +SKIP
    >>> reward(["(1+2)*3"], prompts=["Make 9 from 1 2 3"])  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from lit_rlft.rewards.batched import BatchedReward

__all__ = ["RewardModel", "token_micro_batches"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def token_micro_batches(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Cut rows into micro-batches whose padded size (rows x longest row) stays within ``max_batch_tokens``.

    Rows are taken longest first, so each micro-batch pads to its own first row; a row longer than the budget gets a
    micro-batch of its own. Returns row indices per micro-batch (every row exactly once).

    Example:
        >>> token_micro_batches([3, 10, 4, 9], 20)
        [[1, 3], [2, 0]]
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * max(1, lengths[batches[-1][0]]) <= max_batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def default_device() -> torch.device:
    """This rank's accelerator (``LOCAL_RANK``) when there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0") or 0))
    return torch.device("cpu")


class RewardModel(BatchedReward):
    """Score completions with a sequence-classification model (``logits[:, label]``), batched by tokens.

    Args:
        model: a checkpoint directory, a hub name (where the hub is reachable), or a built ``nn.Module``
            (a ``*ForSequenceClassification``; then ``tokenizer`` is required).
        tokenizer: the reward model's own tokenizer (a path, or an object); default: the one saved with ``model``.
        chat_template: render ``[user: prompt, assistant: completion]`` with the tokenizer's chat template (default:
            when it has one); otherwise the text is ``prompt + completion``.
        max_batch_tokens: padded tokens per forward (rows x longest row); bounds activation memory.
        max_length: longest text in tokens; longer ones keep their last ``max_length`` tokens (the score is read at
            the end), and are counted in :attr:`num_truncated`.
        device: where it runs (default: this rank's GPU, else the CPU); the model moves there on first use.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        label: the logit read as the score.
        sigmoid: score ``sigmoid(logit)`` (a probability in [0, 1], for a classifier trained with a binary loss)
            rather than the logit.
        name: the name in ``rewards/<name>/...`` (default: the model's folder name, or ``reward_model``).
        cache: keep scores by (prompt, completion) and score only new pairs (the model is frozen).

    Placement: replicated (every rank holds the whole model and scores its own completions), or sharded like the
    policy: when the policy is sharded with FSDP2, the step shards the reward model over the same mesh
    (:meth:`shard`), each rank holding a slice of its weights; every forward then gathers them from all ranks, so the
    ranks agree on the number of micro-batches and a rank with fewer makes one-token passes.
    """

    cacheable = True

    def __init__(self, model: str | nn.Module, tokenizer: str | Any | None = None, *, chat_template: bool | None = None,
                 max_batch_tokens: int = 8192, max_length: int | None = None, device: str | None = None,
                 dtype: str = "float32", label: int = 0, sigmoid: bool = False, name: str | None = None,
                 cache: bool = True) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"RewardModel: dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if max_batch_tokens < 1:
            raise ValueError(f"RewardModel: max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"RewardModel: max_length must be >= 1 or null, got {max_length}")
        if isinstance(model, str):
            from lit_rlft.models.loading import hub_errors, load_tokenizer, resolve_model_path

            path = resolve_model_path(model)
            from transformers import AutoModelForSequenceClassification

            with hub_errors(path):
                module = AutoModelForSequenceClassification.from_pretrained(path, dtype=_DTYPES[dtype])
            if tokenizer is None:
                tokenizer = path
            default_name = os.path.basename(os.path.normpath(path)) or "reward_model"
        else:
            if tokenizer is None:
                raise ValueError("RewardModel: a built model needs its tokenizer (tokenizer=...)")
            module = model.to(_DTYPES[dtype])
            default_name = "reward_model"
        if isinstance(tokenizer, str):
            from lit_rlft.models.loading import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self.model = module.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        config = self.model.config
        if getattr(config, "pad_token_id", None) is None:  # a padded forward needs it (it finds each row's end)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            if pad is None:
                raise ValueError("RewardModel: neither the model's config nor its tokenizer has a pad or eos token")
            config.pad_token_id = pad
        if label >= int(getattr(config, "num_labels", 1)):
            raise ValueError(f"RewardModel: label {label} but the model has {config.num_labels} labels")
        self.pad_id = int(config.pad_token_id)
        self.chat_template = (getattr(tokenizer, "chat_template", None) is not None if chat_template is None
                              else chat_template)
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_length = max_length
        self.device = torch.device(device) if device is not None else None
        self.label = int(label)
        self.sigmoid = bool(sigmoid)
        self.name = name or default_name
        self.cacheable = bool(cache)
        self.padding_side = getattr(tokenizer, "padding_side", "right")
        self.num_truncated = 0
        self.num_forwards = 0
        self.num_padding_forwards = 0
        self.sharded = False

    # -------------------------------------------------------------------------------------------- texts
    def texts(self, completions: Sequence[str], prompts: Sequence[Any] | None) -> list[str]:
        """What the model reads for each completion."""
        if prompts is None:
            prompts = [""] * len(completions)
        if not self.chat_template:
            return [f"{p}{c}" for p, c in zip(prompts, completions)]
        return [self.tokenizer.apply_chat_template(
            [{"role": "user", "content": str(p)}, {"role": "assistant", "content": c}], tokenize=False)
            for p, c in zip(prompts, completions)]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (special tokens added when there is no chat template), cut to ``max_length``."""
        if not texts:
            return []
        ids = self.tokenizer(list(texts), add_special_tokens=not self.chat_template)["input_ids"]
        out = []
        for row in ids:
            if self.max_length is not None and len(row) > self.max_length:
                row = row[-self.max_length:]
                self.num_truncated += 1
            out.append(list(row) or [self.pad_id])
        return out

    # -------------------------------------------------------------------------------------------- scoring
    @property
    def collective(self) -> bool:
        """Whether every rank must call :meth:`score` together (the model is sharded)."""
        return self.sharded

    def shard(self, mesh: Any) -> None:
        """Shard the model with FSDP2 over ``mesh`` (the policy's data-parallel mesh), one unit per decoder layer,
        after moving it to this rank's device of the mesh."""
        from lit_rlft.models.sharding import fully_shard_policy

        if self.sharded:
            return
        index = torch.cuda.current_device() if mesh.device_type == "cuda" else None
        self.device = torch.device(mesh.device_type, index) if index is not None else torch.device(mesh.device_type)
        self.model.to(self.device)
        fully_shard_policy(self.model, mesh)
        self.sharded = True

    def _ready(self) -> torch.device:
        if self.sharded:
            return self.device  # type: ignore[return-value]
        if self.device is None:
            self.device = default_device()
        if next(self.model.parameters()).device != self.device:
            self.model.to(self.device)
        return self.device

    @torch.inference_mode()
    def forward_ids(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Scores ``[n]`` (float32, CPU) of tokenised texts, in token-bounded micro-batches."""
        device = self._ready()
        scores = torch.empty(len(rows), dtype=torch.float32)
        batches = token_micro_batches([len(r) for r in rows], self.max_batch_tokens)
        if self.sharded:  # every forward is a collective: the ranks make as many, a short rank one-token passes
            count = torch.tensor([len(batches)], device=device)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            for _ in range(int(count) - len(batches)):
                one = torch.full((1, 1), self.pad_id, dtype=torch.long, device=device)
                self.model(input_ids=one, attention_mask=torch.ones_like(one))
                self.num_padding_forwards += 1
        for batch in batches:
            width = max(len(rows[i]) for i in batch)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for j, i in enumerate(batch):
                row = torch.as_tensor(rows[i], dtype=torch.long)
                cols = slice(width - len(row), width) if self.padding_side == "left" else slice(0, len(row))
                ids[j, cols] = row
                mask[j, cols] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                position_ids=positions.to(device)).logits  # [b, num_labels]
            picked = logits[:, self.label].float()
            scores[batch] = (picked.sigmoid() if self.sigmoid else picked).cpu()
            self.num_forwards += 1
        if self.sharded:
            self.model.reshard()  # FSDP2 keeps the root's gathered weights after a forward (for a backward): free them
        return scores

    def score(self, completions: list[str], columns: Mapping[str, Sequence[Any]]) -> list[float | None]:
        rows = self.encode(self.texts(completions, columns.get("prompts")))
        return self.forward_ids(rows).tolist()

    def __repr__(self) -> str:
        return (f"RewardModel({self.name!r}, max_batch_tokens={self.max_batch_tokens}, "
                f"dtype={next(self.model.parameters()).dtype}, device={self.device or 'auto'})")

"""The prompt pool: every prompt a run can train on, with its aligned columns and stable integer ids.

``S`` (see ``docs/design.md``) is the pool size. Prompts are raw text, *before* any chat template
(:mod:`lit_rlft.data.templates` renders them). Columns hold every other kept field, aligned with the prompts, and
are what reward functions receive as keyword arguments (``answer=[...]``, ``nums=[...]``, ...).
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lit_rlft.data.loading import DataValidationError, Record

__all__ = ["PromptPool", "build_pool", "RESERVED_COLUMNS", "MAX_REPORTED_PROBLEMS"]

#: Column names that would clash with reward-function arguments (``fn(completions, prompts=..., **columns)``).
RESERVED_COLUMNS: frozenset[str] = frozenset({"prompts", "completions"})
#: How many validation problems one :class:`DataValidationError` lists.
MAX_REPORTED_PROBLEMS: int = 20


@dataclass(eq=False)
class PromptPool:
    """Prompts with aligned columns, stable ids and origins.

    Attributes:
        prompts: ``[S]`` raw prompt texts (no chat template applied).
        columns: Every other kept field, each a list of ``S`` values aligned with ``prompts``.
        ids: ``[S]`` int64 stable ids; default ``0..S-1`` (row order in the source, stable across runs).
            A :meth:`subset` keeps the ids of the rows it keeps, so ids are not always positions.
        origins: ``[S]`` where each row came from (``"file:line"``, ``"hub:name[split]#i"``, ...).
    """

    prompts: list[str]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    ids: np.ndarray | None = None
    origins: list[str] | None = None

    def __post_init__(self) -> None:
        self.prompts = list(self.prompts)
        size = len(self.prompts)
        self.columns = {name: list(values) for name, values in self.columns.items()}
        self.ids = np.arange(size, dtype=np.int64) if self.ids is None else np.asarray(self.ids, dtype=np.int64)
        self.origins = [f"pool#{i}" for i in range(size)] if self.origins is None else list(self.origins)
        if self.ids.ndim != 1 or len(self.ids) != size:
            raise ValueError(f"ids must have shape [S]=[{size}], got {tuple(self.ids.shape)}")
        if len(self.origins) != size:
            raise ValueError(f"origins has {len(self.origins)} entries, expected {size}")
        for name, values in self.columns.items():
            if len(values) != size:
                raise ValueError(f"column {name!r} has {len(values)} values, expected {size}")
            if name in RESERVED_COLUMNS:
                raise ValueError(f"column name {name!r} is reserved ({', '.join(sorted(RESERVED_COLUMNS))})")
        self._identity = bool(np.array_equal(self.ids, np.arange(size, dtype=np.int64)))
        if self._identity:
            self._sorter = self._sorted_ids = None
        else:
            self._sorter = np.argsort(self.ids, kind="stable")
            self._sorted_ids = self.ids[self._sorter]
            dup = self._sorted_ids[1:][self._sorted_ids[1:] == self._sorted_ids[:-1]]
            if dup.size:
                raise ValueError(f"ids must be unique; duplicated: {sorted(set(dup.tolist()))[:10]}")

    def __len__(self) -> int:
        """Pool size ``S``."""
        return len(self.prompts)

    def _positions(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        pos = np.asarray(indices, dtype=np.int64).reshape(-1)
        if pos.size and (pos.min() < 0 or pos.max() >= len(self)):
            bad = pos[(pos < 0) | (pos >= len(self))][:10].tolist()
            raise IndexError(f"positions out of range for a pool of {len(self)}: {bad}")
        return pos

    def subset(self, indices: Sequence[int] | np.ndarray) -> PromptPool:
        """A new pool with the rows at these *positions* (not ids), in the given order; ids are kept."""
        pos = self._positions(indices).tolist()
        return PromptPool(
            prompts=[self.prompts[i] for i in pos],
            columns={name: [values[i] for i in pos] for name, values in self.columns.items()},
            ids=self.ids[pos] if pos else np.zeros(0, dtype=np.int64),
            origins=[self.origins[i] for i in pos],
        )

    def rows(self, indices: Sequence[int] | np.ndarray) -> dict[str, list[Any]]:
        """Columns for the rows at these *positions*, plus ``"prompts"``: the keyword arguments a reward gets."""
        pos = self._positions(indices).tolist()
        out = {name: [values[i] for i in pos] for name, values in self.columns.items()}
        out["prompts"] = [self.prompts[i] for i in pos]
        return out

    def index_of(self, ids: Sequence[int] | np.ndarray | int) -> np.ndarray:
        """Map ids to positions (int64, same shape as ``ids``); an unknown id raises ``KeyError``."""
        query = np.asarray(ids, dtype=np.int64)
        flat = query.reshape(-1)
        if self._identity:
            missing = flat[(flat < 0) | (flat >= len(self))]
            pos = flat
        elif len(self) == 0:
            missing, pos = flat, flat
        else:
            at = np.minimum(np.searchsorted(self._sorted_ids, flat), len(self) - 1)
            missing = flat[self._sorted_ids[at] != flat]
            pos = self._sorter[at]
        if missing.size:
            raise KeyError(f"ids not in the pool: {missing[:10].tolist()}")
        return np.asarray(pos, dtype=np.int64).reshape(query.shape)

    def fingerprint(self) -> str:
        """Short hex sha256 of the prompts (in order): a cache key for per-prompt data such as embeddings."""
        h = hashlib.sha256()
        for text in self.prompts:
            data = text.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        return h.hexdigest()[:16]


def _template_fields(template: str) -> list[str]:
    """Root field names of a ``str.format`` template (``"{a.b}"`` -> ``a``); positional fields are an error."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise DataValidationError(f"invalid prompt template {template!r}: {e}") from e
    for _, field_name, _, _ in parsed:
        if field_name is None:
            continue
        root = field_name.split(".", 1)[0].split("[", 1)[0]
        if root == "" or root.isdigit():
            raise DataValidationError(
                f"prompt template {template!r} uses a positional field '{{{field_name}}}': name the record field, "
                "e.g. '{question}'"
            )
        if root not in names:
            names.append(root)
    return names


def _available(data: dict[str, Any]) -> str:
    return ", ".join(data.keys()) or "none"


def build_pool(
    records: list[Record],
    prompt_field: str = "prompt",
    answer_field: str | None = "answer",
    columns: list[str] | None = None,
    id_field: str | None = None,
    template: str | None = None,
) -> PromptPool:
    """Validate records and build a :class:`PromptPool`.

    Args:
        records: Rows from :func:`~lit_rlft.data.loading.load_records` or a task's ``records()``.
        prompt_field: Field holding the prompt text (ignored when ``template`` is given).
        answer_field: Field renamed to the column ``answer``; ``None`` for no answer column. When it is not
            ``"answer"`` and the records also have an ``answer`` field, the renamed field wins and the original
            ``answer`` field is dropped.
        columns: Fields to keep as columns (besides the prompt and the answer); ``None`` keeps all remaining
            fields (the union over records, ``None`` where a record lacks one).
        id_field: Field holding integer ids (must be unique); ``None`` numbers rows ``0..S-1`` in source order.
        template: A ``str.format`` template such as ``"Question: {question}\\nAnswer:"`` filled from each record
            to make the prompt; with a template, ``prompt_field`` is not used and every field stays a candidate
            column.

    Returns:
        The pool.

    Raises:
        DataValidationError: all problems found (up to :data:`MAX_REPORTED_PROBLEMS` listed, each with origin and
            field): missing prompt field, non-string or empty prompt, missing template field, missing answer field,
            missing listed column, missing / non-integer / duplicate id, reserved column name.
    """
    if not records:
        raise DataValidationError("no records: the data source is empty")  # load_records names the file
    template_fields = _template_fields(template) if template is not None else []
    if columns is not None:
        columns = list(columns)
        clash = sorted(set(columns) & RESERVED_COLUMNS)
        if clash:
            raise DataValidationError(f"columns {clash} are reserved names; rename those fields")
        if answer_field is not None and "answer" in columns and answer_field != "answer":
            raise DataValidationError(
                f"column 'answer' clashes with answer_field={answer_field!r}, which is renamed to 'answer'"
            )

    problems: list[str] = []
    total = 0

    def report(msg: str) -> None:
        nonlocal total
        total += 1
        if len(problems) < MAX_REPORTED_PROBLEMS:
            problems.append(msg)

    prompts: list[str] = []
    seen_ids: dict[int, str] = {}
    raw_ids: list[int] = []
    for rec in records:
        data, origin = rec.data, rec.origin
        # prompt
        prompt: Any = None
        if template is not None:
            missing = [name for name in template_fields if name not in data]
            for name in missing:
                report(f"{origin}: template field {name!r} is missing (available: {_available(data)})")
            if not missing:
                try:
                    prompt = template.format(**data)
                except (KeyError, IndexError, AttributeError, ValueError, TypeError) as e:
                    report(f"{origin}: prompt template could not be filled: {type(e).__name__}: {e}")
            if isinstance(prompt, str) and not prompt.strip():
                report(f"{origin}: prompt from template is empty")
        elif prompt_field not in data:
            report(f"{origin}: field {prompt_field!r} is missing (available: {_available(data)})")
        else:
            prompt = data[prompt_field]
            if not isinstance(prompt, str):
                report(f"{origin}: field {prompt_field!r} must be a string, got {type(prompt).__name__}")
            elif not prompt.strip():
                report(f"{origin}: field {prompt_field!r} is empty")
        prompts.append(prompt if isinstance(prompt, str) else "")
        # answer and listed columns
        if answer_field is not None and answer_field not in data:
            report(f"{origin}: field {answer_field!r} is missing (available: {_available(data)})")
        if columns is not None:
            for name in columns:
                if name not in data:
                    report(f"{origin}: field {name!r} is missing (available: {_available(data)})")
        # ids
        if id_field is not None:
            if id_field not in data:
                report(f"{origin}: field {id_field!r} is missing (available: {_available(data)})")
                raw_ids.append(-1)
                continue
            value = data[id_field]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                    value = int(value)
                else:
                    report(f"{origin}: field {id_field!r} must be an integer id, got {value!r}")
                    raw_ids.append(-1)
                    continue
            value = int(value)
            if value in seen_ids:
                report(f"{origin}: field {id_field!r}: duplicate id {value} (first at {seen_ids[value]})")
            else:
                seen_ids[value] = origin
            raw_ids.append(value)

    # column names (decided after the scan so that a missing listed column is reported per row above)
    if columns is None:
        excluded: set[str] = set()
        if template is None:
            excluded.add(prompt_field)
        if answer_field is not None:
            excluded.update({answer_field, "answer"})
        names: list[str] = []
        seen: set[str] = set()
        for rec in records:
            for key in rec.data:
                if key not in seen:
                    seen.add(key)
                    if key not in excluded:
                        names.append(key)
        for name in names:
            if name in RESERVED_COLUMNS:
                first = next(rec.origin for rec in records if name in rec.data)
                report(f"{first}: field {name!r} is a reserved column name; pass columns=[...] without it or "
                       "rename it")
    else:
        names = [name for name in columns if name != "answer" or answer_field is None]

    if total:
        shown = "\n".join(f"  - {p}" for p in problems)
        more = f"\n  ... and {total - len(problems)} more" if total > len(problems) else ""
        raise DataValidationError(f"{total} problem(s) in the data:\n{shown}{more}")

    cols: dict[str, list[Any]] = {}
    if answer_field is not None:
        cols["answer"] = [rec.data[answer_field] for rec in records]
    for name in names:
        if name in cols:
            continue
        cols[name] = [rec.data.get(name) for rec in records]
    ids = np.asarray(raw_ids, dtype=np.int64) if id_field is not None else None
    return PromptPool(prompts=prompts, columns=cols, ids=ids, origins=[rec.origin for rec in records])

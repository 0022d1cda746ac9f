"""Load raw records from local files, saved ``datasets`` directories or the Hugging Face hub.

A :class:`Record` is one row of a data set (a plain ``dict``) together with its *origin*, a short string that
error messages use to point at the exact place a bad row came from:

- ``"/data/train.jsonl:17"``: a JSON-lines file, 1-based line number (what an editor shows);
- ``"/data/train.parquet#17"``, ``"/data/train.json#17"``, ``"/data/saved[train]#17"``: a row of a parquet file,
  a JSON list or a saved ``datasets`` directory, 0-based row index;
- ``"hub:openai/gsm8k[train]#17"``: a row of a hub data set, 0-based row index;
- ``"generated:countdown#17"``: a row made by a synthetic task (see :mod:`lit_rlft.data.tasks`), 0-based.

No Lightning here; ``datasets`` and ``pyarrow`` are imported only when a source needs them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DataValidationError", "Record", "load_records", "FILE_SUFFIXES"]

#: File suffixes :func:`load_records` reads directly.
FILE_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".parquet")


class DataValidationError(ValueError):
    """A data source is missing, unreadable, or holds rows that do not fit the requested layout.

    The message always names where the problem is (a path, ``file:line`` or a record origin) and, for a field
    problem, the field.
    """


@dataclass(frozen=True)
class Record:
    """One raw row of a data set.

    Attributes:
        data: The row's fields, as parsed (JSON object, parquet row, ``datasets`` row or generated dict).
        origin: Where the row came from, e.g. ``"/data/train.jsonl:17"`` or ``"hub:openai/gsm8k[train]#17"``.
    """

    data: dict[str, Any]
    origin: str


def load_records(
    source: str, split: str = "train", data_files: str | None = None, config: str | None = None
) -> list[Record]:
    """Load every row of a data source as :class:`Record` objects, in source order.

    ``source`` is tried in this order:

    1. a local file: ``.jsonl`` (streamed line by line; blank lines skipped), ``.json`` (a JSON list of objects,
       or JSON lines) or ``.parquet``;
    2. a local directory saved with ``datasets.save_to_disk`` (a ``DatasetDict`` is indexed by ``split``);
    3. a local directory holding ``<split>.jsonl``, ``<split>.json`` or ``<split>.parquet`` (or, when
       ``data_files`` is given, the file ``<source>/<data_files>``);
    4. otherwise a hub name for ``datasets.load_dataset(source, config, split=split, data_files=data_files)``.

    A source that looks like a file path (it ends in a known suffix, or starts with ``/``, ``.`` or ``~``) but does
    not exist is an error naming the path; it is never sent to the hub.

    Args:
        source: Path or hub name.
        split: Split to read from a ``DatasetDict``, a split directory, or the hub.
        data_files: Passed to ``load_dataset`` for hub / builder sources; for a local directory, a file inside it.
        config: Hub configuration name (e.g. ``"main"`` for ``openai/gsm8k``); ignored for local sources.

    Returns:
        The rows, each with its origin.

    Raises:
        DataValidationError: missing path, unsupported file type, malformed JSON (with ``file:line`` and the JSON
            error), a row that is not an object, an unknown split, a hub load failure, or a source with no records
            (naming the file, saved split or hub split).
    """
    if not isinstance(source, (str, Path)) or not str(source).strip():
        raise DataValidationError(f"data source must be a non-empty path or hub name, got {source!r}")
    path = Path(str(source)).expanduser()
    if path.is_file():
        return _load_file(path)
    if path.is_dir():
        return _load_dir(path, split, data_files)
    text = str(source)
    if path.suffix.lower() in FILE_SUFFIXES or text.startswith(("/", ".", "~")):
        raise DataValidationError(f"data file not found: {str(path)!r}")
    return _load_hub(text, split, data_files, config)


def _load_file(path: Path) -> list[Record]:
    loaders = {".jsonl": _load_jsonl, ".json": _load_json, ".parquet": _load_parquet}
    loader = loaders.get(path.suffix.lower())
    if loader is None:
        raise DataValidationError(
            f"unsupported data file type {path.suffix!r} for {str(path)!r}: expected one of {', '.join(FILE_SUFFIXES)}"
        )
    return _non_empty(loader(path), f"data file {str(path)!r}")


def _non_empty(records: list[Record], where: str, why: str = "it is empty, or only blank lines") -> list[Record]:
    if not records:
        raise DataValidationError(f"{where} holds no records ({why})")
    return records


def _check_object(row: Any, origin: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataValidationError(f"{origin}: expected a JSON object (one record), got {type(row).__name__}")
    return row


def _load_jsonl(path: Path) -> list[Record]:
    name = str(path)
    records: list[Record] = []
    loads = json.loads
    with path.open("r", encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            origin = f"{name}:{lineno}"
            try:
                row = loads(line)
            except json.JSONDecodeError as e:
                raise DataValidationError(f"{origin}: invalid JSON: {e.msg} (column {e.colno})") from e
            records.append(Record(_check_object(row, origin), origin))
    return records


def _load_json(path: Path) -> list[Record]:
    with path.open("r", encoding="utf-8-sig") as f:
        text = f.read()
    if not text.lstrip().startswith("["):
        return _load_jsonl(path)  # JSON lines stored under a .json name
    name = str(path)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataValidationError(f"{name}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from e
    return [Record(_check_object(row, f"{name}#{i}"), f"{name}#{i}") for i, row in enumerate(rows)]


def _load_parquet(path: Path) -> list[Record]:
    import pyarrow.parquet as pq

    name = str(path)
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataValidationError(f"{name}: could not read parquet file: {type(e).__name__}: {e}") from e
    return [Record(row, f"{name}#{i}") for i, row in enumerate(rows)]


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _load_dir(path: Path, split: str, data_files: str | None) -> list[Record]:
    if _is_saved_dataset(path):
        return _load_saved(path, split)
    if data_files is not None:
        target = path / data_files
        if not target.is_file():
            raise DataValidationError(f"data file not found: {str(target)!r}")
        return _load_file(target)
    for suffix in (".jsonl", ".parquet", ".json"):
        candidate = path / f"{split}{suffix}"
        if candidate.is_file():
            return _load_file(candidate)
    contents = sorted(p.name for p in path.iterdir())[:20]
    raise DataValidationError(
        f"directory {str(path)!r} is not a saved datasets directory and holds no {split}.jsonl, {split}.parquet "
        f"or {split}.json for split {split!r} (contents: {', '.join(contents) or 'empty'})"
    )


def _load_saved(path: Path, split: str) -> list[Record]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataValidationError(f"{str(path)!r}: could not load saved dataset: {type(e).__name__}: {e}") from e
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataValidationError(
                f"{str(path)!r}: split {split!r} not found (available: {', '.join(loaded.keys())})"
            )
        loaded = loaded[split]
    name = f"{path}[{split}]"
    return _non_empty([Record(row, f"{name}#{i}") for i, row in enumerate(loaded.to_list())],
                      f"saved dataset {name!r}", "the split is empty")


def _load_hub(name: str, split: str, data_files: str | None, config: str | None) -> list[Record]:
    try:
        import datasets

        ds = datasets.load_dataset(name, config, split=split, data_files=data_files)
    except Exception as e:  # network, missing repo, missing config/split: all reported the same way
        raise DataValidationError(
            f"data source {name!r} does not exist locally and could not be loaded from the hub "
            f"(split={split!r}): {type(e).__name__}: {e}"
        ) from e
    if not isinstance(ds, datasets.Dataset):
        raise DataValidationError(f"hub:{name}[{split}]: expected a map-style dataset, got {type(ds).__name__}")
    prefix = f"hub:{name}[{split}]"
    records = [Record(row, f"{prefix}#{i}") for i, row in enumerate(ds.to_list())]
    return _non_empty(records, f"data set {prefix!r}", "the split is empty")

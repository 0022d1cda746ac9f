"""Loading records from files, directories, saved datasets and (mocked) hub names."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from lit_rlft.data.loading import DataValidationError, Record, load_records

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]


def test_jsonl_rows_and_origins(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n", encoding="utf-8")
    records = load_records(str(path))
    assert [r.data for r in records] == ROWS[:2]
    assert records[0].origin == f"{path}:1"
    assert records[1].origin == f"{path}:3"  # blank line skipped, numbering kept
    assert isinstance(records[0], Record)


def test_jsonl_bad_line_names_file_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + '{"prompt": "x", \n', encoding="utf-8")
    with pytest.raises(DataValidationError, match=rf"{path}:2: invalid JSON"):
        load_records(str(path))


def test_jsonl_non_object_line(tmp_path: Path) -> None:
    path = tmp_path / "list.jsonl"
    path.write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(DataValidationError, match=rf"{path}:1: expected a JSON object.*list"):
        load_records(str(path))


def test_missing_file_names_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataValidationError, match="nope.jsonl"):
        load_records(str(missing))
    with pytest.raises(DataValidationError, match="not found"):
        load_records("./relative/missing_dir")


def test_json_list_and_json_lines(tmp_path: Path) -> None:
    as_list = tmp_path / "a.json"
    as_list.write_text(json.dumps(ROWS, indent=2), encoding="utf-8")
    records = load_records(str(as_list))
    assert [r.data for r in records] == ROWS
    assert records[2].origin == f"{as_list}#2"
    as_lines = _write_jsonl(tmp_path / "b.json", ROWS)
    assert [r.data for r in load_records(str(as_lines))] == ROWS
    broken = tmp_path / "c.json"
    broken.write_text('[\n{"prompt": "a"},\n{"prompt" "b"}\n]', encoding="utf-8")
    with pytest.raises(DataValidationError, match=rf"{broken}:3: invalid JSON"):
        load_records(str(broken))


def test_unsupported_suffix(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n", encoding="utf-8")
    with pytest.raises(DataValidationError, match="unsupported data file type"):
        load_records(str(path))


def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    records = load_records(str(path))
    assert [r.data for r in records] == ROWS
    assert records[1].origin == f"{path}#1"


def test_directory_with_split_files(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "train.jsonl", ROWS)
    _write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    assert len(load_records(str(tmp_path))) == 3
    assert len(load_records(str(tmp_path), split="test")) == 1
    assert len(load_records(str(tmp_path), data_files="test.jsonl")) == 1
    with pytest.raises(DataValidationError, match="validation"):
        load_records(str(tmp_path), split="validation")


def test_saved_dataset_dir(tmp_path: Path) -> None:
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:2])})
    dd.save_to_disk(str(tmp_path / "dd"))
    records = load_records(str(tmp_path / "dd"), split="test")
    assert [r.data for r in records] == ROWS[:2]
    assert records[1].origin.endswith("[test]#1")
    with pytest.raises(DataValidationError, match="split 'dev' not found"):
        load_records(str(tmp_path / "dd"), split="dev")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    assert [r.data for r in load_records(str(tmp_path / "ds"))] == ROWS


def test_hub_failure_is_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def fail(*args: object, **kwargs: object) -> None:
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(DataValidationError, match="does not exist locally and could not be loaded from the hub"):
        load_records("someone/some-dataset")


def test_hub_success_origins(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    seen: dict[str, object] = {}

    def fake(name: str, config: str | None = None, **kwargs: object) -> datasets.Dataset:
        seen.update(name=name, config=config, **kwargs)
        return datasets.Dataset.from_list(ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    records = load_records("openai/gsm8k", split="train", config="main")
    assert seen["name"] == "openai/gsm8k" and seen["config"] == "main" and seen["split"] == "train"
    assert records[2].origin == "hub:openai/gsm8k[train]#2"


@pytest.mark.parametrize(("folder", "rows"), [("gsm8k", 7473), ("math", 7500)])
def test_real_data_loads_fast(folder: str, rows: int) -> None:
    path = SHARED_DATA / folder / "train.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not available")
    start = time.perf_counter()
    records = load_records(str(path))
    elapsed = time.perf_counter() - start
    assert len(records) == rows
    assert records[0].origin == f"{path}:1"
    assert elapsed < 5.0  # typically ~0.05 s; generous for shared cores


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_empty_file_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataValidationError) as err:
        load_records(str(path))
    assert str(err.value) == f"data file '{path}' holds no records (it is empty, or only blank lines)"


def test_empty_split_file_in_a_directory_and_empty_json_list_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(DataValidationError, match=rf"^data file '{tmp_path / 'test.jsonl'}' holds no records"):
        load_records(str(tmp_path), split="test")
    as_list = tmp_path / "rows.json"
    as_list.write_text("[]", encoding="utf-8")
    with pytest.raises(DataValidationError, match=rf"^data file '{as_list}' holds no records"):
        load_records(str(as_list))


def test_empty_hub_split_names_the_data_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list([]))
    with pytest.raises(DataValidationError) as err:
        load_records("someone/empty", split="train")
    assert str(err.value) == "data set 'hub:someone/empty[train]' holds no records (the split is empty)"

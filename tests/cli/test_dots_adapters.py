"""Offline DOTS adapters: a run records (prompt, success rate) pairs, ``lit-rlft dots-adapters`` trains on them,
and DOTSCallback loads the result."""

from __future__ import annotations

import json

import pytest

from lit_rlft.callbacks import DOTSCallback, SuccessRateRecorder
from lit_rlft.cli import main
from lit_rlft.cli.dots_adapters import main as dots_adapters_main
from lit_rlft.data.loading import DataValidationError
from lit_rlft.data.tasks import CountdownTask
from lit_rlft.models.tiny import TinyConfig, save_tiny_policy
from lit_rlft.selection.dots import load_predictor
from tests.conftest import TINY_SMALL, countdown_dm, tiny_module, tiny_trainer


def test_recorder_writes_one_row_per_fresh_group(tmp_path):
    path = tmp_path / "pairs.jsonl"
    module = tiny_module()
    tiny_trainer(tmp_path, max_steps=3, callbacks=[SuccessRateRecorder(str(path))]).fit(
        module, datamodule=countdown_dm(batch_size=4))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 12 and {r["step"] for r in rows} == {0, 1, 2}
    assert all(0 <= r["success_rate"] <= 1 and ">" in r["prompt"] for r in rows)


def test_dots_adapters_cli_trains_and_the_callback_loads_them(tmp_path):
    # Synthetic labels: difficulty grows with the number count (what the prompt text shows).
    pairs = tmp_path / "pairs.jsonl"
    records = CountdownTask(size=80, num_numbers=[2, 3, 4], seed=0).records()
    with pairs.open("w") as f:
        for r in records:
            rate = {2: 0.9, 3: 0.5, 4: 0.1}[r.data["difficulty"]]
            f.write(json.dumps({"prompt": r.data["prompt"], "success_rate": rate}) + "\n")
    model_dir = save_tiny_policy(tmp_path / "emb", TinyConfig(**TINY_SMALL))
    out = tmp_path / "adapters.pt"
    main(["dots-adapters", "--pairs", str(pairs), "--embedding-model", str(model_dir), "--out", str(out),
          "--steps", "30", "--reference-size", "16", "--cache-dir", str(tmp_path / "cache")])
    predictor, meta = load_predictor(out, return_meta=True)
    assert meta["num_prompts"] == len({r.data["prompt"] for r in records})
    assert -1 <= meta["pearson_after"] <= 1
    cb = DOTSCallback(adapters=str(out), embedding_model=str(model_dir), reference_size=8,
                      cache_dir=str(tmp_path / "cache"), online_steps_per_update=1)
    tiny_trainer(tmp_path, max_steps=1, callbacks=[cb]).fit(tiny_module(), datamodule=countdown_dm(batch_size=4))
    assert cb.strategy is not None


def test_bad_pairs_file_names_the_line(tmp_path, capsys):
    pairs = tmp_path / "bad.jsonl"
    pairs.write_text('{"prompt": "1 2>3=", "success_rate": 0.5}\n{"prompt": "x"}\n')
    with pytest.raises(DataValidationError, match="bad.jsonl:2"):
        dots_adapters_main(["--pairs", str(pairs), "--embedding-model", "x", "--out", str(tmp_path / "o.pt")])
    with pytest.raises(SystemExit) as exc:  # the command line: the same message, one line, status 2
        main(["dots-adapters", "--pairs", str(pairs), "--embedding-model", "x", "--out", str(tmp_path / "o.pt")])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (f"lit-rlft dots-adapters: error: {pairs}:2: needs 'prompt' and a numeric "
                                       "'success_rate' ('success_rate')\n")


def test_missing_pairs_file_is_one_line(tmp_path, capsys):
    missing = tmp_path / "none.jsonl"
    with pytest.raises(SystemExit) as exc:
        main(["dots-adapters", "--pairs", str(missing), "--embedding-model", "x", "--out", str(tmp_path / "o.pt")])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"lit-rlft dots-adapters: error: --pairs: {missing} does "
                                                        "not exist")

"""``benchmarks.study.passes``: selection's saving against passes over the pool, read from recorded studies. The
figures are checked against values computed by hand from small synthetic curves (no training here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.study import docs, passes
from benchmarks.study.config import SKEWED_POOL, StudyConfig
from lit_rlft.records.jsonio import write_json

ACC = "val/accuracy/learnable"


def _run(strategy: str, pool: int, seed: int, points: list[tuple[int, float]]) -> dict:
    curve = [{"step": i, "completions": c, "wall_s": 10.0 * i, ACC: a, "val/accuracy": a, "train_pool_reward": a}
             for i, (c, a) in enumerate(points)]
    return {"run": f"{strategy}-pool{pool}-seed{seed}", "strategy": strategy, "pool_size": pool, "seed": seed,
            "status": "ok", "curve": curve, "series": {}, "callbacks": []}


def _study(path: Path, cfg: StudyConfig, runs: list[dict], **extra) -> None:
    write_json(path, {"config": cfg.to_dict(), "warm_start": "tiny", "runs": runs, **extra})


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    balanced = StudyConfig(strategies=["uniform", "dps_c8"], seeds=[0, 1], pool_sizes=[4000])
    runs = [_run("uniform", 4000, 0, [(0, 0.1), (19200, 0.2), (38400, 0.30)]),
            _run("uniform", 4000, 1, [(0, 0.1), (19200, 0.2), (38400, 0.32)]),
            _run("dps_c8", 4000, 0, [(0, 0.1), (19200, 0.41), (38400, 0.40)]),
            _run("dps_c8", 4000, 1, [(0, 0.1), (19200, 0.41), (38400, 0.40)])]
    _study(tmp_path / "balanced_pool4000.json", balanced, runs)
    skewed = StudyConfig.skewed(strategies=["uniform", "greso"], seeds=[0, 1], pool_sizes=[200])
    runs = [_run("uniform", 200, s, [(0, 0.1), (38400, 0.25)]) for s in (0, 1)]
    runs += [_run("greso", 200, s, [(0, 0.1), (38400, 0.20)]) for s in (0, 1)]  # never reaches 0.25
    _study(tmp_path / "skewed_pool200.json", skewed, runs)
    return tmp_path


def test_each_setting_is_placed_by_its_passes_and_composition(recorded):
    rows = passes.settings(recorded)
    assert [(r["composition"], r["pool"], r["strategy"]) for r in rows] == [
        ("balanced", 4000, "uniform"), ("balanced", 4000, "dps_c8"), ("skewed", 200, "uniform"),
        ("skewed", 200, "greso")]
    assert rows[0]["passes"] == pytest.approx(38_400 / (8 * 4000)) and rows[2]["passes"] == pytest.approx(24.0)
    assert SKEWED_POOL["bucket_weights"] and passes.composition(StudyConfig()) == "balanced"


def test_the_saving_and_the_paired_difference_are_the_hand_computed_ones(recorded):
    dps = passes.settings(recorded)[1]
    # uniform's final accuracy: (0.30 + 0.32) / 2 = 0.31; DPS crosses it at 19,200 x 0.21 / 0.31 completions in both
    # seeds; by the one crossing rule over uniform's own crossing: seed 1 at 19,200 + 19,200 x 0.11 / 0.12 = 36,800,
    # seed 0 never (it ends at 0.30): the ratio rests on one seed pair
    ratio = dps["to_uniform"]
    assert ratio["ratio"] == pytest.approx(19_200 * 0.21 / 0.31 / 36_800)
    assert ratio["n_used"] == 1 and ratio["b_not_reached"] == 1
    assert passes._ratio(ratio) == "0.35x (1/2 seed pairs; baseline 1 never)"
    assert dps["diff"]["mean"] == pytest.approx(((0.40 - 0.30) + (0.40 - 0.32)) / 2)
    greso = passes.settings(recorded)[3]
    assert greso["to_uniform"]["ratio"] is None and greso["to_uniform"]["a_not_reached"] == 2
    table = "\n".join(passes.table_lines(passes.settings(recorded)))
    assert "| balanced 4,000 | 1.2 | dps_c8 | 2 | 0.400 |" in table
    assert "never (2/2 seeds)" in table and "| skewed 200 | 24.0 | greso | 2 | 0.200 | **-0.050 [" in table


def test_the_figure_is_drawn_and_the_block_is_one_of_the_pages_generated_blocks(recorded, tmp_path):
    figure = passes.plot(passes.settings(recorded), tmp_path / "fig.png")
    assert figure.stat().st_size > 10_000
    rows = passes.settings(recorded)
    assert passes.block(recorded)[2 : 2 + len(rows) + 2] == passes.table_lines(rows)
    marks = "\n".join(passes.at_marks_lines(rows))
    # uniform's curve at 6,400 completions (interpolated): 0.1 + 0.1 x 6,400 / 19,200; DPS's 0.1 + 0.31 x 6,400 / 19,200
    d = 0.31 / 3 - 0.1 / 3  # the same in both seeds: no spread, said so
    assert f"| balanced 4,000 | 1.2 | dps_c8 | **{d:+.3f} (all 2 equal)** |" in marks
    assert len(passes.composition_lines(rows)) == 2 + len(rows)
    cfg, study = docs.load_study()
    assert "saving-vs-passes" in docs.blocks(cfg, study)


def test_an_empty_folder_is_an_error_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        passes.settings(tmp_path)


def test_a_finished_study_is_recorded_under_its_setting_and_reads_back_the_same(recorded, tmp_path):
    out = tmp_path / "again"
    path = passes.add(recorded / "skewed_pool200.json", out)
    assert path.name == "skewed_pool200.json"
    assert passes.settings(out) == [r for r in passes.settings(recorded) if r["pool"] == 200]
    with pytest.raises(FileNotFoundError, match="not a finished study"):
        passes.add(tmp_path / "missing.json", out)


LARGER = {"hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4,
          "intermediate_size": 1024}


def test_a_larger_policy_is_recorded_apart_and_set_beside_the_demo_policy(recorded, tmp_path):
    # the demo policy, counted by building it, against a count by hand:
    # embeddings 99 x 128 (96 printable characters and 3 specials; tied) + 4 layers x (attention 4 x 128 x 128 + biases 3 x 128 + MLP 3 x 128 x 512
    # + 2 norms x 128) + the final norm 128
    demo = passes.demo_policy()
    assert demo == {"hidden_size": 128, "num_hidden_layers": 4,
                    "parameters": 99 * 128 + 4 * (4 * 128 * 128 + 3 * 128 + 3 * 128 * 512 + 2 * 128) + 128}
    cfg = StudyConfig.skewed(strategies=["uniform", "greso"], seeds=[0, 1], pool_sizes=[200], tiny=LARGER)
    runs = [_run("uniform", 200, s, [(0, 0.1), (38400, 0.30)]) for s in (0, 1)]
    runs += [_run("greso", 200, s, [(0, 0.1), (19200, 0.40), (38400, 0.33 + 0.02 * s)]) for s in (0, 1)]
    _study(tmp_path / "larger.json", cfg, runs)
    path = passes.add(tmp_path / "larger.json", recorded)
    assert path.name == "skewed_pool200_h256l8.json"
    assert json.loads(path.read_text())["policy"]["parameters"] == pytest.approx(8.42e6, rel=1e-3)
    # the demo policy's block and the larger policy's are kept apart
    assert [r["file"] for r in passes.settings(recorded)].count(path.name) == 0
    larger = passes.settings(recorded, policy="larger")
    assert [r["strategy"] for r in larger] == ["uniform", "greso"]
    assert larger[1]["diff"]["mean"] == pytest.approx(0.04)  # (0.33 - 0.30 + 0.35 - 0.30) / 2
    lines = passes.policy_lines(recorded)
    table = [line for line in lines if line.startswith("| skewed 200 |") and " layers (" in line]
    # each larger-policy row under the demo policy's at the same setting: uniform, uniform, greso, greso
    assert [("(8.4M)" in line, "greso" in line) for line in table] == [
        (False, False), (True, False), (False, True), (True, True)]
    assert "+0.040" in table[3] and "-0.050" in table[2]  # 0.20 - 0.25 for the demo policy's GRESO
    assert len(passes.settings(recorded, policy=None)) == len(passes.settings(recorded)) + 2
    assert passes.plot(passes.settings(recorded, policy=None), tmp_path / "both.png").stat().st_size > 10_000
    assert docs.extra_blocks()["policy-size"] is passes.policy_lines


def test_a_study_whose_warm_start_is_not_here_cannot_be_recorded(recorded, tmp_path):
    cfg = StudyConfig.skewed(strategies=["uniform"], seeds=[0], pool_sizes=[200])
    _study(tmp_path / "elsewhere.json", cfg, [_run("uniform", 200, 0, [(0, 0.1), (38400, 0.3)])],
           warm_start=str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="gone.*no config.json"):
        passes.add(tmp_path / "elsewhere.json", tmp_path / "out")


def test_the_time_to_trl_tables_on_the_pages_are_generated_from_their_json(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n<!-- generated:time-to-trl-pool4000 -->\nold figures\n<!-- /generated:time-to-trl-pool4000 -->\n")
    assert any(str(page) in p for p in docs.check(pages=(page,)))
    text = docs.render(page.read_text(), docs.extra_blocks())
    recorded = json.loads(docs.TIME_TO_TRL["time-to-trl-pool4000"].read_text())
    trl = recorded["summary"]["strategies"]["trl"]["final"]["accuracy"]["mean"]
    assert f"against trl's {trl:.3f}" in text and "| uniform |" in text
    page.write_text(text)
    assert not [p for p in docs.check(pages=(page,)) if str(page) in p]

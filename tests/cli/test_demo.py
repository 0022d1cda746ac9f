"""The demo's comparison of its table with the README's recorded ones (one per kind of CPU)."""

from __future__ import annotations

import json

from lit_rlft.cli.demo import RECORDED, cpu_label, demo_table, recorded_match

AMD = {"cpu": "AMD EPYC", "cpu_vector_flags": ["avx", "avx2", "fma"], "cpu_capability": "AVX2"}
INTEL = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_vector_flags": ["avx2", "avx512f", "avx512bw"],
         "cpu_capability": "AVX512"}


def _report(warm_all: float, environment: dict) -> dict:
    before = {"val/accuracy": warm_all, "val/accuracy/difficulty_2": 0.78, "val/accuracy/difficulty_3": 0.316,
              "val/accuracy/difficulty_4": 0.001, "val/accuracy/learnable": 0.158}
    after = {"val/accuracy": 0.53, "val/accuracy/difficulty_2": 0.848, "val/accuracy/difficulty_3": 0.486,
             "val/accuracy/difficulty_4": 0.23, "val/accuracy/learnable": 0.357, "val/n/accuracy": 1800.0,
             "val/n/accuracy/difficulty_2": 633.0, "val/n/accuracy/difficulty_3": 581.0,
             "val/n/accuracy/difficulty_4": 586.0, "val/n/accuracy/learnable": 1167.0}
    return {"before": before, "after": after, "environment": environment}


def test_the_cpu_label_names_the_model_and_widest_vector_set():
    assert cpu_label(AMD) == "AMD EPYC, AVX2"
    assert cpu_label(INTEL) == "Intel(R) Xeon(R) Processor, AVX-512"
    assert cpu_label({"cpu_vector_flags": ["sse2"]}) == "unknown CPU, no AVX2"
    assert cpu_label({"cpu": "AMD EPYC"}) == "AMD EPYC, vector sets not recorded"


def test_a_table_equal_to_a_recorded_one_names_its_cpu_and_one_digit_off_names_both_machines(tmp_path):
    (tmp_path / "demo_report.json").write_text(json.dumps(_report(0.377, AMD)))
    (tmp_path / "demo_report_avx512.json").write_text(json.dumps(_report(0.390, INTEL)))
    ours = _report(0.390, INTEL)
    line = recorded_match(demo_table(ours["before"], ours["after"]), INTEL, tmp_path)
    assert line == ("This table is the README's recorded on Intel(R) Xeon(R) Processor, AVX-512 "
                    "(demo_report_avx512.json), to the digit.")
    off = _report(0.391, INTEL)  # one digit off in the warm start's "all"
    line = recorded_match(demo_table(off["before"], off["after"]), AMD, tmp_path)
    assert line.startswith("This table differs from the README's recorded ones (AMD EPYC, AVX2; "
                           "Intel(R) Xeon(R) Processor, AVX-512); this machine: AMD EPYC, AVX2, torch kernels AVX2.")


def test_no_recorded_report_means_no_line(tmp_path):
    assert recorded_match(["| anything |"], AMD, tmp_path) is None


def test_the_clones_recorded_reports_are_the_readmes_and_differ():
    """The README's tables come from these files (``benchmarks.study.docs``); the recorded CPUs differ and so do the
    tables: the reason there are two."""
    reports = {p.name: json.loads(p.read_text()) for p in sorted(RECORDED.glob("demo_report*.json"))}
    assert set(reports) == {"demo_report.json", "demo_report_avx512.json"}
    tables = {name: tuple(demo_table(r["before"], r["after"])) for name, r in reports.items()}
    assert len(set(tables.values())) == 2
    assert cpu_label(reports["demo_report.json"]["environment"]) == "AMD EPYC, AVX2"
    assert cpu_label(reports["demo_report_avx512.json"]["environment"]) == "Intel(R) Xeon(R) Processor, AVX-512"


def test_the_verdict_checks_the_goal_and_the_recorded_spread_not_the_digits(tmp_path):
    from lit_rlft.cli.demo import demo_verdict

    (tmp_path / "demo_report.json").write_text(json.dumps(_report(0.377, AMD)))  # learnable 0.158 -> 0.357
    high = _report(0.390, INTEL)
    high["after"]["val/accuracy/learnable"] = 0.367
    (tmp_path / "demo_report_avx512.json").write_text(json.dumps(high))
    # another machine's digits (the AMD EPYC): 0.506 / 0.210 on 3 / 4 numbers, easy 0.848 -> 0.850
    ours = _report(0.377, AMD)
    ours["after"].update({"val/accuracy/learnable": (0.506 * 581 + 0.210 * 586) / 1167, "val/accuracy/difficulty_2": 0.850})
    lines = demo_verdict(ours["before"], ours["after"], tmp_path)
    assert lines[0] == ("Goal met: the learnable part gained +0.199 (goal at least +0.15) and the easy bucket moved "
                        "+0.070 (no loss beyond 0.015).")
    assert lines[1] == ("After GRPO the learnable part is 0.357: within the 2 recorded machines' 0.357-0.367 (gains "
                        "+0.199 to +0.209), give or take the evaluation's 0.015.")
    ours["after"]["val/accuracy/difficulty_2"] = 0.76  # a loss on the easy bucket beyond the noise: not met
    ours["after"]["val/accuracy/learnable"] = 0.30
    lines = demo_verdict(ours["before"], ours["after"], tmp_path)
    assert lines[0].startswith("Goal NOT met: the learnable part gained +0.142") and "outside" in lines[1]

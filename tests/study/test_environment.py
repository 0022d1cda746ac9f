"""Results record their environment: :func:`~lit_rlft.records.jsonio.write_result` writes the data plus the package
versions, torch's threads, the CPU and the commit; a caller's own environment is kept; a benchmark's result written
through it carries the environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from importlib import metadata

import pytest
import torch

from lit_rlft.records.jsonio import write_result
from tests.conftest import REPO


def _head() -> str | None:
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


@pytest.fixture
def three_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not the default here: the record must read it at the call
    yield 3
    torch.set_num_threads(before)


def test_write_result_writes_the_data_and_the_environment(tmp_path, three_threads):
    data = {"median_s": 0.5, "rows": [1, 2], "nan": float("nan")}
    path = write_result(tmp_path / "sub" / "result.json", data)
    assert path == tmp_path / "sub" / "result.json"
    written = json.loads(path.read_text())
    assert {k: written[k] for k in data} == {"median_s": 0.5, "rows": [1, 2], "nan": None}
    assert "environment" not in data  # the caller's dict is left as it was
    env = written["environment"]
    assert env["packages"]["torch"] == metadata.version("torch")
    assert env["packages"]["transformers"] == metadata.version("transformers")
    assert env["packages"]["lightning"] == metadata.version("lightning")
    assert env["torch_threads"] == torch.get_num_threads() == three_threads
    assert env["cpu_count"] == os.cpu_count()
    assert env["cpu"]  # the model name (or the processor) of this machine
    head = _head()
    if head is None:
        pytest.skip("not a git checkout (or no git): no commit to compare")
    assert env["commit"]["sha"] == head
    assert isinstance(env["commit"]["dirty"], bool)


def test_write_result_records_the_packages_asked_for(tmp_path):
    env = json.loads(write_result(tmp_path / "r.json", {}, packages=("torch", "no-such-dist")).read_text())
    assert env["environment"]["packages"] == {"torch": metadata.version("torch"), "no-such-dist": None}


def test_a_callers_environment_is_kept(tmp_path):
    given = {"packages": {"torch": "0.0-measured-elsewhere"}, "cpu": "the measuring machine"}
    written = json.loads(write_result(tmp_path / "r.json", {"x": 1, "environment": given}).read_text())
    assert written == {"x": 1, "environment": given}
    # also a null one: the key is the caller's, whatever it holds
    assert json.loads(write_result(tmp_path / "n.json", {"environment": None}).read_text()) == {"environment": None}


def _run_record(folder, strategy, seed, accuracies):
    curve = [{"completions": 100 * i, "wall_s": 10.0 * i, "eval_s": 1.0, "val/accuracy/learnable": acc}
             for i, acc in enumerate(accuracies)]
    path = folder / "runs" / f"{strategy}-seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": "ok", "strategy": strategy, "seed": seed, "curve": curve}))


def test_a_benchmarks_result_records_the_environment(tmp_path, capsys):
    """``benchmarks/async_study.py`` (an analysis of two finished studies, nothing measured) writes its report
    through :func:`write_result`."""
    from benchmarks import async_study

    depth0, depth1 = tmp_path / "depth0", tmp_path / "depth1"
    for seed in (0, 1):
        _run_record(depth0, "uniform", seed, [0.1, 0.2, 0.3])
        _run_record(depth1, "uniform", seed, [0.1, 0.25, 0.35])
    out = tmp_path / "report.json"
    async_study.main([str(depth0), str(depth1), "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["uniform"]["seeds"] == [0, 1]
    assert report["uniform"]["paired_diff"] == pytest.approx([0.05, 0.05])
    env = report["environment"]
    assert env["packages"]["torch"] == metadata.version("torch")
    assert env["cpu_count"] == os.cpu_count()
    assert env["torch_threads"] == torch.get_num_threads()


def test_the_record_names_the_cpu_kernels_in_use():
    """The kernel set torch runs (the last bits of a result depend on it) is read at the call: forced to the
    portable kernels in a child process, the record says so and keeps the variable that forced it."""
    import subprocess
    import sys

    code = ("import json, torch; from lit_rlft.records.environment import environment; e = environment(('torch',)); "
            "print(json.dumps([e['cpu_capability'], e['kernel_env'], e['cpu_vector_flags']]))")
    forced = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                            env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    capability, kernel_env, flags = json.loads(forced.stdout.splitlines()[-1])
    assert capability == "DEFAULT"
    assert kernel_env["ATEN_CPU_CAPABILITY"] == "default"
    from lit_rlft.records.environment import environment

    here = environment(("torch",))
    assert here["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert here["cpu_vector_flags"] == flags  # the machine's instruction sets, whatever torch was told to use
    if here["cpu_capability"] == "AVX2":
        assert "avx2" in flags

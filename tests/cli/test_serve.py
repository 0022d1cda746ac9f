"""``lit-rlft serve``: a clear error where vLLM is missing; with vLLM (``make test-vllm``), a server that answers, is
reported with its URL and pid, and ends with the command (Ctrl-C)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from lit_rlft.cli import main
from tests.conftest import REPO

HAS_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("LIT_RLFT_REQUIRE_VLLM") == "1"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_serve_without_vllm_names_the_environment_that_has_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("lit-rlft serve: error: vLLM is not importable in this environment")
    assert ".venv-vllm/bin/lit-rlft serve" in err and "make vllm-env" in err


def test_serve_refuses_a_folder_that_is_not_a_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # as if vLLM were there
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", str(tmp_path)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"--model: {tmp_path} is not an HF model folder (no config.json)")


def test_serve_on_an_address_other_machines_reach_refuses_without_both_secrets(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("LIT_RLFT_SYNC_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--model", str(tmp_path), "--host", "0.0.0.0", "--api-key", "k"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("lit-rlft serve: error: --host 0.0.0.0 is not a loopback address: every machine that reaches the "
                   "port could generate, and call the weight-sync routes, so a server there needs a sync token "
                   "(--sync-token or LIT_RLFT_SYNC_TOKEN)")
    monkeypatch.setenv("LIT_RLFT_SYNC_TOKEN", "t")  # both given (one from the environment): on to the next check
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(SystemExit):
        main(["serve", "--model", str(tmp_path), "--host", "0.0.0.0", "--api-key", "k"])
    assert "is not an HF model folder" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM and not REQUIRED, reason="vLLM is not installed (make test-vllm)")
def test_serve_starts_a_server_and_stops_it_on_ctrl_c(tmp_path):
    import psutil

    from lit_rlft.models.tiny import save_tiny_policy

    model = save_tiny_policy(tmp_path / "model")
    env = {**os.environ, "LIT_RLFT_SYNC_TOKEN": "a-token"}
    cli = subprocess.Popen(
        [sys.executable, "-m", "lit_rlft.cli", "serve", "--model", str(model), "--port", "0", "--dtype", "float32",
         "--log", str(tmp_path / "server.log"), "--kv-cache-memory-bytes", str(32 * 2**20), "--", "--max-model-len",
         "128"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = cli.stdout.readline()  # printed once /health answers
        match = re.match(r"lit-rlft serve: (http://127\.0\.0\.1:\d+) \(pid (\d+)", line)
        assert match, (line, cli.stderr.read() if cli.poll() is not None else "")
        url, pid = match.group(1), int(match.group(2))
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            assert r.status == 200
        assert "--max-model-len" in psutil.Process(pid).cmdline()  # the arguments after -- reach vLLM
        cli.send_signal(signal.SIGINT)
        assert cli.wait(60) == 0
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the server outlived lit-rlft serve"
            time.sleep(0.2)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait(10)

"""VLLMServer without vLLM: the command and environment it builds, its start-up failures (reported with the log's
tail, within the deadline, nothing left running) and its stop. The servers themselves run in
``test_servers_sync.py`` (``make test-vllm``)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from lit_rlft.rollout.servers.launcher import EXTENSION, ServerStartError, VLLMServer
from lit_rlft.runtime.processes import watched_groups


def _model(tmp_path, positions: int = 8192):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
    return tmp_path


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_command_has_the_flags_lit_rlft_needs_and_keeps_secrets_off_it(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    server = VLLMServer(_model(tmp_path), port=8123, api_key="key", sync_token="tok", dtype="float32",
                        sync_rendezvous="127.0.0.1:29600", cpu_threads_bind="1", extra_args=["--max-num-seqs", "8"])
    cmd, env = server.command(), server.environment()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert _flag(cmd, "--host") == "127.0.0.1" and _flag(cmd, "--port") == "8123" and server.url == \
        "http://127.0.0.1:8123"
    assert _flag(cmd, "--worker-extension-cls") == EXTENSION
    assert _flag(cmd, "--middleware") == "lit_rlft.rollout.servers.route_guard.RouteGuard"  # every route keyed
    assert _flag(cmd, "--logprobs-mode") == "processed_logprobs" and "--enable-scale-out" in cmd
    assert {"--enforce-eager", "--no-enable-chunked-prefill"} <= set(cmd)
    assert _flag(cmd, "--max-num-batched-tokens") == "8192"  # a whole prompt of the model's length per step
    assert cmd[-2:] == ["--max-num-seqs", "8"] and "--enable-lora" not in cmd
    assert "key" not in cmd and "tok" not in cmd  # in the environment, not in `ps`
    assert env["VLLM_API_KEY"] == "key" and env["LIT_RLFT_SYNC_TOKEN"] == "tok"
    assert env["LIT_RLFT_SYNC_RENDEZVOUS"] == "127.0.0.1:29600" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and "VLLM_CPU_KVCACHE_SPACE" not in env
    lora = VLLMServer(_model(tmp_path), lora_rank=4, max_model_len=512, device="cuda")
    cmd, env = lora.command(), lora.environment()
    assert _flag(cmd, "--max-lora-rank") == "8" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert "--gpu-memory-utilization" in cmd and "--kv-cache-memory-bytes" not in cmd
    assert len(lora.sync_token) >= 32 and lora.sync_token != VLLMServer(tmp_path).sync_token  # random by default


@pytest.mark.parametrize(("kwargs", "match"), [({"device": "tpu"}, "device"), ({"lora_rank": 1000}, "lora_rank"),
                                               ({"sync_rendezvous": "nohost"}, "host:port"),
                                               ({"extra_args": ["--api-key", "k"]}, "give the API key as api_key"),
                                               ({"extra_args": ["--api-key=k"]}, "give the API key as api_key")])
def test_bad_arguments_name_the_option(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        VLLMServer(tmp_path, **kwargs)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gpu-node-7"])
def test_a_server_other_machines_can_reach_needs_both_secrets(tmp_path, host):
    with pytest.raises(ValueError, match=f"--host {host} is not a loopback address.*needs an API key \\(--api-key or "
                                         "VLLM_API_KEY\\) and a sync token \\(--sync-token or LIT_RLFT_SYNC_TOKEN\\)"):
        VLLMServer(tmp_path, host=host)
    with pytest.raises(ValueError, match="needs a sync token"):
        VLLMServer(tmp_path, host=host, api_key="key")
    with pytest.raises(ValueError, match="needs an API key"):
        VLLMServer(tmp_path, host=host, sync_token="tok")
    assert VLLMServer(tmp_path, host=host, api_key="key", sync_token="tok").host == host
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert VLLMServer(tmp_path, host=loopback).api_key is None  # this machine only: no secret needed


def test_a_server_that_exits_or_never_answers_is_reported_with_its_log_and_stopped(tmp_path):
    script = tmp_path / "fake_vllm.py"
    script.write_text("import sys, time\nprint('fake vLLM: cannot load the model', flush=True)\n"
                      "time.sleep(float(sys.argv[1]))\n")
    exits = VLLMServer(tmp_path, port=0, start_timeout_s=30)
    exits.command = lambda: [sys.executable, str(script), "0"]  # ends at once
    start = time.monotonic()
    with pytest.raises(ServerStartError, match="(?s)exited with status 0 before answering /health.*cannot load"):
        exits.start()
    assert time.monotonic() - start < 10 and exits.process is None
    hangs = VLLMServer(tmp_path, port=0, start_timeout_s=2)
    hangs.command = lambda: [sys.executable, str(script), "60"]  # never answers
    with pytest.raises(ServerStartError, match="(?s)did not answer /health within 2 s.*cannot load the model"):
        hangs.start()
    assert hangs.process is None and os.path.exists(hangs.log_path)  # kept: the error names it
    assert not watched_groups() & {exits.pid, hangs.pid} - {None}

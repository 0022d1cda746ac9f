"""WeightSync against stand-in servers (``weight_server_stub.py``: real processes answering WeightSync's HTTP calls with
lit_rlft's worker extension, without vLLM): the group, the byte layout, changed-only pushes, failures and refusals.

Every test is bounded: the trainer's ``timeout_s`` is 10 s, and the stand-ins are killed by their process group.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from lit_rlft.models.export import hf_weights
from lit_rlft.rollout.servers.vllm_extension import complete_tied, write_adapter
from lit_rlft.rollout.servers.weight_group import (
    RENDEZVOUS_ENV,
    SyncRefused,
    check_rendezvous,
    check_token,
    dtype_name,
    pack_chunks,
    plan_layout,
    unpack,
)
from lit_rlft.rollout.servers.weight_sync import LORA_NAME, WeightSync, WeightSyncError, sync_unit
from lit_rlft.runtime.processes import kill_group, watch_group
from tests.conftest import REPO

TOKEN, KEY = "the-sync-token", "the-api-key"
TIMEOUT_S = 10.0
BUCKET = 16 * 2**10  # the tiny policy below is ~190 KB: a dozen chunks


class Stub:
    """A stand-in server process (its own session, watched by the reaper, killed at the end); :meth:`ready` waits
    for its port (start several, then wait: they import torch in parallel)."""

    def __init__(self, **env: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.rollout.servers.weight_server_stub"], cwd=REPO, stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
            env={**os.environ, "LIT_RLFT_SYNC_TOKEN": TOKEN, "VLLM_API_KEY": KEY, **env})
        watch_group(self.process.pid)

    def ready(self) -> Stub:
        line = self.process.stdout.readline()
        assert line.startswith("PORT "), line
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.where = f"127.0.0.1:{self.port}"
        return self

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/state", timeout=10) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict) -> None:
        req = urllib.request.Request(f"{self.url}{path}", json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()

    def stop(self) -> None:
        kill_group(self.process.pid)
        self.process.wait(10)


@pytest.fixture(scope="module")
def all_stubs():
    """Every stand-in the module needs, started at once: two shared ones and one for each test that spends one
    (killed, stopped, fresh, pinned to another rendezvous)."""
    started = {name: Stub() for name in ("a", "b", "doomed", "stalled", "fresh")}
    started["pinned"] = Stub(**{RENDEZVOUS_ENV: "127.0.0.1:9"})
    try:
        yield {name: stub.ready() for name, stub in started.items()}
    finally:
        for stub in started.values():
            stub.stop()


@pytest.fixture
def stubs(all_stubs):
    return [all_stubs["a"], all_stubs["b"]]


def _sync(stubs, **kwargs) -> WeightSync:
    kwargs = {"api_key": KEY, "timeout_s": TIMEOUT_S, "bucket_bytes": BUCKET, **kwargs}
    return WeightSync([s.url for s in stubs], "127.0.0.1:0", kwargs.pop("token", TOKEN), **kwargs)


def _policy():
    from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2

    torch.manual_seed(0)
    return tiny_qwen2(char_tokenizer(), TinyConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=1,
                                                   num_key_value_heads=1, intermediate_size=128, head_dim=64))


def _digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(data.data, digest_size=16).hexdigest()


def _digests(named) -> dict[str, str]:
    return {n: _digest(t) for n, t in named}


def _bytes(named) -> int:
    return sum(t.numel() * t.element_size() for _, t in named)


# -- the byte layout (no processes) ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bucket_bytes", [64, 100, 1000, 2**20])
def test_the_layout_round_trips_any_dtype_shape_and_bucket_size(bucket_bytes):
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 5, generator=g), torch.randint(0, 9, (7,), generator=g), torch.zeros(0),
               torch.randn(3, generator=g).bfloat16(), torch.randn(40, 3, generator=g).t(), torch.tensor(2.5),
               torch.tensor([True, False, True])]
    dtypes, shapes = [dtype_name(t.dtype) for t in tensors], [list(t.shape) for t in tensors]
    layout = plan_layout(dtypes, shapes, bucket_bytes)
    assert all(off % 64 == 0 for off in layout.offsets) and layout.chunk_bytes <= bucket_bytes
    stream = torch.cat([chunk.clone() for chunk in pack_chunks(tensors, layout)])
    assert stream.numel() == layout.total
    assert all(torch.equal(a, b) for a, b in zip(tensors, unpack(stream, layout, dtypes, shapes)))
    with pytest.raises(ValueError, match="layout"):
        list(pack_chunks(tensors[:-1] + [torch.zeros(5)], layout))


def test_sync_units_are_whole_vllm_layers_and_the_tied_embeddings():
    assert sync_unit("model.layers.3.self_attn.q_proj.weight") == sync_unit("model.layers.3.mlp.up_proj.weight") \
        == "model.layers.3"
    assert sync_unit("model.layers.30.input_layernorm.weight") == "model.layers.30"
    assert sync_unit("lm_head.weight") == sync_unit("model.embed_tokens.weight")
    assert sync_unit("model.norm.weight") == "model.norm"


def test_the_token_and_the_pinned_rendezvous_are_checked(monkeypatch):
    monkeypatch.delenv("LIT_RLFT_SYNC_TOKEN", raising=False)
    with pytest.raises(SyncRefused, match="is not set"):
        check_token("anything")
    monkeypatch.setenv("LIT_RLFT_SYNC_TOKEN", "right")
    check_token("right")
    for wrong in ("wrong", "", None, "righ", "right "):
        with pytest.raises(SyncRefused, match="wrong or missing token"):
            check_token(wrong)
    monkeypatch.setenv(RENDEZVOUS_ENV, "10.0.0.1:29600")
    assert check_rendezvous("10.0.0.1:29600") == ("10.0.0.1", 29600)
    with pytest.raises(SyncRefused, match="joins only 10.0.0.1:29600"):
        check_rendezvous("10.0.0.2:29600")


def test_tied_names_are_completed_and_adapter_folders_are_new_per_version(tmp_path):
    embed = torch.ones(2)
    assert [n for n, _ in complete_tied([("model.embed_tokens.weight", embed)], tied=True)] == [
        "model.embed_tokens.weight", "lm_head.weight"]
    assert [n for n, _ in complete_tied([("lm_head.weight", embed)], tied=True)] == [
        "lm_head.weight", "model.embed_tokens.weight"]
    assert len(complete_tied([("model.embed_tokens.weight", embed)], tied=False)) == 1
    stream = torch.arange(8.0)
    paths = [write_adapter(tmp_path, str(v), [("a", stream[:4]), ("b", stream[4:])], {"r": v}) for v in range(3)]
    assert len(set(paths)) == 3 and sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths[1:])
    assert json.loads(Path(paths[2], "adapter_config.json").read_text()) == {"r": 2}


# -- two processes ----------------------------------------------------------------------------------------------------
def test_a_push_arrives_bit_identical_through_several_buckets(stubs):
    named = list(hf_weights(_policy()))
    with _sync(stubs) as sync:
        sync.connect()
        stats = sync.sync_weights(named, version=1)
        assert stats.full and stats.tensors == len(named) and stats.bytes == _bytes(named)
        assert stats.bytes > 8 * BUCKET  # several chunks
        for stub in stubs:
            state = stub.state()
            assert state["digests"] == _digests(named)  # bit-identical, lm_head included
            assert state["version"] == "1" and not state["paused"]
            assert state["calls"][-4:] == ["/pause", "rpc:lit_update_weights", "/update_weight_version", "/resume"]


def test_changed_only_sends_exactly_the_changed_whole_layers(stubs):
    policy = _policy()
    names = [n for n, _ in hf_weights(policy)]
    with _sync(stubs) as sync:
        sync.connect()
        assert sync.sync_weights(hf_weights(policy), version=1).full
        with torch.no_grad():
            policy.model.layers[1].self_attn.q_proj.weight.add_(0.5)  # one tensor of layer 1
        stats = sync.sync_weights(hf_weights(policy), version=2)
        layer1 = [n for n in names if n.startswith("model.layers.1.")]
        assert not stats.full and stats.tensors == len(layer1)
        assert stats.bytes == _bytes([(n, t) for n, t in hf_weights(policy) if n in layer1])
        for stub in stubs:
            state = stub.state()
            assert state["loads"][-1] == layer1  # the whole layer: q, k, v of the fused qkv and all the rest
            assert state["digests"] == _digests(hf_weights(policy)) and state["version"] == "2"
        with torch.no_grad():
            policy.model.embed_tokens.weight.mul_(2.0)  # tied: lm_head goes with it
        stats = sync.sync_weights(hf_weights(policy), version=3)
        assert stats.tensors == 2 and stubs[0].state()["loads"][-1] == ["model.embed_tokens.weight", "lm_head.weight"]
        calls = len(stubs[0].state()["calls"])
        stats = sync.sync_weights(hf_weights(policy), version=4)  # nothing changed: the version only
        assert (stats.tensors, stats.bytes) == (0, 0)
        state = stubs[0].state()
        assert state["version"] == "4" and state["calls"][calls:] == ["/update_weight_version"]
        assert sync.sync_weights(hf_weights(policy), version=5, full=True).tensors == len(names)


def test_an_untied_output_layer_still_travels_with_the_embeddings(stubs):
    """A function of the weights is read twice (digests, then sending), holding one tensor at a time."""
    g = torch.Generator().manual_seed(3)
    weights = {"model.embed_tokens.weight": torch.randn(10, 4, generator=g), "model.norm.weight": torch.ones(4),
               "lm_head.weight": torch.randn(10, 4, generator=g)}
    reads = []

    def named():
        reads.append(1)
        return iter(list(weights.items()))

    with _sync(stubs[:1]) as sync:
        sync.connect()
        sync.sync_weights(named, version=1)
        weights["lm_head.weight"] = weights["lm_head.weight"] + 1
        stats = sync.sync_weights(named, version=2)
        assert stats.tensors == 2 and stubs[0].state()["loads"][-1] == ["model.embed_tokens.weight", "lm_head.weight"]
        held = stubs[0].state()["digests"]
        assert len(reads) == 4 and {n: held[n] for n in weights} == _digests(weights.items())


def test_a_server_that_dies_mid_push_ends_the_push_within_the_timeout(stubs, all_stubs):
    doomed = all_stubs["doomed"]
    named = list(hf_weights(_policy()))
    with _sync([stubs[0], doomed]) as sync:
        sync.connect()
        doomed.post("/control", {"die_after_chunks": 2})
        start = time.monotonic()
        with pytest.raises(WeightSyncError) as err:
            sync.sync_weights(named, version=7)
        assert time.monotonic() - start < TIMEOUT_S
        assert err.value.server == doomed.where and doomed.where in str(err.value)
        assert "weights version 7" in str(err.value) and not sync.connected
        assert doomed.process.wait(10) == 17
        with pytest.raises(WeightSyncError, match="not connected"):
            sync.sync_weights(named, version=8)
        # the group re-formed with fewer members; the first push after a failure is full
        sync.connect([stubs[0].url])
        stats = sync.sync_weights(named, version=8)
        assert stats.full and stubs[0].state()["digests"] == _digests(named)
        assert stubs[0].state()["version"] == "8" and not stubs[0].state()["paused"]


def test_a_stopped_server_ends_the_push_within_the_timeout(stubs, all_stubs):
    """SIGSTOP: the server neither answers nor receives; the push ends within the timeout, naming it, whether it
    stopped before the push (its /pause times out) or in the middle of the broadcast (the collective times out and
    the one server of the group that does not answer /health is named)."""
    stalled = all_stubs["stalled"]
    named = list(hf_weights(_policy()))
    for when in ("before", "during"):
        with _sync([stubs[0], stalled], timeout_s=2.0) as sync:
            sync.connect()
            if when == "before":
                os.killpg(stalled.process.pid, signal.SIGSTOP)
            else:
                stalled.post("/control", {"stop_after_chunks": 3})
            start = time.monotonic()
            try:
                with pytest.raises(WeightSyncError) as err:
                    sync.sync_weights(named, version=3)
                assert time.monotonic() - start < 3 * 2.0 + 2
                assert err.value.server == stalled.where and "did not answer" in str(err.value)
                assert ("/pause" in str(err.value)) == (when == "before")
            finally:
                os.killpg(stalled.process.pid, signal.SIGCONT)


def test_digests_survive_a_reformed_group_only_for_the_same_server_processes(stubs, all_stubs):
    policy = _policy()
    with _sync(stubs) as sync:
        sync.connect()
        sync.sync_weights(hf_weights(policy), version=1)
        generation = sync.generation
        sync.connect([stubs[0].url])  # a server dropped: the one left holds the last push
        assert sync.generation == generation + 1
        with torch.no_grad():
            policy.model.layers[0].mlp.down_proj.weight.add_(1.0)
        assert not sync.sync_weights(hf_weights(policy), version=2).full
        fresh = all_stubs["fresh"]  # as a restarted server: another process, which starts from its checkpoint
        sync.connect([stubs[0].url, fresh.url])
        stats = sync.sync_weights(hf_weights(policy), version=3)
        assert stats.full and fresh.state()["digests"] == _digests(hf_weights(policy))


def test_a_wrong_token_or_another_rendezvous_is_refused_at_once(stubs, all_stubs):
    start = time.monotonic()
    with _sync(stubs[:1], token="not-the-token") as sync, pytest.raises(WeightSyncError) as err:
        sync.connect()
    assert err.value.server == stubs[0].where and "wrong or missing token" in str(err.value)
    assert err.value.kind == "refused" and time.monotonic() - start < TIMEOUT_S / 2
    with _sync([all_stubs["pinned"]]) as sync, pytest.raises(WeightSyncError, match="joins only 127.0.0.1:9"):
        sync.connect()
    named = list(hf_weights(_policy()))
    with _sync(stubs[:1]) as sync:
        sync.connect()
        sync.sync_weights(named, version=1)
        before = stubs[0].state()["digests"]
        sync.token = "not-the-token"  # an update with the wrong token: refused before anything is received
        start = time.monotonic()
        with torch.no_grad(), pytest.raises(WeightSyncError, match="wrong or missing token"):
            sync.sync_weights([(n, t + 1) for n, t in named], version=2)
        assert time.monotonic() - start < TIMEOUT_S / 2
        state = stubs[0].state()
        assert state["digests"] == before and state["version"] == "1" and not state["paused"]


def test_an_adapter_push_writes_a_new_peft_folder_per_version_and_loads_it(stubs):
    g = torch.Generator().manual_seed(0)
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    with _sync(stubs) as sync:
        sync.connect()
        for version in (1, 2):
            adapter = {f"base_model.model.model.layers.0.self_attn.{m}.lora_{ab}.weight":
                       torch.randn(*((4, 64) if ab == "A" else (64, 4)), generator=g)
                       for m in ("q_proj", "v_proj") for ab in "AB"}
            stats = sync.sync_adapter(adapter, config, version=version)
            assert stats.tensors == 4 and stats.bytes == _bytes(adapter.items()) and stats.lora_name == LORA_NAME
        paths = sync.adapter_paths
        assert len(paths) == 2 and paths[0] != paths[1]
    from safetensors.torch import load_file

    for stub, path in zip(stubs, paths):
        state = stub.state()
        assert [a["lora_name"] for a in state["adapters"]] == [LORA_NAME, LORA_NAME]
        assert state["adapters"][-1] == {"lora_name": LORA_NAME, "lora_path": path, "load_inplace": True}
        assert state["adapters"][0]["lora_path"] != path and state["version"] == "2"
        assert json.loads(Path(path, "adapter_config.json").read_text()) == config
        assert _digests(load_file(os.path.join(path, "adapter_model.safetensors")).items()) == _digests(adapter.items())

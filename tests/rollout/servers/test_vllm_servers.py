"""The rollout side on real vLLM servers (``make test-vllm``; skipped where vLLM is absent): two servers started once
for the module, on 127.0.0.1, fed and synced by :class:`ServerEngine` through the step.

- Same seeds, the same completions and log-probs as the colocated ``VLLMEngine`` on the same (pushed) weights, on one
  server and split over two.
- A resumed run at depth 1 with servers trains its ledger first and loses no prompt (the ledger compared).
- A server killed with SIGKILL mid-run is named, its prompts go to the other, it is dropped from the weight-sync
  group, and the run goes on (last: it leaves one server).
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlft import build_step
from lit_rlft.callbacks import DPSCallback
from lit_rlft.models.export import save_hf_checkpoint
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from lit_rlft.rollout import ServerEngine, ServerRollouts
from lit_rlft.rollout.engines.base import SamplingConfig
from lit_rlft.runtime.processes import kill_group
from lit_rlft.step import TorchBackend, train
from lit_rlft.step.optim import configure_adamw
from tests.conftest import TINY_SMALL, countdown_dm, tiny_config, tiny_module, tiny_trainer
from tests.step.test_grpo_step import Trained

HAS_VLLM = importlib.util.find_spec("vllm") is not None
REQUIRED = os.environ.get("LIT_RLFT_REQUIRE_VLLM") == "1"
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not HAS_VLLM and not REQUIRED, reason="vLLM is not installed (make test-vllm)")]

COIN = "tests.distributed.helpers.coin_reward"
TOKEN, KEY = "test-sync-token", "test-api-key"
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17, 18, 19]]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers of the tiny policy the tests train (hidden 64, one layer), sharing the sync token."""
    from lit_rlft.rollout.servers.launcher import VLLMServer

    folder = tmp_path_factory.mktemp("tiny_small_hf")
    tok = char_tokenizer()
    save_hf_checkpoint(tiny_qwen2(tok, TinyConfig(**TINY_SMALL)), str(folder))
    tok.save_pretrained(str(folder))
    started = [VLLMServer(folder, port=0, api_key=KEY, sync_token=TOKEN, dtype="float32", max_model_len=128,
                          kv_cache_memory_bytes=32 * 2**20, cpu_threads_bind=str(i)) for i in range(2)]
    try:
        for server in started:
            server.start(wait=False)
        for server in started:
            server.wait_ready(timeout_s=240)
        yield started
    finally:
        for server in started:
            server.stop()


def _engine(urls, **kw):
    return ServerEngine(urls, rendezvous="127.0.0.1:0", api_key=KEY, sync_token=TOKEN, timeout_s=120.0, **kw)


def test_server_rows_equal_the_colocated_engine_on_one_server_and_on_two(servers):
    from lit_rlft.rollout.engines.vllm import VLLMEngine

    tok = char_tokenizer()
    policy = tiny_qwen2(tok, TinyConfig(**TINY_SMALL))
    with torch.no_grad():  # weights the servers do not have yet: only the push can make the rows equal
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)
    outs = []
    for urls in ([servers[0].url], [s.url for s in servers]):
        engine = _engine(urls)
        engine.setup(policy, tok)
        engine.sync_weights(policy, version=0)
        outs.append(engine.generate(PROMPTS, 3, sampling, seed=1234))
        assert outs[-1].versions == [0] * 12
        engine.close()
    local = VLLMEngine(dtype="float32", max_model_len=128, kv_cache_memory_bytes=32 * 2**20)
    local.setup(policy, tok)
    outs.append(local.generate(PROMPTS, 3, sampling, seed=1234))
    for out in outs[1:]:
        assert torch.equal(out.completion_ids, outs[0].completion_ids)
        assert torch.equal(out.completion_mask, outs[0].completion_mask)
        assert torch.equal(out.logprobs, outs[0].logprobs)  # bit for bit, float32 on the CPU
        assert out.finish_reasons == outs[0].finish_reasons


def test_a_resumed_run_at_depth_1_with_servers_trains_its_ledger_once(servers, tmp_path):
    urls = [servers[0].url]

    def fit(out, steps, ckpt_path=None, save=False):
        L.seed_everything(0, verbose=False)
        module = tiny_module(reward_funcs=[COIN], async_depth=1, engine=_engine(urls))
        trained = Trained()
        extra = [ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=2, save_top_k=-1)] if save else []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tiny_trainer(out, max_steps=steps, callbacks=[DPSCallback(), trained, *extra],
                         enable_checkpointing=save).fit(module, datamodule=countdown_dm(size=24, batch_size=4),
                                                        ckpt_path=ckpt_path)
        return trained.ids

    full = fit(tmp_path / "full", 4)
    first = fit(tmp_path / "first", 2, save=True)
    path = tmp_path / "first" / "ckpt" / "epoch=0-step=2.ckpt"
    ledger = torch.load(path, weights_only=True)["lit_rlft"]["async"]["ledger"]
    assert [index for index, _ in ledger] == [2] and sorted(ledger[0][1]) == sorted(full[2])
    resumed = fit(tmp_path / "resumed", 4, ckpt_path=str(path))
    assert first == full[:2]  # the same prompts, sampled on the server from the same pushed weights
    assert resumed[0] == ledger[0][1] and resumed == full[2:]  # the ledger first, nothing lost, nothing twice


def test_a_server_killed_mid_run_is_named_dropped_and_the_other_goes_on(servers):
    step = build_step(tiny_config(reward_funcs=[COIN], async_depth=1, engine=_engine([s.url for s in servers])))
    assert isinstance(step.source, ServerRollouts)
    data = countdown_dm(size=48, batch_size=4)
    data.setup("fit")
    step.bind(data)
    opt = configure_adamw(step.policy, step.optim, total_steps=100)
    backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    victim = servers[1]
    name = victim.url.removeprefix("http://")
    outs = []
    with pytest.warns(RuntimeWarning, match=rf"generation server failed: {name}"):
        for out in train(step, backend):
            outs.append(out)
            if len(outs) == 2:
                kill_group(victim.pid)  # the API server, its engine core and its worker
            if len(outs) == 5:
                break
    assert [o.metrics["servers/alive"] for o in outs] == [2.0, 2.0, 1.0, 1.0, 1.0]
    assert outs[-1].metrics["servers/dropped"] == 1.0
    assert all(torch.isfinite(torch.tensor(o.metrics["loss"])) for o in outs)
    assert [o.rollouts.birth_step.tolist() for o in outs] == [[0] * 4, [0] * 4, [1] * 4, [2] * 4, [3] * 4]

"""The rollout side of generation servers, on the CPU with stand-in servers (tests/rollout/servers/fake_servers.py; the real
vLLM servers and the weight sync are tested in the vLLM environment): whole groups split over the servers give the
one-server rows; a server that dies, hangs, answers garbage or answers from other weights is named, its prompts go to
the others and it is dropped, then taken back at a push once it answers again; with none left the run ends naming
them; the step runs at depth 0 and 1 through ServerRollouts, rows carrying the version the servers report, and a
resumed run at depth 1 trains its ledger once."""

from __future__ import annotations

import time
import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlft import build_step
from lit_rlft.callbacks import DPSCallback
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from lit_rlft.rollout import ServerEngine, ServerError, ServerRollouts
from lit_rlft.rollout.engines.base import SamplingConfig
from lit_rlft.step import TorchBackend, train
from lit_rlft.step.optim import configure_adamw
from tests.conftest import TINY_SMALL, countdown_dm, tiny_config, tiny_module, tiny_trainer
from tests.rollout.servers.fake_servers import FakeServers
from tests.step.test_grpo_step import Trained

COIN = "tests.distributed.helpers.coin_reward"
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14], [15, 16]]
SAMPLING = SamplingConfig(max_new_tokens=6)


@pytest.fixture
def policy():
    tok = char_tokenizer()
    return tiny_qwen2(tok, TinyConfig(**TINY_SMALL)), tok


def _engine(servers, policy, **kw) -> ServerEngine:
    model, tok = policy
    engine = ServerEngine(servers.urls, timeout_s=kw.pop("timeout_s", 10.0), **kw)
    engine.setup(model, tok)
    engine._sync = servers.sync  # the stand-in weight sync (no torch.distributed group)
    engine.sync_weights(model, version=0)
    return engine


def _rows(out):
    return out.completion_ids, out.completion_mask, out.logprobs, out.finish_reasons, out.versions


def test_two_servers_split_a_batch_into_the_one_server_rows(policy):
    with FakeServers(1) as one, FakeServers(2) as two:
        a = _engine(one, policy).generate(PROMPTS, 3, SAMPLING, seed=11)
        b = _engine(two, policy).generate(PROMPTS, 3, SAMPLING, seed=11)
        assert [len(s.requests) for s in two.servers] == [3, 2]  # prompts 0, 2, 4 and 1, 3: whole groups
        for x, y in zip(_rows(a), _rows(b)):
            assert x == y if isinstance(x, list) else torch.equal(x, y)
        assert a.completion_ids.shape[0] == 15 and a.versions == [0] * 15
        # a request holds the prompt's ids, n = G and its seed (11 + 0 * 3); they arrive in any order
        (sent,) = [r for r in two.servers[0].requests if r["token_ids"] == PROMPTS[0]]
        assert sent["sampling_params"]["n"] == 3
        assert sent["sampling_params"]["seed"] == 11 and sent["sampling_params"]["logprobs"] == 0


@pytest.mark.parametrize("failure", ["killed", "garbage", "restarted", "hangs"])
def test_a_failing_server_is_named_its_prompts_go_to_the_other_and_it_is_dropped(policy, failure):
    with FakeServers(1) as one, FakeServers(2) as two:
        expected = _engine(one, policy).generate(PROMPTS, 2, SAMPLING, seed=3)
        engine = _engine(two, policy, timeout_s=1.0)
        bad = two.servers[1]
        if failure == "killed":
            bad.kill()
        elif failure == "garbage":
            bad.mode = "garbage"
        elif failure == "restarted":
            bad.version = "default"  # fresh weights: not the version pushed
        else:
            bad.mode = "hang"
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match=rf"generation server failed: {bad.url if failure != 'killed' else '.*'}"
                                                r".*prompts go to the 1 other server\(s\) and it is dropped"):
            out = engine.generate(PROMPTS, 2, SAMPLING, seed=3)
        assert time.monotonic() - t0 < 8
        for x, y in zip(_rows(expected), _rows(out)):
            assert x == y if isinstance(x, list) else torch.equal(x, y)
        assert engine.metrics() == {"servers/alive": 1.0, "servers/dropped": 1.0}


def test_a_dropped_server_is_taken_back_at_a_push_once_it_answers(policy):
    with FakeServers(2) as two:
        engine = _engine(two, policy)
        bad = two.servers[1]
        port = bad.port
        bad.kill()
        with pytest.warns(RuntimeWarning, match="dropped"):
            engine.generate(PROMPTS, 2, SAMPLING, seed=3)
        engine.sync_weights(policy[0], version=1)  # still down: the push goes to the other one alone
        assert two.sync.members == [f"http://{two.servers[0].url}"] and two.sync.pushes[-1][:2] == (1, True)
        bad.restart(port)
        with pytest.warns(RuntimeWarning, match=rf"127.0.0.1:{port} answers again: taken back"):
            engine.sync_weights(policy[0], version=2)
        assert len(two.sync.members) == 2 and two.sync.pushes[-1][:2] == (2, True)  # everything, to both
        before = len(bad.requests)
        engine.generate(PROMPTS, 2, SAMPLING, seed=3)
        assert len(bad.requests) == before + 2 and engine.metrics()["servers/alive"] == 2.0


def test_with_no_server_left_the_call_names_them(policy):
    with FakeServers(1) as one:
        engine = _engine(one, policy)
        one.servers[0].kill()
        with pytest.warns(RuntimeWarning), pytest.raises(ServerError, match=r"no generation server is left while "
                                                                             r"generating \(127.0.0.1:\d+ is unreachable"):
            engine.generate(PROMPTS, 2, SAMPLING, seed=3)


def test_a_refused_api_key_is_the_request_s_fault_and_names_the_variable(policy, monkeypatch):
    monkeypatch.delenv("LIT_RLFT_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with FakeServers(1, modes=["unauthorized"]) as one:
        engine = _engine(one, policy)
        with pytest.raises(ServerError, match=r"HTTP 401.*the API key was refused: set LIT_RLFT_API_KEY"):
            engine.generate(PROMPTS, 2, SAMPLING, seed=3)
        assert engine.metrics()["servers/dropped"] == 0.0


def test_settings_are_checked_and_the_sync_token_is_required(policy, monkeypatch):
    with pytest.raises(ValueError, match="host:port"):
        ServerEngine(["localhost"])
    with pytest.raises(ValueError, match="listed twice"):
        ServerEngine(["127.0.0.1:1", "http://127.0.0.1:1"])
    monkeypatch.delenv("LIT_RLFT_SYNC_TOKEN", raising=False)
    engine = ServerEngine(["127.0.0.1:1"])
    engine.setup(*policy)
    with pytest.raises(ServerError, match="LIT_RLFT_SYNC_TOKEN"):
        engine.sync_weights(policy[0], version=0)


# -- through the step ------------------------------------------------------------------------------------------------
def _step(servers, depth):
    step = build_step(tiny_config(reward_funcs=[COIN], async_depth=depth,
                                  engine=ServerEngine(servers.urls, timeout_s=10.0)))
    assert isinstance(step.source, ServerRollouts)
    step.source.engine._sync = servers.sync
    return step


def _train(step, steps=3, callbacks=()):
    data = countdown_dm(size=48, batch_size=4)
    data.setup("fit")
    step.bind(data, callbacks=list(callbacks))
    opt = configure_adamw(step.policy, step.optim, total_steps=100)
    backend = TorchBackend(step.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    outs = []
    for out in train(step, backend, list(callbacks)):
        outs.append(out)
        if len(outs) == steps:
            break
    return outs


@pytest.mark.parametrize("depth", [0, 1])
def test_the_step_trains_on_server_rows_that_carry_the_servers_version(depth):
    with FakeServers(2) as servers:
        step = _step(servers, depth)
        outs = _train(step, steps=3)
        for t, out in enumerate(outs):
            assert out.rollouts.birth_step.tolist() == [max(t - depth, 0)] * 4
            assert out.metrics["servers/alive"] == 2.0 and torch.isfinite(torch.tensor(out.metrics["loss"]))
            if depth:
                assert out.metrics["async/staleness/max"] == min(t, depth)
        versions = [v for v, _, _ in servers.sync.pushes]
        assert versions == [0, 1, 2, 3]  # the first request pushed everything, then one push per step
        assert [full for _, full, _ in servers.sync.pushes] == [True, False, False, False]
        assert servers.sync.closed == 1  # closed with the step


def test_a_resumed_run_with_servers_trains_its_ledger_once(tmp_path):
    def fit(out, steps, ckpt_path=None, save=False):
        L.seed_everything(0, verbose=False)
        module = tiny_module(reward_funcs=[COIN], async_depth=1, engine=ServerEngine(servers.urls, timeout_s=10.0))
        module.grpo.source.engine._sync = servers.sync
        trained = Trained()
        extra = [ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=2, save_top_k=-1)] if save else []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tiny_trainer(out, max_steps=steps, callbacks=[DPSCallback(), trained, *extra],
                         enable_checkpointing=save).fit(module, datamodule=countdown_dm(size=24, batch_size=4),
                                                        ckpt_path=ckpt_path)
        return trained.ids

    with FakeServers(1) as servers:
        full = fit(tmp_path / "full", 4)
        first = fit(tmp_path / "first", 2, save=True)
        path = tmp_path / "first" / "ckpt" / "epoch=0-step=2.ckpt"
        ledger = torch.load(path, weights_only=True)["lit_rlft"]["async"]["ledger"]
        assert [index for index, _ in ledger] == [2] and sorted(ledger[0][1]) == sorted(full[2])
        pushes = len(servers.sync.pushes)
        resumed = fit(tmp_path / "resumed", 4, ckpt_path=str(path))
        assert servers.sync.pushes[pushes][1] is True  # the restored weights go to the servers whole first
        assert first == full[:2] and resumed[0] == ledger[0][1] and resumed == full[2:]


def test_before_the_first_push_the_engine_waits_for_the_servers_and_drops_one_that_never_answers(policy):
    model, tok = policy
    with FakeServers(2) as two:
        late = two.servers[1]
        late.kill()
        engine = ServerEngine(two.urls, timeout_s=5.0, start_timeout_s=1.5)
        engine.setup(model, tok)
        engine._sync = two.sync
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match=rf"{late.url} did not answer /health within 1.5 s"):
            engine.sync_weights(model, version=0)
        assert 1.5 <= time.monotonic() - t0 < 5 and two.sync.members == [f"http://{two.servers[0].url}"]


def test_episodes_refill_rounds_and_validation_go_through_the_servers():
    """Multi-turn episodes (each turn a request), dynamic sampling's rounds and validation take the same path."""
    from lit_rlft.callbacks import DynamicSamplingCallback
    from tests.step.test_episodes_step import TwoTurns

    with FakeServers(2) as servers:
        step = build_step(tiny_config(reward_funcs=["lit_rlft.envs.environment_reward"], environment=TwoTurns(),
                                      episodes={"max_turns": 2, "max_tokens": 80},
                                      engine=ServerEngine(servers.urls, timeout_s=10.0)))
        step.source.engine._sync = servers.sync
        outs = _train(step, steps=2, callbacks=[DPSCallback(), DynamicSamplingCallback(max_rounds=2)])
        turns = [len(r["token_ids"]) for s in servers.servers for r in s.requests]
        assert outs[-1].metrics["episodes/turns_mean"] > 1.0 and len(set(turns)) > 1  # later turns: longer contexts
        assert step.budget.by_purpose.get("dynamic_sampling", 0) + step.budget.by_purpose["train"] >= 2 * 16
        before = sum(len(s.requests) for s in servers.servers)
        data = countdown_dm(size=48, batch_size=4, val=True)
        data.setup("fit")
        step.bind(data)
        metrics = step.validate(data.val_dataloader())
        assert "val/accuracy" in metrics and sum(len(s.requests) for s in servers.servers) > before
        step.close()


def test_a_lora_policy_with_adapter_sync_pushes_adapters_and_asks_for_them_by_name(policy):
    from lit_rlft.models.loading import LoRAConfig, apply_lora

    model, tok = policy
    peft = apply_lora(model, LoRAConfig(r=4, alpha=8))
    with FakeServers(1) as one:
        engine = ServerEngine(one.urls, timeout_s=10.0, lora_sync="adapter")
        engine.setup(peft, tok)
        engine._sync = one.sync
        engine.sync_weights(peft, version=0)
        (version, names, config), = one.sync.adapters
        assert version == 0 and names and all(".lora_A." in n or ".lora_B." in n for n in names)
        assert config["r"] == 4 and not one.sync.pushes[0][2]  # no full weights
        engine.generate(PROMPTS[:2], 2, SAMPLING, seed=1)
        assert [r["model"] for r in one.servers[0].requests] == ["lit_rlft-policy"] * 2


class _Ranks:
    """The trainer's ranks as the step's collective gives them (rank, world size, barrier), counting barriers."""

    def __init__(self, rank: int, world_size: int = 2):
        self.rank, self.world_size, self.barriers = rank, world_size, 0

    def barrier(self) -> None:
        self.barriers += 1


@pytest.mark.parametrize("rank", [0, 1])
def test_the_server_source_takes_its_ranks_from_the_step_rank_0_alone_sends(policy, rank):
    """The ranks reach the servers' source and client through ``bind_ranks`` (what ``ShardedRollouts.bind`` calls),
    not torch.distributed: rank 0 sends the weights, another rank sends nothing but holds the version; every rank
    meets the others before and after a push; rank r's prompt i goes to server (i + r) mod S."""
    from lit_rlft.rollout import RolloutWorker

    model, tok = policy
    with FakeServers(2) as servers:
        engine = ServerEngine(servers.urls, timeout_s=10.0)
        engine._sync = servers.sync
        source = ServerRollouts(RolloutWorker(engine, lambda completions, columns: [0.0] * len(completions), tok), tok)
        ranks = _Ranks(rank)
        source.bind_ranks(ranks)
        source.attach(model)
        source.sync_weights(model, 3)
        assert ranks.barriers == 2 and engine.version == 3
        assert servers.sync.pushes == ([(3, True, servers.sync.pushes[0][2])] if rank == 0 else [])
        for server in servers.servers:
            server.version = "3"  # what rank 0's push set on the servers
        engine.generate(PROMPTS, 2, SAMPLING, seed=1)
        assert [len(s.requests) for s in servers.servers] == ([3, 2] if rank == 0 else [2, 3])
        source.close()

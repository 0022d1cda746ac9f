"""Two processes on the CPU (gloo), started as subprocesses (in-process, Lightning would re-launch pytest as rank 1).

What must hold on several ranks: every rank holds the same selection state, plan and parameters after every step;
the ranks train on disjoint halves of each global batch; one step on 2 ranks computes the gradient of one step on
1 rank over the same global batch; FSDP2 + LoRA trains, checkpoints and resumes exactly; a checkpoint resumes on
another world size; a rank whose reward function fails stops the run on every rank, naming it, without a hang.
Each run takes about 10 s (mostly imports in two processes).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

SCRIPT = REPO / "tests" / "distributed" / "run_ranks.py"
pytestmark = pytest.mark.distributed


def spawn(*cmd: str, timeout: float = 240, warnings: bool = False) -> subprocess.CompletedProcess:
    """``python *cmd`` from the repository (it starts the other rank itself); kill its process group on a hang."""
    env = {**os.environ, "PYTHONWARNINGS": "default" if warnings else "ignore", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MASTER_PORT", None)
    proc = subprocess.Popen([sys.executable, *cmd], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"hung (killed after {timeout} s):\n{output[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, output, "")


def launch(out: Path, *args: str, timeout: float = 240, warnings: bool = False) -> subprocess.CompletedProcess:
    return spawn(str(SCRIPT), "--out", str(out), *args, timeout=timeout, warnings=warnings)


def run(out: Path, *args: str, ranks: int = 2) -> list[dict]:
    result = launch(out, *args)
    assert result.returncode == 0, result.stdout[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


RUNS = {
    # DPS + replay under the Trainer, micro-batches of 3 (gradient sync on the last one only), the first step's
    # rollouts and gradients dumped, a checkpoint at step 2
    "trainer_dps_replay": ["--callbacks", "dps,replay", "--steps", "4", "--micro-batch-size", "3", "--dump",
                           "--ckpt-every", "2"],
    "trainer_dots": ["--callbacks", "dots", "--steps", "4", "--val", "7"],
    "fabric_dps_replay": ["--launcher", "fabric", "--callbacks", "dps,replay", "--steps", "4", "--micro-batch-size",
                          "3"],
    "fabric_dots": ["--launcher", "fabric", "--callbacks", "dots", "--steps", "4", "--val", "7"],
    "trainer_global_loss": ["--steps", "2", "--micro-batch-size", "3", "--dump", "--loss",
                            "top_entropy_quantile=0.3,entropy_coef=0.01,use_adaptive_entropy=true,"
                            "importance_sampling_level=sequence"],
    "trainer_entropy_bonus": ["--steps", "1", "--micro-batch-size", "3", "--dump", "--loss",
                              "entropy_coef=0.05"],
    "fsdp2_lora": ["--strategy", "fsdp2", "--lora", "--callbacks", "dps,replay", "--steps", "4", "--ckpt-every", "2",
                   "--dump"],
    "fabric_fsdp2_lora": ["--launcher", "fabric", "--strategy", "fsdp2", "--lora", "--callbacks", "dps,replay",
                          "--steps", "4"],
    # replay then dynamic sampling: the kept groups of a first round made of fresh, replayed and filled blocks
    "trainer_dps_replay_ds": ["--callbacks", "dps,replay,ds", "--steps", "4"],
    # asynchronous rollouts, one step off: a generation process per rank
    "trainer_async_dps_replay_ds": ["--callbacks", "dps,replay,ds", "--steps", "4", "--async-depth", "1"],
    "fabric_async_dots": ["--launcher", "fabric", "--callbacks", "dots", "--steps", "4", "--async-depth", "1",
                          "--val", "7"],
    "fsdp2_lora_async": ["--strategy", "fsdp2", "--lora", "--callbacks", "dps,replay", "--steps", "4",
                         "--async-depth", "1"],
    # screening: kept screening groups move to the rank that completes them; replay after it; then one step off
    "trainer_screen_dps_replay": ["--callbacks", "screen,dps,replay", "--steps", "4"],
    "trainer_async_screen_dps": ["--callbacks", "screen,dps", "--steps", "4", "--async-depth", "1"],
    # sequential sampling: groups of different sizes, ranks training on different numbers of rows (FSDP2's dummy
    # passes), replayed groups of other sizes beside them
    "trainer_seq_dps_replay": ["--callbacks", "seq,dps,replay", "--steps", "4", "--micro-batch-size", "2"],
    # allocation: a pool of 8 seen again and again, so the prompts' beliefs and allocations differ
    "trainer_alloc_dps_replay": ["--callbacks", "alloc,dps,replay", "--steps", "4", "--micro-batch-size", "2",
                                 "--pool", "8", "--batch-size", "8"],
    "trainer_seq_dump": ["--callbacks", "seq", "--steps", "1", "--micro-batch-size", "3", "--dump"],
    # multi-turn episodes: observation tokens inside the completions, left out of the loss on each rank
    "trainer_env_dump": ["--env", "echo", "--steps", "1", "--micro-batch-size", "3", "--dump"],
    # shared-prompt passes: each group's prompt once per micro-batch (DDP; FSDP2 + LoRA with checkpointing)
    "trainer_shared_prompt_dump": ["--shared-prompt", "--steps", "1", "--micro-batch-size", "3", "--dump"],
    "fsdp2_shared_prompt_dump": ["--strategy", "fsdp2", "--shared-prompt", "--gradient-checkpointing", "--steps", "1",
                                 "--micro-batch-size", "3", "--dump"],
    # chunked log-probs (chunks of 5 positions) inside FSDP2's root unit, with gradient checkpointing
    "fsdp2_chunked_dump": ["--strategy", "fsdp2", "--logprob-chunk-tokens", "5", "--gradient-checkpointing",
                           "--steps", "1", "--micro-batch-size", "3", "--dump"],
    "trainer_env_dps_replay": ["--env", "echo", "--callbacks", "dps,replay", "--steps", "4", "--ckpt-every", "2"],
    # rank 1 with nothing to train: every one of its groups has advantage 0, so the update skips all its rows
    "trainer_zero_rank1_dump": ["--reward", "tests.distributed.helpers.coin_reward_zero_on_rank_1", "--steps", "1",
                                "--micro-batch-size", "3", "--dump"],
    "fsdp2_zero_rank1_dump": ["--strategy", "fsdp2", "--reward", "tests.distributed.helpers.coin_reward_zero_on_rank_1",
                              "--steps", "1", "--micro-batch-size", "3", "--dump"],
    # every rank with nothing to train (the untrained policy never solves Countdown): no pass, zero gradients
    "trainer_all_zero_dump": ["--reward", "lit_rlft.rewards.countdown_reward", "--steps", "2", "--micro-batch-size", "3",
                              "--dump"],
    "fsdp2_all_zero_dump": ["--strategy", "fsdp2", "--reward", "lit_rlft.rewards.countdown_reward", "--steps", "2",
                            "--micro-batch-size", "3", "--dump"],
    "fsdp2_lora_seq_replay": ["--strategy", "fsdp2", "--lora", "--callbacks", "seq,replay", "--steps", "4",
                              "--micro-batch-size", "2"],
    # auto: the selector's share of each batch moved by what the ranks' gathered groups show (one step off too)
    "trainer_dps_auto_replay": ["--callbacks", "dps,auto,replay", "--steps", "4"],
    "fsdp2_lora_async_dps_auto": ["--strategy", "fsdp2", "--lora", "--callbacks", "dps,auto", "--steps", "4",
                                  "--async-depth", "1"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(name) -> (per-rank results, output folder)``: the 2-rank runs several tests read, each made once."""
    root = tmp_path_factory.mktemp("ranks")
    done: dict[str, list[dict]] = {}

    def get(name: str) -> tuple[list[dict], Path]:
        if name not in done:
            done[name] = run(root / name, *RUNS[name])
        return done[name], root / name

    return get


def _assert_ranks_agree_and_split_the_batch(ranks: list[dict], replay: bool) -> None:
    r0, r1 = ranks
    assert r0["params"] == r1["params"], "parameters differ between ranks"
    assert len(r0["steps"]) == len(r1["steps"]) == 4
    for t, (a, b) in enumerate(zip(r0["steps"], r1["steps"])):
        assert a["callbacks"] == b["callbacks"], f"step {t}: selection states differ between ranks"
        assert a["plan"] == b["plan"] and a["scheduled"] == b["scheduled"], f"step {t}: plans differ"
        assert a["global"] == b["global"] and a["budget"] == b["budget"]
        local0, local1 = a["fresh"] + a["replayed"], b["fresh"] + b["replayed"]
        assert len(local0) == len(local1) == 2, f"step {t}: ranks trained on {local0} and {local1}"
        assert not set(local0) & set(local1), f"step {t}: both ranks trained on {set(local0) & set(local1)}"
        assert sorted(local0 + local1) == a["global"]  # together: the whole global batch
    for t in range(3):  # what was planned after step t is what the ranks rolled out fresh at step t + 1
        fresh = sorted(r0["steps"][t + 1]["fresh"] + r1["steps"][t + 1]["fresh"])
        planned = sorted(r0["steps"][t]["scheduled"])
        replayed = r0["steps"][t + 1]["replayed"] + r1["steps"][t + 1]["replayed"]
        # replay fills with more fresh prompts when its buffer holds too few groups, never with fewer
        assert fresh == planned or (set(planned) <= set(fresh) and len(replayed) < len(fresh) - len(planned) + 1)
    if replay:
        assert any(s["replayed"] for s in r0["steps"]), "nothing was replayed: the buffer went unchecked"


@pytest.mark.parametrize("name", ["trainer_dps_replay", "fabric_dps_replay", "trainer_dots", "fabric_dots",
                                  "fabric_fsdp2_lora"])
def test_two_ranks_hold_identical_state_and_train_disjoint_halves(runs, name):
    _assert_ranks_agree_and_split_the_batch(runs(name)[0], replay="replay" in name)


@pytest.mark.parametrize("name", ["trainer_dps_replay_ds", "trainer_async_dps_replay_ds", "fabric_async_dots",
                                  "fsdp2_lora_async", "trainer_screen_dps_replay", "trainer_async_screen_dps",
                                  "trainer_seq_dps_replay", "fsdp2_lora_seq_replay", "trainer_alloc_dps_replay",
                                  "trainer_dps_auto_replay", "fsdp2_lora_async_dps_auto"])
def test_two_ranks_agree_and_the_rows_they_train_are_the_record_and_never_in_flight(runs, name):
    """The plan, every callback's state and the parameters stay equal on both ranks; what the ranks train together
    is exactly the record's trained batch (dynamic sampling after replay: the kept groups fetched from the rank that
    holds each, whatever block of the first round it came from); at async depth 1 (a generation process per rank)
    no prompt rolled out in a step (its batch, dynamic sampling's or screening's extra rounds) was in flight during
    it."""
    r0, r1 = runs(name)[0]
    assert r0["params"] == r1["params"], "parameters differ between ranks"
    assert len(r0["steps"]) == len(r1["steps"]) == 4
    for t, (a, b) in enumerate(zip(r0["steps"], r1["steps"])):
        assert a["callbacks"] == b["callbacks"], f"step {t}: selection states differ between ranks"
        assert a["plan"] == b["plan"] and a["scheduled"] == b["scheduled"] and a["budget"] == b["budget"]
        assert not set(a["fresh"] + a["replayed"]) & set(b["fresh"] + b["replayed"])
        assert sorted(a["fresh"] + a["replayed"] + b["fresh"] + b["replayed"]) == a["global"]
    if "seq" in name or "alloc" in name:  # groups of different sizes: the ranks trained on different numbers of rows at some step
        assert any(a["completions"] != b["completions"] for a, b in zip(r0["steps"], r1["steps"]))
    for t in range(4 if "async" in name else 0):  # nothing rolled out in a step was in flight during it
        rolled, flying = set(r0["steps"][t]["observed"]), set(r0["steps"][t]["in_flight"])
        assert flying or t == 3, f"step {t}: nothing in flight at depth 1"
        assert not rolled & flying, f"step {t} rolled out {rolled & flying}, which were in flight"


@pytest.mark.parametrize("name", ["trainer_dots", "fabric_dots", "fabric_async_dots"])
def test_validation_counts_every_prompt_once_on_two_ranks(runs, name):
    """7 held-out prompts in global batches of 4 and 3: the ranks split each batch (2 + 2, then 2 + 1 padded to 2),
    and the synced metrics count 7 prompts, the padding never; both ranks report the same values."""
    r0, r1 = runs(name)[0]
    assert r0["last_eval"] == r1["last_eval"]
    assert r0["last_eval"]["val/n/accuracy"] == 7.0
    n_by_difficulty = sum(v for k, v in r0["last_eval"].items() if k.startswith("val/n/accuracy/difficulty_"))
    assert n_by_difficulty == 7.0
    assert 0.0 <= r0["last_eval"]["val/accuracy"] <= 1.0


def test_trainer_and_fabric_train_the_same(runs):
    """Same seeds, same global batches: the Trainer and the Fabric loop end with the same parameters."""
    assert runs("trainer_dps_replay")[0][0]["params"] == runs("fabric_dps_replay")[0][0]["params"]
    assert runs("trainer_dots")[0][0]["params"] == runs("fabric_dots")[0][0]["params"]
    assert runs("fsdp2_lora")[0][0]["params"] == runs("fabric_fsdp2_lora")[0][0]["params"]


def test_two_ranks_compute_the_one_rank_gradient(runs):
    """The first step on 2 ranks (each half of the global batch, micro-batches of 3, dapo token mean) gives the
    gradient of 1 rank training on the whole global batch. Tolerance: 1e-6 relative (per tensor, after the DDP
    all-reduce and clipping). Parameters after the AdamW step agree to 1e-6 relative wherever the gradient is above
    1e-5: AdamW's first step moves a weight by lr * g / (|g| + eps), which multiplies a gradient's rounding by
    lr * eps / (|g| + eps)^2 (6 for |g| = 1e-6: a few dozen of the 89k weights here)."""
    _, out = runs("trainer_dps_replay")
    _assert_one_rank_gradient(out)


def test_two_ranks_compute_the_one_rank_gradient_with_groups_of_different_sizes(runs):
    """Sequential sampling's first step: groups of different sizes, a different number of rows on each rank; the
    loss's normaliser counts the real completions of both ranks, as one rank holding them all does."""
    _, out = runs("trainer_seq_dump")
    _assert_one_rank_gradient(out, ragged=True)


def test_two_ranks_compute_the_one_rank_gradient_with_batch_wide_loss_terms(runs):
    """The same with the loss terms computed over the whole batch (TRL's names): only the top 30% of the tokens by
    entropy trained (a global quantile; this batch's per-rank quantiles would keep other tokens: a local threshold
    fails this test), an adaptive entropy bonus whose measured entropy and next coefficient are global (checked on
    the updater's state after the step: the bonus itself is off until a first measurement), GSPO's sequence-level
    ratio. (Not ``mask_truncated_completions``: the untrained policy never stops before the length limit, so it
    would mask every token.)"""
    _, out = runs("trainer_global_loss")
    _assert_one_rank_gradient(out, loss=dict(top_entropy_quantile=0.3, entropy_coef=0.01, use_adaptive_entropy=True,
                                             importance_sampling_level="sequence"))


def test_two_ranks_compute_the_one_rank_gradient_with_an_entropy_bonus(runs):
    """A constant entropy bonus acts from the first step: its token count is the global batch's (a per-rank count
    weighs the two ranks' entropies differently and fails this test)."""
    _, out = runs("trainer_entropy_bonus")
    _assert_one_rank_gradient(out, loss=dict(entropy_coef=0.05))


@pytest.mark.parametrize("name", ["trainer_shared_prompt_dump", "fsdp2_shared_prompt_dump"])
def test_two_ranks_with_shared_prompt_passes_compute_the_one_rank_per_row_gradient(runs, name):
    """Shared-prompt passes on 2 ranks (DDP; FSDP2 with gradient checkpointing) give the gradient of 1 rank's per-row
    passes over the whole batch. Tolerance 1e-5 relative: the grouped and the per-row forwards round differently
    (about 1e-6 on a log-prob, measured)."""
    ranks, out = runs(name)
    assert [r["grouped"] for r in ranks] == [[True], [True]]  # every pass on both ranks shared its prompts
    _assert_one_rank_gradient(out, tolerance=1e-5)


def test_two_fsdp2_ranks_with_chunked_log_probs_compute_the_one_rank_full_logits_gradient(runs):
    """Chunked log-probs under FSDP2 (the head inside the root unit, its chunks recomputed in the backward while the
    unit's parameters are gathered; gradient checkpointing in the decoder layers) give the gradient of 1 rank's
    full-logits passes over the whole batch. Tolerance 1e-5 relative (the head's product on chunks rounds
    differently)."""
    _, out = runs("fsdp2_chunked_dump")
    _assert_one_rank_gradient(out, tolerance=1e-5)


@pytest.mark.parametrize("name", ["trainer_zero_rank1_dump", "fsdp2_zero_rank1_dump"])
def test_a_rank_whose_rows_all_teach_nothing_meets_the_collectives_and_the_gradient_is_every_rows(runs, name):
    """Rank 1's groups all have advantage 0 (DDP; FSDP2, whose forwards gather parameters): it runs no real pass,
    only the passes that meet rank 0's collectives, and the 2-rank gradient equals 1 rank's over the whole batch
    computed without the skip (every row passed)."""
    ranks, out = runs(name)
    d1 = torch.load(out / "rank1.pt", weights_only=False)
    assert float(d1["rollouts"].rewards.abs().sum()) == 0.0
    _assert_one_rank_gradient(out, skip_zero_advantage=False)


@pytest.mark.parametrize("name", ["trainer_all_zero_dump", "fsdp2_all_zero_dump"])
def test_ranks_that_all_have_nothing_to_train_step_over_zero_gradients(runs, name):
    """Every group on both ranks has advantage 0 (DDP; FSDP2, sharded DTensor gradients): no pass runs on either rank,
    the gradients are zeros on both, AdamW steps over them (its first step moves nothing), the next step runs (no
    collective left waiting) and the ranks still agree."""
    ranks, out = runs(name)
    d0, d1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert float(d0["rollouts"].rewards.abs().sum()) == float(d1["rollouts"].rewards.abs().sum()) == 0.0
    assert all(float(g.abs().sum()) == 0.0 for d in (d0, d1) for g in d["grads"].values())
    for name, value in d0["after"].items():
        assert torch.equal(value, d1["after"][name]) and torch.equal(value, d0["before"][name]), name


def _assert_one_rank_gradient(out: Path, loss: dict | None = None, ragged: bool = False,
                              tolerance: float = 1e-6, skip_zero_advantage: bool = True) -> None:
    from lit_rlft import GenerationConfig, GRPOLoss, GRPOModule, OptimConfig, Rollouts, TinyConfig
    from lit_rlft.core.advantages import group_advantages
    from lit_rlft.step.optim import adamw_with_warmup
    from lit_rlft.step.update import TorchBackend
    from tests.distributed.run_ranks import TINY_SMALL

    d0, d1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    tokens = [int(d["rollouts"].loss_mask.sum()) for d in (d0, d1)]
    assert tokens[0] != tokens[1], "equal token counts: the test could not tell a local from a global token mean"
    module = GRPOModule(model="tiny", tiny=TinyConfig(**TINY_SMALL), reward_funcs=["lit_rlft.rewards.countdown"],
                        generation=GenerationConfig(num_generations=4, max_completion_length=8),
                        loss=GRPOLoss(**(loss or {})), optim=OptimConfig(learning_rate=1e-3, micro_batch_size=3,
                                                                         skip_zero_advantage=skip_zero_advantage))
    module.configure_model()
    module.policy.load_state_dict(d0["before"], strict=False)  # the tied LM head is not a parameter of its own
    batch = Rollouts.concat([d0["rollouts"], d1["rollouts"]])
    batch.behaviour_logprobs = None  # filled by the update, as on the ranks
    members = batch.members
    if ragged:
        rows = [d["rollouts"].num_completions for d in (d0, d1)]
        assert members is not None and rows[0] != rows[1], f"equal groups or rows {rows}: nothing ragged to test"
    opt = adamw_with_warmup(module.policy.parameters(), 1e-3, (0.9, 0.99), 0.0, 0, "constant", None)
    grads: dict[str, torch.Tensor] = {}

    class Capture(TorchBackend):
        def optimizer_step(self) -> None:
            grads.update({n: p.grad.clone() for n, p in module.policy.named_parameters()})
            super().optimizer_step()

    backend = Capture(module.policy, opt["optimizer"], opt["lr_scheduler"]["scheduler"])
    module.grpo.updater.update(batch, group_advantages(batch.rewards, "group", members=members).reshape(-1), backend)
    assert sum(float(g.norm()) for g in grads.values()) > 0, "no gradient: the test would compare zeros"
    for name, g in grads.items():
        assert torch.equal(d0["grads"][name], d1["grads"][name]), f"{name}: ranks hold different gradients"
        rel = float((g - d0["grads"][name]).norm() / g.norm().clamp(min=1e-30))
        assert rel <= tolerance, f"{name}: 2-rank gradient differs from the 1-rank one by {rel:.2e} (relative)"
    state = module.grpo.updater.state_dict()  # the adaptive entropy coefficient and the entropy it measured
    for d in (d0, d1):
        assert d["updater_after_first_step"].keys() == state.keys()
        for key, value in state.items():
            assert math.isclose(d["updater_after_first_step"][key], value, rel_tol=1e-6), (key, value)
    for name, p in module.policy.named_parameters():
        mask = grads[name].abs() > 1e-5
        diff = (p.detach() - d0["after_first_step"][name]).abs()[mask]
        assert bool((diff <= tolerance * p.detach().abs()[mask].clamp(min=1e-3)).all()), name


def test_fsdp2_with_lora_trains_checkpoints_and_resumes_exactly(runs, tmp_path):
    ranks, out = runs("fsdp2_lora")
    _assert_ranks_agree_and_split_the_batch(ranks, replay=True)
    dumped = torch.load(out / "rank0.pt", weights_only=False)
    moved = {n for n in dumped["after"] if not torch.equal(dumped["after"][n], dumped["before"][n])}
    assert moved and all("lora_" in n for n in moved), f"trained: {sorted(moved)[:5]}..."
    checkpoint = out / "ckpt" / "epoch=0-step=2.ckpt"
    assert (checkpoint / "meta.pt").exists(), "no distributed checkpoint folder"
    resumed = run(tmp_path / "resumed", "--strategy", "fsdp2", "--lora", "--callbacks", "dps,replay", "--steps", "4",
                  "--resume", str(checkpoint))
    for rank in (0, 1):
        assert resumed[rank]["params"] == ranks[rank]["params"]
        assert resumed[rank]["steps"] == ranks[rank]["steps"][2:]  # same batches, plans and selection states


def test_a_two_rank_checkpoint_resumes_on_one_rank(runs, tmp_path):
    """The checkpoint holds the global state (plan, DPS beliefs, replay buffer, budget): one rank continues with the
    plan and replay draw that the two ranks would have used."""
    two, out = runs("trainer_dps_replay")
    checkpoint = out / "ckpt" / "epoch=0-step=2.ckpt"
    (one,) = run(tmp_path / "one", "--devices", "1", "--callbacks", "dps,replay", "--steps", "4", "--resume",
                 str(checkpoint), ranks=1)
    first = one["steps"][0]
    assert first["fresh"] == sorted(two[0]["steps"][1]["scheduled"])
    assert first["global"] == two[0]["steps"][2]["global"]  # the same replayed groups: the buffer and its RNG
    assert first["replayed"], "nothing replayed after the resume"
    assert first["budget"] == two[0]["steps"][2]["budget"]


def test_a_failing_reward_on_one_rank_stops_every_rank_naming_it(tmp_path):
    result = launch(tmp_path, "--reward", "tests.distributed.helpers.coin_reward_broken_on_rank_1", "--steps", "3",
                    timeout=120)
    assert result.returncode != 0
    message = "generating and scoring train rollouts failed on rank 1 of 2"
    assert result.stdout.count(message) >= 2, result.stdout[-4000:]  # raised on both ranks
    assert "returned 0 scores for 1 completion" in result.stdout
    assert not (tmp_path / "rank0.json").exists()


def test_gradient_checkpointing_under_fsdp2_with_lora_gives_the_same_gradients(tmp_path):
    """Checkpointing inside each FSDP2-sharded decoder layer (2 CPU ranks, LoRA, micro-batches): the first step's
    full gradients equal those without checkpointing to 1e-6 relative, on both ranks."""
    dumps = {}
    for flag in ("", "--gradient-checkpointing"):
        out = tmp_path / (flag or "plain")
        result = launch(out, "--strategy", "fsdp2", "--lora", "--steps", "1", "--micro-batch-size", "3", "--dump",
                        *([flag] if flag else []))
        assert result.returncode == 0, result.stdout[-4000:]
        dumps[flag] = [torch.load(out / f"rank{r}.pt", weights_only=False)["grads"] for r in (0, 1)]
    for plain, checkpointed in zip(dumps[""], dumps["--gradient-checkpointing"]):
        assert plain.keys() == checkpointed.keys() and all("lora_" in n for n in plain)
        for name, g in plain.items():
            rel = float((checkpointed[name] - g).norm() / g.norm().clamp(min=1e-30))
            assert rel <= 1e-6, f"{name}: {rel:.2e}"


def test_token_budget_micro_batches_and_packing_under_fsdp2_keep_the_ranks_in_step(tmp_path):
    """Micro-batches by tokens can differ in number between ranks; under FSDP2 every forward is a collective, so the
    ranks agree on the count (a rank that ran one forward fewer would hang the run); the first step's gradient is
    the one of 1 rank updating on the whole batch with row micro-batches and padded passes."""
    r0, r1 = run(tmp_path, "--strategy", "fsdp2", "--micro-batch-tokens", "30", "--padding-free", "--steps", "3",
                 "--dump")
    assert r0["params"] == r1["params"] and len(r0["steps"]) == 3
    _assert_one_rank_gradient(tmp_path)


def test_a_reward_raising_on_rank_1_only_is_printed_naming_rank_1_and_the_function(tmp_path):
    result = launch(tmp_path, "--reward", "tests.distributed.helpers.coin_reward_raising_on_rank_1", "--steps", "2",
                    timeout=120, warnings=True)
    assert result.returncode == 0, result.stdout[-4000:]  # a reward that raises scores 0 alone: the run goes on
    assert "rank 1: reward function 'coin_reward_raising_on_rank_1' raised on 8 completion(s)" in result.stdout, (
        result.stdout[-4000:])
    assert "cannot parse this completion" in result.stdout  # the example
    assert "rank 0: reward function" not in result.stdout
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["reward_totals"] == r1["reward_totals"] and r0["reward_totals"]["num_errors"] == 16  # 2 steps x 8


def test_a_plan_that_differs_between_ranks_stops_both_naming_the_rank(tmp_path):
    result = launch(tmp_path, "--callbacks", "drift", "--steps", "3", timeout=120)
    assert result.returncode != 0
    message = "step 1: the batch plan differs between ranks: rank 1 of 2 disagree with rank 0"
    assert result.stdout.count(message) >= 2, result.stdout[-4000:]  # raised on both ranks, before any rollout
    assert not (tmp_path / "rank0.json").exists()


def test_an_engine_raising_on_rank_1_under_fsdp2_ends_both_ranks_naming_it(tmp_path):
    """Rank 0 is inside FSDP2's all-gathers (generating) when rank 1 raises: the failure board, not the broken
    collective, names the error on both ranks."""
    result = launch(tmp_path, "--strategy", "fsdp2", "--engine", "raise-on-rank-1", "--steps", "3", timeout=180)
    assert result.returncode != 0
    named = [line for line in result.stdout.splitlines()
             if "RankFailure: generating and scoring train rollouts failed on rank 1" in line]
    assert len(named) >= 2 and all("RuntimeError: engine boom on rank 1" in line for line in named), (
        result.stdout[-6000:])


def _command(*cmd: str) -> subprocess.CompletedProcess:
    result = spawn(*cmd)
    assert result.returncode == 0, result.stdout[-6000:]
    return result


def test_the_cli_trains_with_fsdp2_on_two_cpu_ranks_from_yaml(tmp_path):
    """`lit-rlft fit --config ... --config configs/parallel/fsdp2_cpu.yaml`: LightningCLI starts rank 1, the run
    trains and validates, and rank 0 logs the global batch."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.cli.test_cli import _config

    _command("-m", "lit_rlft.cli", "fit", "--config", str(_config(tmp_path)), "--config",
             str(REPO / "configs" / "parallel" / "fsdp2_cpu.yaml"), "--trainer.callbacks.every_n_train_steps", "2")
    assert (tmp_path / "tb" / "version_0" / "checkpoints" / "epoch=0-step=2.ckpt" / ".metadata").is_file()
    (events,) = list(tmp_path.glob("tb/version_0/events.out.tfevents.*"))
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0}).Reload()
    assert [e.value for e in acc.Scalars("dist/world_size")] == [2.0] * 3
    assert [e.value for e in acc.Scalars("batch/groups")] == [4.0] * 3  # the global batch, not rank 0's half
    assert acc.Scalars("val/n/accuracy")[-1].value == 8.0


def test_the_gpu_check_script_runs_its_path_on_the_cpu(tmp_path):
    result = _command("scripts/gpu_check.py", "--accelerator", "cpu", "--hidden", "128", "--layers", "2",
                      "--steps", "2", "--batch-size", "4", "--out", str(tmp_path))
    assert result.stdout.count("PASS") == 9 and "FAIL" not in result.stdout, result.stdout[-3000:]
    assert "PASS shared-prompt passes (sdpa, dense mask): 4 groups x 4 of 64 + 16 tokens" in result.stdout
    assert "PASS chunked log-probs at vocabulary 151,936: 4 completions of 128 tokens, chunks 64" in result.stdout
    assert "PASS generation server, depth 1: skipped: needs a GPU and vLLM" in result.stdout
    assert "PASS reward model batched by tokens: 512 texts" in result.stdout
    assert "PASS async depth 1 trains, one step stale: staleness per step [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]" in result.stdout


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_reward_model_gives_2_ranks_the_1_rank_rewards(tmp_path, strategy):
    """Each rank scores its own completions with the reward model, micro-batched by tokens: a replica under DDP, a
    shard over the policy's mesh under FSDP2 (the ranks agree on the number of forwards); the rewards equal those of
    one process scoring every completion, and the first step's gradient is the 1-rank one."""
    from tests.distributed.helpers import TinyRewardModel

    r0, r1 = run(tmp_path, "--reward", "tests.distributed.helpers.TinyRewardModel", "--steps", "1", "--dump",
                 "--strategy", strategy)
    assert r0["params"] == r1["params"]
    assert r0["sharded_rewards"] == r1["sharded_rewards"] == (["RewardModel"] if strategy == "fsdp2" else [])
    if strategy == "fsdp2":
        assert r0["reward_forwards"] == r1["reward_forwards"]  # real + padding: every forward gathered on both
    d0, d1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    reward = TinyRewardModel()
    for d in (d0, d1):
        roll = d["rollouts"]
        G = roll.rewards.shape[1]
        prompts = [p for p in roll.prompts for _ in range(G)]
        expected = torch.tensor(reward.score(list(roll.completions), {"prompts": prompts})).view_as(roll.rewards)
        assert torch.allclose(roll.rewards, expected, atol=1e-5), (roll.rewards, expected)
    both = torch.cat([d0["rollouts"].rewards, d1["rollouts"].rewards]).flatten()
    assert both.unique().numel() > 4  # distinct scores: a constant reward would pass vacuously
    _assert_one_rank_gradient(tmp_path)


def test_two_ranks_compute_the_one_rank_gradient_over_episodes(runs):
    """Multi-turn episodes (observations inside the completions): the first step on 2 ranks gives the gradient of 1
    rank over the same episodes, the loss normaliser counting the policy's tokens of both ranks."""
    _, out = runs("trainer_env_dump")
    d0 = torch.load(out / "rank0.pt", weights_only=False)
    r = d0["rollouts"]
    assert r.policy_mask is not None and bool((r.policy_mask < r.completion_mask).any()), "no observation inside"
    _assert_one_rank_gradient(out)


def test_episodes_ending_at_different_turns_on_two_fsdp2_ranks_keep_them_in_step(tmp_path):
    """Under FSDP2 every generate call is a collective: rank 0's episodes all end after one turn while rank 1's go on
    (and need more ``max_batch_size`` calls), so rank 0 must make throw-away calls or both hang. The first step's
    gradient is still the 1-rank gradient over both ranks' episodes."""
    r0, r1 = run(tmp_path, "--strategy", "fsdp2", "--env", "echo-rank0-stops", "--generation-batch-size", "2",
                 "--steps", "2", "--dump")
    assert r0["params"] == r1["params"] and len(r0["steps"]) == 2
    d0, d1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False)["rollouts"] for r in (0, 1))
    assert d0.policy_mask is None or torch.equal(d0.policy_mask, d0.completion_mask), "rank 0: one turn each"
    assert int((d1.policy_mask < d1.completion_mask).any(1).sum()) > 2, "rank 1 should have several second turns"
    _assert_one_rank_gradient(tmp_path)


def test_episodes_on_two_ranks_agree_and_resume_exactly(runs, tmp_path):
    ranks, out = runs("trainer_env_dps_replay")
    _assert_ranks_agree_and_split_the_batch(ranks, replay=True)
    checkpoint = out / "ckpt" / "epoch=0-step=2.ckpt"
    resumed = run(tmp_path / "resumed", "--env", "echo", "--callbacks", "dps,replay", "--steps", "4", "--resume",
                  str(checkpoint))
    for rank in (0, 1):
        assert resumed[rank]["params"] == ranks[rank]["params"]
        assert resumed[rank]["steps"] == ranks[rank]["steps"][2:]  # same episodes, plans and selection states


@pytest.mark.parametrize("layout", [["--callbacks", "dps,replay", "--async-depth", "1"],
                                    ["--strategy", "fsdp2", "--lora", "--callbacks", "dps"]],
                         ids=["ddp_depth1_dps_replay", "fsdp2_lora"])
def test_two_ranks_with_generation_servers_split_the_batch_and_rank_0_alone_pushes(tmp_path, layout):
    """Every rank asks the servers for its own slice (whole groups, split over two stand-in servers); rank 0 alone
    pushes the weights (once before the first request, then once per step: not once per rank), every rank having
    gathered its FSDP2 shards; the ranks stay in step and train disjoint halves of each batch."""
    from tests.rollout.servers.fake_servers import FakeServers

    with FakeServers(2) as servers:
        ranks = run(tmp_path, "--engine", "servers", "--servers", ",".join(servers.urls), "--steps", "4", *layout)
        assert [s.pushes for s in servers.servers] == [5, 5]  # 1 + 4 steps, from rank 0 only
        requests = sum(len(s.requests) for s in servers.servers)
        assert requests >= 4 * 2 and all(s.requests for s in servers.servers)  # 4 steps x 2-4 fresh prompts
    r0, r1 = ranks
    assert r0["params"] == r1["params"], "parameters differ between ranks"
    assert len(r0["steps"]) == len(r1["steps"]) == 4
    for a, b in zip(r0["steps"], r1["steps"]):
        assert a["callbacks"] == b["callbacks"] and a["plan"] == b["plan"] and a["budget"] == b["budget"]
        assert not set(a["fresh"] + a["replayed"]) & set(b["fresh"] + b["replayed"])
        assert sorted(a["fresh"] + a["replayed"] + b["fresh"] + b["replayed"]) == a["global"]

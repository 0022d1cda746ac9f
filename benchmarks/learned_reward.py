"""A learned reward, worked end to end: a small classifier trained on Countdown completions labelled by the rule
reward, then GRPO with that classifier as the only reward. How much of the rule reward's held-out gain does it
recover, and where is it fooled?

    python -m benchmarks.learned_reward                  # after the balanced study's uniform runs (runs/bench)
    python -m benchmarks.learned_reward --quick          # a smoke run (smaller data, 1 seed, short budget)

1. **Data.** The warm start (the balanced study's SFT, ``runs/bench/sft/model``) samples 4 completions for each of 3,000
   Countdown training prompts of 2-4 numbers (``seed=11``: other problems than the study's pool), each labelled
   correct or not by :func:`~lit_rlft.rewards.countdown_reward`.
2. **Classifier.** A tiny Qwen2 sequence classifier (the policy's size and character tokenizer, 1M parameters),
   binary cross-entropy on prompt + completion, 85% / 15% split: held-out accuracy, AUC, and the wrong completions
   it scores highest (where it is fooled).
3. **GRPO.** The study's uniform runs (balanced pool of 4,000, 3 seeds, 38,400 completions) with
   ``RewardModel(rm, sigmoid=True)`` as the only training reward (``--set reward=<rm>``); held-out accuracy is still
   measured with the rule. Compared, paired by seed, with the same runs trained on the rule reward.
4. **Report.** ``benchmarks/results/learned_reward.json``, a table, and ``docs/results/learned_reward.png``: held-out
   accuracy against completions for both rewards, and the learned reward the policy was paid against the rule reward
   of its training-pool samples (a gap that opens is reward hacking).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def sample_data(warm: str, prompts: int, G: int, seed: int) -> list[dict]:
    """Completions of the warm start, labelled by the rule: ``[{"prompt", "completion", "label", "nums", "target"}]``."""
    from tqdm import tqdm

    from lit_rlft.data import CountdownTask
    from lit_rlft.models.loading import load_model, load_tokenizer_for
    from lit_rlft.rewards import countdown_reward
    from lit_rlft.rollout.engines.base import SamplingConfig
    from lit_rlft.rollout.engines.hf import HFEngine

    tok = load_tokenizer_for(warm)
    engine = HFEngine()
    engine.setup(load_model(warm), tok)
    records = [r.data for r in CountdownTask(size=prompts, num_numbers=[2, 3, 4], split="train", seed=seed).records()]
    torch.manual_seed(seed)
    rows: list[dict] = []
    chunk = 128
    for start in tqdm(range(0, len(records), chunk), desc="sampling completions", unit="chunk"):
        part = records[start:start + chunk]
        out = engine.generate([tok(r["prompt"])["input_ids"] for r in part], G,
                              SamplingConfig(temperature=1.0, max_new_tokens=16))
        texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
        rep = [r for r in part for _ in range(G)]
        scores = countdown_reward(texts, nums=[r["nums"] for r in rep], target=[r["target"] for r in rep])
        rows += [{"prompt": r["prompt"], "completion": t, "label": int((s or 0) >= 1.0), "nums": r["nums"],
                  "target": r["target"]} for r, t, s in zip(rep, texts, scores)]
    return rows


def train_classifier(rows: list[dict], out: Path, epochs: int, seed: int) -> dict:
    """Train the tiny classifier on 85% of ``rows`` (split by prompt), save it to ``out``; held-out metrics."""
    from lit_rlft.models.tiny import TinyConfig, char_tokenizer, tiny_reward_model
    from lit_rlft.rewards import RewardModel

    tok = char_tokenizer()
    tok.padding_side = "right"
    model = tiny_reward_model(tok, TinyConfig(seed=seed))
    prompts = sorted({r["prompt"] for r in rows})
    random.Random(seed).shuffle(prompts)
    held = set(prompts[: int(0.15 * len(prompts))])
    train = [r for r in rows if r["prompt"] not in held]
    test = [r for r in rows if r["prompt"] in held]
    scorer = RewardModel(model, tok, max_batch_tokens=8192, device="cpu")
    ids = scorer.encode([r["prompt"] + r["completion"] for r in train])
    labels = torch.tensor([float(r["label"]) for r in train])
    positive = float(labels.mean())
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    batch = 128
    losses = []
    from tqdm import tqdm

    model.train().requires_grad_(True)
    for _ in tqdm(range(epochs), desc="training the reward model", unit="epoch"):
        order = torch.randperm(len(ids), generator=gen).tolist()
        for s in range(0, len(order), batch):
            rows_b = order[s:s + batch]
            width = max(len(ids[i]) for i in rows_b)
            x = torch.full((len(rows_b), width), tok.pad_token_id, dtype=torch.long)
            m = torch.zeros_like(x)
            for j, i in enumerate(rows_b):
                x[j, : len(ids[i])] = torch.tensor(ids[i])
                m[j, : len(ids[i])] = 1
            logits = model(input_ids=x, attention_mask=m).logits[:, 0]
            # balanced: positives and negatives weigh alike whatever their share
            weight = torch.where(labels[rows_b] > 0, 0.5 / positive, 0.5 / (1 - positive))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[rows_b], weight=weight)
            optim.zero_grad()
            loss.backward()
            optim.step()
            losses.append(float(loss.detach()))
    model.eval().requires_grad_(False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    trained = RewardModel(str(out), sigmoid=True, device="cpu")
    p = np.array(trained.score([r["completion"] for r in test], {"prompts": [r["prompt"] for r in test]}))
    y = np.array([r["label"] for r in test])
    fooled = sorted(((float(p[i]), test[i]) for i in range(len(test)) if y[i] == 0), key=lambda t: -t[0])[:8]
    return {"train_completions": len(train), "test_completions": len(test), "positive_share": positive,
            "epochs": epochs, "final_loss": float(np.mean(losses[-20:])), "test_accuracy": float(((p >= 0.5) == y).mean()),
            "test_auc": _auc(p, y), "test_mean_score_correct": float(p[y == 1].mean()),
            "test_mean_score_wrong": float(p[y == 0].mean()),
            "fooled": [{"score": s, "prompt": r["prompt"], "completion": r["completion"]} for s, r in fooled]}


def _auc(p: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (the chance a correct completion outscores a wrong one)."""
    pos, neg = p[y == 1], p[y == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    ranks = np.argsort(np.argsort(np.concatenate([pos, neg]))) + 1
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def hacked_samples(warm: str, rm: Path, steps: int, n: int = 64, seed: int = 0) -> dict:
    """Train as the study's learned-reward run does for ``steps`` steps (where its held-out accuracy has collapsed),
    then sample one completion for ``n`` pool prompts from that policy: what the learned reward pays for it against
    what the rule says (where the classifier is fooled)."""
    import lightning as L

    from benchmarks.study.config import StudyConfig
    from benchmarks.study.tasks import datamodule, pool_task
    from lit_rlft import GenerationConfig, GRPOLoss, GRPOModule, OptimConfig
    from lit_rlft.rewards import RewardModel, countdown_reward
    from lit_rlft.rollout.engines.base import SamplingConfig
    from lit_rlft.rollout.engines.hf import HFEngine

    cfg = StudyConfig()
    L.seed_everything(seed, verbose=False)
    reward = RewardModel(str(rm), sigmoid=True, device="cpu")
    module = GRPOModule(model=warm, reward_funcs=[reward], scale_rewards=cfg.scale_rewards,
                        generation=GenerationConfig(num_generations=cfg.num_generations, temperature=cfg.temperature,
                                                    max_completion_length=cfg.max_completion_length, seed=seed),
                        loss=GRPOLoss(loss_type=cfg.loss_type, epsilon=cfg.epsilon, beta=0.0),
                        optim=OptimConfig(learning_rate=cfg.learning_rate, adam_betas=tuple(cfg.adam_betas),
                                          warmup_steps=cfg.warmup_steps, max_grad_norm=cfg.max_grad_norm))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0)
    trainer.fit(module, datamodule=datamodule(cfg, 4000, seed, with_eval=False))
    tok = module.grpo.tokenizer
    engine = HFEngine()
    engine.setup(module.policy, tok)
    records = [r.data for r in pool_task(cfg, 4000).records()[:n]]
    torch.manual_seed(seed)
    out = engine.generate([tok(r["prompt"])["input_ids"] for r in records], 1,
                          SamplingConfig(temperature=cfg.temperature, max_new_tokens=cfg.max_completion_length))
    texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
    paid = reward.score(texts, {"prompts": [r["prompt"] for r in records]})
    rule = countdown_reward(texts, nums=[r["nums"] for r in records], target=[r["target"] for r in records])
    samples = [{"prompt": r["prompt"], "completion": t, "paid": float(p), "rule": float(q or 0.0)}
               for r, t, p, q in zip(records, texts, paid, rule)]
    return {"steps": steps, "completions": steps * cfg.batch_size * cfg.num_generations,
            "mean_paid": float(np.mean(paid)), "rule_accuracy": float(np.mean([s["rule"] >= 1 for s in samples])),
            "samples": sorted(samples, key=lambda x: -x["paid"])}


def run_reward_study(out: str, rm: Path | None, seeds: str, extra: list[str]) -> None:
    """The study's uniform runs at pool 4,000 into ``out``, trained on the learned reward ``rm`` (None: the rule);
    finished runs are reused."""
    cmd = [sys.executable, "-m", "benchmarks.study", "--out", out, "--strategies", "uniform", "--pool-sizes", "4000",
           "--seeds", seeds, "--no-progress", *extra]
    if rm is not None:
        cmd += ["--set", f"reward={rm}"]
    subprocess.run(cmd, check=True, cwd=ROOT)


def report(learned: Path, rule: Path, classifier: dict, seeds: list[int]) -> dict:
    from lit_rlft.study.stats import mean_interval

    def runs(folder: Path) -> dict[int, dict]:  # the study's records, read from its study.json
        study = json.loads((folder / "study.json").read_text()) if (folder / "study.json").exists() else {"runs": []}
        return {r["seed"]: r for r in study["runs"] if r.get("strategy") == "uniform" and r.get("pool_size") == 4000
                and r.get("status") == "ok" and r["seed"] in seeds}

    lr, rr = runs(learned), runs(rule)
    common = sorted(set(lr) & set(rr))
    if not common:
        raise SystemExit(f"no seed has both a learned-reward run ({learned}) and a rule-reward run ({rule})")

    def final(run: dict, key: str = "val/accuracy/learnable") -> float:
        return float(run["curve"][-1][key])

    start = float(rr[common[0]]["curve"][0]["val/accuracy/learnable"])
    gains_rule = [final(rr[s]) - start for s in common]
    gains_learned = [final(lr[s]) - start for s in common]
    diffs = [final(lr[s]) - final(rr[s]) for s in common]
    paid = [float(np.mean([v for _, v in lr[s]["series"]["reward"][-20:]])) for s in common]
    # the learned reward's best evaluation, and the rule's at the same mark
    peaks = []
    for s in common:
        k = int(np.argmax([c["val/accuracy/learnable"] for c in lr[s]["curve"]]))
        at = lr[s]["curve"][k]
        rule_at = rr[s]["curve"][k]
        peaks.append({"completions": at["completions"], "learned": at["val/accuracy/learnable"],
                      "rule": rule_at["val/accuracy/learnable"],
                      "recovered": (at["val/accuracy/learnable"] - start) / (rule_at["val/accuracy/learnable"] - start)
                      if rule_at["val/accuracy/learnable"] != start else None})
    true_train = [float(lr[s]["curve"][-1]["train_pool_reward"]) for s in common]
    result = {
        "seeds": common, "warm_start_heldout": start,
        "rule_final_heldout": [final(rr[s]) for s in common], "learned_final_heldout": [final(lr[s]) for s in common],
        "recovered_share": float(np.mean(gains_learned) / np.mean(gains_rule)) if np.mean(gains_rule) else None,
        "learned_minus_rule": mean_interval(diffs),
        "learned_reward_paid_last20_steps": paid, "peaks": peaks, "rule_reward_of_training_pool_samples": true_train,
        "classifier": classifier,
        "curves": {"rule": {s: [(c["completions"], c["val/accuracy/learnable"], c["train_pool_reward"])
                                for c in rr[s]["curve"]] for s in common},
                   "learned": {s: [(c["completions"], c["val/accuracy/learnable"], c["train_pool_reward"])
                                   for c in lr[s]["curve"]] for s in common},
                   "learned_paid": {s: lr[s]["series"]["reward"] for s in common}},
    }
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, colour in (("rule", "tab:blue"), ("learned", "tab:orange")):
        for k, (_seed, curve) in enumerate(result["curves"][name].items()):
            xs, ys = [c[0] for c in curve], [c[1] for c in curve]
            a.plot(xs, ys, color=colour, alpha=0.8, label=f"{name} reward" if k == 0 else None)
    a.set_xlabel("completions")
    a.set_ylabel("held-out accuracy, 3+4 numbers (rule)")
    a.set_title("GRPO trained on the rule vs the learned reward")
    a.legend()
    for k, (seed, series) in enumerate(result["curves"]["learned_paid"].items()):
        steps = [s for s, _ in series]
        values = [v for _, v in series]
        window = 10
        smooth = [float(np.mean(values[max(0, i - window + 1): i + 1])) for i in range(len(values))]
        b.plot(steps, smooth, color="tab:orange", label="learned reward paid (batch mean)" if k == 0 else None)
        curve = result["curves"]["learned"][seed]
        per_step = 256  # completions per step (32 prompts x 8)
        b.plot([c[0] / per_step for c in curve], [c[2] for c in curve], "o--", color="tab:green",
               label="rule reward of the same policy (training-pool samples)" if k == 0 else None)
    b.set_xlabel("step")
    b.set_title("what the policy is paid vs what it earns")
    b.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rule-study", default="runs/bench", help="the study folder with uniform rule-reward runs")
    p.add_argument("--out", default="runs/learned_reward")
    p.add_argument("--prompts", type=int, default=3000)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side")
    p.add_argument("--quick", action="store_true", help="500 prompts, 1 epoch, seed 0, the study's --quick budget")
    a = p.parse_args()
    out = ROOT / a.out
    if a.quick:
        a.prompts, a.epochs, a.seeds = 500, 1, "0"
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    data_file = out / "data.jsonl"
    if not data_file.exists():
        rows = sample_data(str(ROOT / a.rule_study / "sft" / "model"), a.prompts, 4, seed=11)
        out.mkdir(parents=True, exist_ok=True)
        data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = [json.loads(line) for line in data_file.read_text().splitlines()]
    classifier_file = out / "classifier.json"
    if not classifier_file.exists():
        classifier_file.write_text(json.dumps(train_classifier(rows, out / "rm", a.epochs, seed=0), indent=1))
    classifier = json.loads(classifier_file.read_text())
    print(f"classifier: held-out accuracy {classifier['test_accuracy']:.3f}, AUC {classifier['test_auc']:.3f} "
          f"on {classifier['test_completions']} completions ({classifier['positive_share']:.0%} correct)")
    extra = ["--jobs", str(a.jobs)] + (["--quick"] if a.quick else [])
    # the rule-reward runs: the balanced study's own (its warm start is <rule-study>/sft/model), reused when done
    run_reward_study(a.rule_study, None, a.seeds, extra)
    run_reward_study(str(out / "study"), out / "rm", a.seeds, ["--warm-start", str(ROOT / a.rule_study / "sft" / "model"),
                                                          *extra])
    result = report(out / "study", ROOT / a.rule_study, classifier, [int(s) for s in a.seeds.split(",")])
    hacked_file = out / "hacked.json"
    if not hacked_file.exists():
        hacked_file.write_text(json.dumps(hacked_samples(str(ROOT / a.rule_study / "sft" / "model"), out / "rm",
                                                         steps=10 if a.quick else 80), indent=1))
    result["hacked"] = json.loads(hacked_file.read_text())
    result["command"] = "python -m benchmarks.learned_reward " + " ".join(sys.argv[1:])
    result["seconds"] = time.perf_counter() - t0
    name = "learned_reward_quick" if a.quick else "learned_reward"
    from lit_rlft.records.jsonio import write_result

    write_result(RESULTS / f"{name}.json", result)
    plot(result, ROOT / "docs" / "results" / f"{name}.png")
    share = result["recovered_share"]
    d = result["learned_minus_rule"]
    spread = "" if d["low"] is None else f" [{d['low']:+.3f}, {d['high']:+.3f}]"
    print(f"held-out 3+4 accuracy: warm start {result['warm_start_heldout']:.3f}; rule reward "
          f"{np.mean(result['rule_final_heldout']):.3f}; learned reward {np.mean(result['learned_final_heldout']):.3f}"
          f" (learned - rule {d['mean']:+.3f}{spread}); recovered "
          f"{'n/a' if share is None or not math.isfinite(share) else f'{share:.0%}'} of the rule's gain")
    for peak in result["peaks"]:
        print(f"  best evaluation of the learned reward: {peak['learned']:.3f} after {peak['completions']} completions "
              f"(rule reward at that mark {peak['rule']:.3f}; recovered "
              f"{'n/a' if peak['recovered'] is None else format(peak['recovered'], '.0%')} of its gain)")
    h = result["hacked"]
    print(f"after {h['completions']} completions on the learned reward: it pays {h['mean_paid']:.3f} on average for the "
          f"policy's samples, of which {h['rule_accuracy']:.0%} are correct; the best paid:")
    for sample in h["samples"][:5]:
        print(f"  {sample['prompt']}{sample['completion']!r}  paid {sample['paid']:.3f}, rule {sample['rule']:.1f}")
    print(f"learned reward paid (last 20 steps) {np.mean(result['learned_reward_paid_last20_steps']):.3f} vs rule "
          f"reward of the same policy's training-pool samples {np.mean(result['rule_reward_of_training_pool_samples']):.3f}")


if __name__ == "__main__":
    main()

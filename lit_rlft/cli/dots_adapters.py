"""``lit-rlft dots-adapters``: train DOTS' query/reference adapters offline from (prompt, success rate) pairs.

    lit-rlft dots-adapters --pairs runs/x/success_rates.jsonl --embedding-model runs/sft/model --out adapters.pt

Pairs come from any JSON-lines file with a prompt and a success rate (``SuccessRateRecorder`` writes one during
training; several rows for one prompt are averaged). 20% of the prompts are held out to report the predictor's
Pearson correlation before and after training. Use the result with ``DOTSCallback(adapters=..., embedding_model=...)``
(the same embedding model, or the adapters see different vectors).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from lit_rlft.data.loading import DataValidationError
from lit_rlft.models.embeddings import cached_embeddings
from lit_rlft.selection.dots import AttentionDifficultyPredictor, evaluate_predictor, fit_adapters, save_predictor


def read_pairs(path: Path, prompt_field: str, rate_field: str) -> tuple[list[str], np.ndarray]:
    """Prompts and their mean success rates from a JSON-lines file (errors name the line and field)."""
    rates: dict[str, list[float]] = defaultdict(list)
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt, rate = row[prompt_field], float(row[rate_field])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise DataValidationError(
                    f"{path}:{i}: needs '{prompt_field}' and a numeric '{rate_field}' ({e})"
                ) from None
            if not 0 <= rate <= 1 or not isinstance(prompt, str) or not prompt:
                raise DataValidationError(f"{path}:{i}: '{rate_field}' must be in [0, 1] and the prompt non-empty")
            rates[prompt].append(rate)
    prompts = sorted(rates)
    return prompts, np.array([np.mean(rates[p]) for p in prompts])


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(prog="lit-rlft dots-adapters", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=Path, required=True, help="JSON lines with a prompt and a success rate")
    p.add_argument("--embedding-model", required=True, help="HF model path whose mean-pooled states embed prompts")
    p.add_argument("--out", type=Path, required=True, help="where the trained predictor is written")
    p.add_argument("--prompt-field", default="prompt")
    p.add_argument("--rate-field", default="success_rate")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--reference-size", type=int, default=256)
    p.add_argument("--cache-dir", default=".cache/lit_rlft/embeddings")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if not a.pairs.is_file():
        p.error(f"--pairs: {a.pairs} does not exist")
    prompts, rates = read_pairs(a.pairs, a.prompt_field, a.rate_field)
    if len(prompts) < 10:
        raise SystemExit(f"{a.pairs}: {len(prompts)} distinct prompts; need at least 10")
    emb = cached_embeddings(prompts, a.embedding_model, a.cache_dir)
    difficulty = torch.tensor(1.0 - rates, dtype=torch.float32)
    perm = np.random.default_rng(a.seed).permutation(len(prompts))
    n_test = max(5, len(prompts) // 5)
    test, train = torch.from_numpy(perm[:n_test]), torch.from_numpy(perm[n_test:])
    k = min(a.reference_size, len(train) // 2)
    predictor = AttentionDifficultyPredictor(emb.shape[1])

    def held_out() -> dict[str, float]:
        # references from the training split, queries from the held-out split
        ids = torch.cat([train[:k], test])
        return evaluate_predictor(predictor, emb[ids], difficulty[ids], reference_size=k, seed=a.seed)

    before = held_out()
    fit_adapters(predictor, emb[train], difficulty[train], steps=a.steps, lr=a.lr, reference_size=k, seed=a.seed)
    after = held_out()
    meta = {"embedding_model": a.embedding_model, "pairs": str(a.pairs), "num_prompts": len(prompts),
            "pearson_before": before["pearson"], "pearson_after": after["pearson"]}
    save_predictor(a.out, predictor, meta)
    print(f"{len(prompts)} prompts; held-out Pearson {before['pearson']:.3f} -> {after['pearson']:.3f}; "
          f"wrote {a.out}")
    return meta

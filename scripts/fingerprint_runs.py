"""Fingerprints of seven short single-process runs: refactors of the step must leave them bit-identical.

    python scripts/fingerprint_runs.py --out runs/fingerprints/after.json
    python scripts/fingerprint_runs.py --compare benchmarks/results/fingerprints.json runs/fingerprints/after.json
    # an option that changes float rounding only: the same runs' learning curves, within a tolerance
    python scripts/fingerprint_runs.py --set optim.shared_prompt=true --out runs/fingerprints/shared.json
    python scripts/fingerprint_runs.py --compare-curves runs/fingerprints/after.json runs/fingerprints/shared.json

Each run trains the tiny policy for a few rollout steps under the Trainer (uniform, DPS + replay, DOTS, dynamic
sampling, several iterations with mini- and micro-batches, LoRA with a KL penalty, the real Countdown reward) and
records a digest of the final parameters and of every logged metric except wall times (``time/*`` and the
selection callbacks' ``overhead_s`` / ``reference_generation_s``) and diagnostics added since (:data:`ADDED`). Bit-identity holds on one machine and one torch
build: compare runs made on the same machine. The runs pin ``optim.shared_prompt: false`` (``auto`` is the default
since issue 37; ``--set optim.shared_prompt=true`` and ``--compare-curves`` check its curves within a tolerance).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import Logger  # noqa: E402

from lit_rlft.records.jsonio import write_result  # noqa: E402
from tests.distributed.helpers import digest  # noqa: E402

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1,
        "intermediate_size": 128, "head_dim": 64}
COIN = "tests.distributed.helpers.coin_reward"
WALL_TIME = ("time/", "overhead_s", "reference_generation_s", "generation_seconds")
#: Diagnostics added after the reference fingerprints were made (issue 17: the padding share of the training
#: passes; issue 27: generated tokens per purpose): left out so that every metric the reference runs logged is
#: compared, value for value.
ADDED = ("perf/", "budget/generated_tokens_")


class MemoryLogger(Logger):
    """Every logged scalar, by step (wall times left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        kept = {k: float(v) for k, v in metrics.items()
                if not any(w in k for w in WALL_TIME) and not k.startswith(ADDED) and k != "epoch"}
        self.rows.append((int(step or 0), kept))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def runs(cache: str) -> dict[str, dict[str, Any]]:
    """name -> (module options, callbacks factory, max_steps)."""
    from lit_rlft.callbacks import DOTSCallback, DPSCallback, DynamicSamplingCallback, ReplayCallback

    return {
        "uniform": {"module": {}, "callbacks": list, "steps": 3},
        "dps_replay": {"module": {}, "callbacks": lambda: [DPSCallback(decay=0.5),
                                                           ReplayCallback(delta=0.5, capacity=16)], "steps": 4},
        "dots": {"module": {}, "callbacks": lambda: [DOTSCallback(reference_size=6, update_every=2,
                                                                  online_steps_per_update=2, cache_dir=cache)],
                 "steps": 3},
        "dynamic_sampling": {"module": {}, "callbacks": lambda: [DynamicSamplingCallback(max_rounds=3)], "steps": 3},
        "mini_micro": {"module": {"num_iterations": 2, "num_mini_batches": 2, "micro_batch_size": 3},
                       "callbacks": list, "steps": 8},
        "lora_kl": {"module": {"lora": {"r": 4, "alpha": 8, "target_modules": "all-linear"}, "beta": 0.04},
                    "callbacks": list, "steps": 3},
        "real_reward": {"module": {"reward_funcs": ["lit_rlft.rewards.countdown_reward"], "temperature": 1.5},
                        "callbacks": list, "steps": 3},
    }


def make_module(**overrides: Any) -> Any:
    """The module of every run (the flat options of GRPOModule before 0.3 are mapped by :func:`module_kwargs`)."""
    from lit_rlft import GRPOModule
    from lit_rlft.models import LoRAConfig, TinyConfig

    kwargs: dict[str, Any] = dict(model="tiny", tiny=TinyConfig(**TINY), reward_funcs=[COIN], num_generations=4,
                                  max_completion_length=8, learning_rate=1e-3)
    kwargs.update(overrides)
    if isinstance(kwargs.get("lora"), dict):
        kwargs["lora"] = LoRAConfig(**kwargs["lora"])
    from lit_rlft.step.config import OptimConfig

    if "shared_prompt" in OptimConfig.__dataclass_fields__:  # auto by default since issue 37: the reference is off
        kwargs.setdefault("optim.shared_prompt", False)
    dotted = {k: kwargs.pop(k) for k in [k for k in kwargs if "." in k]}  # --set optim.shared_prompt=true
    nested = module_kwargs(kwargs)
    for key, value in dotted.items():
        import dataclasses

        from lit_rlft.step.config import GenerationConfig

        group, name = key.split(".", 1)
        given = nested.get(group) or {"optim": OptimConfig, "generation": GenerationConfig}[group]()
        nested[group] = dataclasses.replace(given, **{name: value})
    return GRPOModule(**nested)


def module_kwargs(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat options -> the constructor's arguments: nested configs since 0.3, as given before."""
    import inspect

    from lit_rlft import GRPOModule

    if "generation" not in inspect.signature(GRPOModule).parameters:
        return flat
    from lit_rlft.step.config import nest_flat_options

    return nest_flat_options(flat)


def fingerprint(name: str, spec: dict[str, Any], root: Path) -> dict[str, str]:
    from lit_rlft.data import CountdownTask, PromptDataModule

    L.seed_everything(0, verbose=False)
    module = make_module(**spec["module"])
    data = PromptDataModule(train=CountdownTask(size=64, split="train", seed=0), answer_field=None, batch_size=4)
    logger = MemoryLogger()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=spec["steps"], logger=logger,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=str(root / name), log_every_n_steps=1,
                        callbacks=spec["callbacks"]())
    trainer.fit(module, datamodule=data)
    params = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    return {"params": digest(params), "metrics": digest(logger.rows), "num_metric_rows": str(len(logger.rows)),
            "metric_names": digest(sorted({k for _, row in logger.rows for k in row})), "curves": logger.rows}


def compare_curves(before: dict[str, Any], after: dict[str, Any], rtol: float, atol: float) -> int:
    """Every metric both runs logged, step for step: ``|a - b| <= atol + rtol * |a|``. Prints each run's largest
    difference; returns the number of values outside the tolerance."""
    bad = 0
    for name in before:
        rows_a, rows_b = before[name]["curves"], after.get(name, {}).get("curves", [])
        worst, outside, n = (0.0, ""), 0, 0
        if [s for s, _ in rows_a] != [s for s, _ in rows_b]:
            print(f"{name:18s} DIFFERENT steps logged")
            bad += 1
            continue
        for (step, a), (_, b) in zip(rows_a, rows_b):
            for key in a.keys() & b.keys():
                x, y = (math.nan if v is None else v for v in (a[key], b[key]))  # NaN is written as null
                if x != x and y != y:  # both NaN
                    continue
                n += 1
                diff = abs(x - y)
                outside += diff > atol + rtol * abs(x)
                if diff > worst[0]:
                    worst = (diff, f"{key} at step {step}: {x:.6g} vs {y:.6g}")
        bad += outside
        print(f"{name:18s} {n:5d} values, {outside} outside; largest difference {worst[0]:.2e} ({worst[1]})")
    return bad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="write the fingerprints here (JSON)")
    p.add_argument("--only", nargs="*", help="run only these")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="compare two JSON files")
    p.add_argument("--compare-curves", nargs=2, type=Path, metavar=("BEFORE", "AFTER"),
                   help="compare the logged metrics of two JSON files value for value, within --rtol / --atol")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--set", nargs="*", default=[], metavar="OPTION=VALUE",
                   help="an option for every run: a GRPOModule flat option or group.field (optim.shared_prompt=true); "
                        "JSON values")
    a = p.parse_args()
    if a.compare_curves:
        before, after = (json.loads(f.read_text())["runs"] for f in a.compare_curves)
        sys.exit(1 if compare_curves(before, after, a.rtol, a.atol) else 0)
    if a.compare:
        before, after = (json.loads(f.read_text())["runs"] for f in a.compare)
        bad = 0
        for name in before:
            for key, value in before[name].items():
                if key == "curves":  # the digests above compare them bit for bit
                    continue
                ok = after.get(name, {}).get(key) == value
                bad += not ok
                print(f"{name:18s} {key:16s} {'same' if ok else 'DIFFERENT'}")
        sys.exit(1 if bad else 0)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        specs = runs(str(Path(tmp) / "emb"))
        for option in a.set:
            key, _, value = option.partition("=")
            for spec in specs.values():
                spec["module"][key] = json.loads(value)
        names = a.only or list(specs)
        result = {name: fingerprint(name, specs[name], Path(tmp)) for name in names}
    for name, fp in result.items():
        print(name, {k: v for k, v in fp.items() if k != "curves"})
    if a.out:
        write_result(a.out, {"runs": result})


if __name__ == "__main__":
    main()

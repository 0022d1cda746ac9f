"""``lit-rlft bench``: every data-selection strategy on the same Countdown pool, warm start, seeds and rollout budget.

    python -m lit_rlft.cli bench --out runs/bench                      # the full study (about 2-3 hours)
    python -m lit_rlft.cli bench --quick --warm-start runs/sft/model   # every strategy once, under 15 minutes
    python -m lit_rlft.cli bench --strategies uniform,dps --seeds 0,1,2 --pool-sizes 4000 --budget-completions 51200

(``lit-rlft bench ...`` once the package is installed.) Re-running the same command resumes: a run whose JSON says
``ok`` and was made with the same run settings (``StudyConfig.run_fingerprint``) is reused, anything else is run
again; ``study.json``, ``results.md`` and the plots are always rebuilt from all run files.

Modules, one concept each: :mod:`~lit_rlft.bench.config` (``StudyConfig``, ``RunSpec``), ``tasks`` (pool, held-out
set, fixed training subset), ``strategies`` (callbacks per strategy), ``rollouts`` / ``evaluation`` (measurement
rollouts, ``EvalCallback``), ``degeneracy``, ``warm_start``, ``run_one`` (one run, also ``python -m``), ``runner``
(subprocesses, resume, tqdm), ``stats`` / ``derived`` (targets, censored crossings, intervals), ``report``
(results.md), ``plots``, ``study`` (end to end), ``cli``.

Design of the full study (``StudyConfig()`` defaults)
----------------------------------------------------
- Task: Countdown, numbers 1-15, targets 0-99; training pool ``CountdownTask(size=N, num_numbers=[2, 3, 4],
  split="train", seed=1)``; held-out set 1,800 prompts (``split="test"``, seed 2; about 600 per bucket), two
  samples per prompt at T=1; "learnable" accuracy pools the 3- and 4-number buckets. ``train_pool_reward``: a fixed
  256-prompt subset of the pool, 4 samples each at T=1. Degeneracy of each pool under the warm start (1,024
  prompts x G=8): 58-64% of groups all-correct or all-wrong in the checks so far (pools 1000 and 4000), which meets
  the issue's "at least half" without 5-number problems (``--five-numbers`` adds them).
- Runs: main comparison at pool 4,000 with seeds 0, 1, 2 (8 strategies x 3 = 24 runs); pool-size sweep at 1,000
  and 16,000 with seed 0 (16 runs); 40 runs, two side by side (one thread each).
- Budget: 51,200 completions per run, every purpose counted (= 200 uniform steps of B=32 x G=8). DOTS and the
  cold start spend 64 of every 320 completions on reference sets (32 prompts x G=8 every 4 steps), so about 160
  steps; dynamic sampling spends its discarded rounds (about 2/3 of its completions at the start) so far fewer
  steps; replay generates 16 fresh groups per step, so about 400 steps. ``max_steps`` is 10x the uniform steps, a
  backstop only. Evaluation at the start and every 6,400 completions (8 points).
- GRPO as ``configs/countdown_tiny.yaml``: B=32, G=8, T=1, 16 new tokens, lr 1e-4 (20 warm-up steps), dapo loss,
  group scaling. DPS decay 0.5; DOTS alpha 0.5, tau 1e-3; replay delta 0.5, capacity 256; dynamic sampling up to
  10 rounds.

Time estimate (measured with ``--quick`` while another 2-thread training process shared the 2 cores): a uniform
step took 1.9 s, a full evaluation (1,800 x 2 + 256 x 4 samples) about 10 s, a run's start about 8 s; per
12,288-completion budget the 8 strategies trained 52-110 s each (mean 89 s; replay and uniform the slowest,
dynamic sampling the fastest). Scaled to 51,200 completions: about 370 s of training + 95 s of evaluation + 8 s
per run, 40 runs / 2 jobs = about 2.6 hours, plus under a minute of degeneracy checks and, without
``--warm-start``, the one-time SFT (750 steps, about 5-10 minutes on one thread). On an otherwise idle machine
steps are faster (the platform notes give 1.15-1.35 s), so expect about 2 hours. ``--quick`` took 7.6 minutes
(8 runs, pool 1,000, 12,288 completions, 300 held-out prompts) under the same load.
"""

from lit_rlft.bench.config import STRATEGIES, RunSpec, StudyConfig

__all__ = ["STRATEGIES", "RunSpec", "StudyConfig"]

"""``python -m benchmarks.study``: every data-selection strategy on the same Countdown pool, warm start, seeds and rollout budget.

    python -m benchmarks.study --out runs/bench                      # the full study (about 2.5 hours)
    python -m benchmarks.study --quick --warm-start runs/sft/model   # every strategy once, under 15 minutes
    python -m benchmarks.study --strategies uniform,dps --seeds 0,1,2 --pool-sizes 4000 --budget-completions 38400

(From the repository root.) Re-running the same command resumes: a run whose JSON says
``ok``, was made with the same shared settings (``StudyConfig.run_fingerprint``) and recorded the callback settings
its strategy gets now is reused, anything else is run again; ``study.json``, ``results.md`` and the plots are
always rebuilt from all run files.

The study is one config of the product (``lit-rlft study``, :mod:`lit_rlft.study`): each pool size is a study of
the product on the run config :meth:`StudyConfig.run_config` writes (``<out>/pool<N>/run.yaml``: the Countdown pool
and held-out set, the warm start, ``configs/countdown_tiny.yaml``'s GRPO), with the strategies, seeds, budget, marks
and evaluation of :meth:`StudyConfig.study_settings`; the runs, the evaluator, resume, the statistics and the
summaries are the product's. What is the Countdown study's own is here: :mod:`~benchmarks.study.config`
(``StudyConfig``, ``RunSpec``, the targets and comparisons), ``tasks`` (pool, held-out set), ``warm_start``,
``degeneracy`` and ``rollouts`` (each pool's degenerate groups under the warm start), ``study`` (end to end),
``report`` (results.md), ``cli``, ``recorded`` (a recorded study read back), ``trl_tables`` (the time-to-TRL
tables), ``passes`` and ``docs`` (the generated parts of ``docs/results.md`` and the README). This package is the
library of the benchmark scripts (``benchmarks/<name>.py``): none of its modules imports a script.

Design of the full study (``StudyConfig()`` defaults)
----------------------------------------------------
- Task: Countdown, numbers 1-15, targets 0-99; training pool ``CountdownTask(size=N, num_numbers=[2, 3, 4],
  split="train", seed=1)``; held-out set 1,800 prompts (``split="test"``, seed 2; about 600 per bucket), two
  samples per prompt at T=1; "learnable" accuracy pools the 3- and 4-number buckets. ``train_pool_reward``: a fixed
  256-prompt subset of the pool, 4 samples each at T=1. Degeneracy of each pool under the warm start (1,024
  prompts x G=8): 58-64% of groups all-correct or all-wrong in the checks so far (pools 1000 and 4000), which meets
  the issue's "at least half" without 5-number problems (``--five-numbers`` adds them).
- Runs: main comparison at pool 4,000 with seeds 0, 1, 2 (19 strategies x 3 = 57 runs); the multi-epoch setting at
  pool 1,000 with the 7 strategies of ``SWEEP_STRATEGIES`` and the same seeds (21 runs); 78 runs, two side by side
  (one thread each). ``--skewed`` runs the same on the skewed pool (``StudyConfig.skewed()``).
- Budget: 38,400 completions per run, every purpose counted (= 150 uniform steps of B=32 x G=8). DOTS and the
  cold start spend 64 of every 320 completions on reference sets (32 prompts x G=8 every 4 steps), so 120 steps;
  dynamic sampling spends its discarded rounds (about 2/3 of its completions) so about 50 steps; replay generates
  16 fresh groups per step, so 200-300 steps. ``max_steps`` is 10x the uniform steps, a backstop only. Evaluation
  at the start and every 6,400 completions (``StudyConfig.eval_marks``).
- GRPO as ``configs/countdown_tiny.yaml`` (the ``StudyConfig`` GRPO fields). Strategy settings: the overlays of
  ``configs/study/`` with ``StudyConfig.overrides`` (``--set DOTSCallback.alpha=0.3``, as ``lit-rlft study`` takes it); every run
  records its callbacks' full arguments, and ``results.md`` / ``docs/results.md`` print them from that record
  (``python -m benchmarks.study.docs`` regenerates the page's generated blocks).

Time: see ``docs/results.md`` for the measured wall time of the full study (about 2 h 20 min for 54 runs with two
jobs on the 2-core machine, about 2.6 min per run and job). ``--quick`` took about 14 minutes from a fresh clone with
11 strategies (pool 1,000, 12,288 completions, 300 held-out prompts, the warm start included); with 19 it runs 19
runs, proportionally longer (not re-measured).
"""

from benchmarks.study.config import STRATEGIES, RunSpec, StudyConfig

__all__ = ["STRATEGIES", "RunSpec", "StudyConfig"]

"""Which strategy pays on my data? ``lit-rlft study`` (and :func:`run_study`): several arms of one run config at an
equal budget of completions, measured by one evaluator, reported with paired intervals.

    lit-rlft study --config my_run.yaml --strategies uniform,dps,mopps,greso --seeds 0,1,2 \
        --completions 40000 --eval-every 5000 --jobs 2 --out runs/study

Each arm is a normal ``lit-rlft fit`` of the user's config with the arm's callbacks (a shipped strategy or the
user's own overlay file), the budget stop and :class:`StudyCallback` (the measurement) added
(:mod:`~lit_rlft.study.compose`); every run is evaluated on the config's held-out data with the config's reward at the
same completion marks, with one seed for every arm (:mod:`~lit_rlft.study.evaluation`). The report
(:mod:`~lit_rlft.study.report`) gives each arm's final accuracy minus the baseline's, paired over seeds with an
interval; the completions and training wall-clock to the baseline's final accuracy by one first-crossing rule (the
baseline's own included: :mod:`~lit_rlft.study.summary`); the completions wasted on groups without reward spread;
the selection overhead; and a sentence per arm saying whether its difference is beyond the spread.

Modules, one concept each: ``strategies`` (the arms), ``compose`` (each run's config), ``evaluation`` (the one
evaluator), ``callback`` (what a run measures), ``runner`` (processes, resume, progress), ``stats`` / ``summary``
(crossings, intervals, paired figures), ``report`` / ``plots`` (markdown, PNG), ``environment`` (what a result was
measured with), ``trl_arm`` (TRL's trainer as an arm), ``settings`` (a study's settings), ``study`` (end to end),
``cli`` (``lit-rlft study``).
"""

from lit_rlft.study.callback import StudyCallback
from lit_rlft.study.evaluation import EvalSettings, HeldOutEvaluator
from lit_rlft.study.settings import StudySettings
from lit_rlft.study.strategies import STRATEGIES
from lit_rlft.study.study import StudyError, run_study

__all__ = ["STRATEGIES", "EvalSettings", "HeldOutEvaluator", "StudyCallback", "StudyError",
           "StudySettings", "run_study"]

"""DPSCallback: dynamics-predictive sampling (a per-prompt HMM over unsolved / partial / solved)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_rlft.callbacks.difficulty import DifficultyPredictorConfig, build_dots_selector, refresh_reference
from lit_rlft.callbacks.selection import SelectionCallback
from lit_rlft.core.state import decode_state, encode_state
from lit_rlft.selection.base import STATE_NAMES, state_of
from lit_rlft.selection.dots import DOTSSelector, pearson
from lit_rlft.selection.dps import DPSSelector, PredictionTracker, cold_start_belief
from lit_rlft.step.context import StepContext, StepOutput


class DPSCallback(SelectionCallback):
    """Train on the prompts most likely to be *partially solved* next step, predicted before generating anything.

    Each prompt's solving state follows a hidden Markov model whose Dirichlet transition counts are updated online
    from the binary correctness of its groups (see ``lit_rlft.selection.dps``). Logs ``dps/effective_ratio`` of
    the fresh batch, the prediction accuracy and partial-state precision / recall / F1 of the batch just observed,
    running totals, and the 3x3 confusion matrix as TensorBoard text.

    Example::

        trainer = L.Trainer(callbacks=[DPSCallback(decay=0.5, prior="uniform")])

    Args:
        decay: lambda in (0, 1]: how much of the transition counts survives a step (0.5 Countdown, 0.7 MATH).
        prior: Dirichlet prior of the transitions: ``uniform``, ``progress``, ``stability`` or ``local``.
        entropy_bonus: score = P(partial) + entropy_bonus * entropy(belief), for extra exploration.
        confusion_every_n_steps: how often the running confusion matrix is written as text.
        cold_start: give never-seen prompts an initial belief from DOTS' predicted success rate ``p`` instead of
            the uniform one: P(unsolved) = (1-p)^G, P(solved) = p^G, the rest partial (not in either paper).
            Its reference rollouts are charged to the budget; with ``DifficultyPredictorConfig(reference=
            "observed")`` there are none: the prompts DPS observed last are the reference set (a content prior
            that costs no rollouts, from the second step on).
        candidate_ratio: rank a fresh candidate set of ``candidate_ratio * B`` prompts each step (a shuffled epoch
            of the pool, as the reference code's loader), not the whole pool (``None``). The paper's scripts: 8 on
            Countdown, 32 on MATH (which is the whole pool there).
        seed: tie-breaking seed (and the candidate stream's).
    """

    name = "dps"
    predicts_success = True  # its strategy has spread_probabilities: AllocationCallback allocates from it

    def __init__(self, decay: float = 0.5, prior: str = "uniform", entropy_bonus: float = 0.0,
                 confusion_every_n_steps: int = 50, cold_start: DifficultyPredictorConfig | None = None,
                 candidate_ratio: int | None = None, seed: int = 0):
        super().__init__(seed=seed)
        if confusion_every_n_steps < 1:
            raise ValueError(f"DPSCallback: confusion_every_n_steps must be >= 1, got {confusion_every_n_steps}")
        self.cold_start = cold_start
        self.cold: DOTSSelector | None = None
        self.embedding_key: str | None = None  # cache key of the cold start's pool embeddings
        self._cold_success: np.ndarray | None = None  # [S] predicted success rates (cold start)
        self.decay, self.prior, self.entropy_bonus = decay, prior, entropy_bonus
        self.candidate_ratio = candidate_ratio
        self.confusion_every_n_steps = confusion_every_n_steps
        DPSSelector(1, decay=decay, prior=prior, entropy_bonus=entropy_bonus,
                    candidate_ratio=candidate_ratio)  # validate the options now
        self.step_tracker = PredictionTracker()
        self.tracker = PredictionTracker()  # running over the whole run

    def build(self, ctx: StepContext, num_prompts: int) -> DPSSelector:
        if self.cold_start is not None:
            resume_key = (self._pending_state or {}).get("embedding_key")
            self.cold, self.embedding_key = build_dots_selector(self.cold_start, ctx, alpha=0.5, tau=1.0,
                                                                seed=self.seed, resume_key=resume_key)
        return DPSSelector(num_prompts, decay=self.decay, prior=self.prior, entropy_bonus=self.entropy_bonus,
                           candidate_ratio=self.candidate_ratio, seed=self.seed)

    def before_select(self, ctx: StepContext, step: int) -> None:
        if self.cold is None:
            return
        if self.cold.needs_reference(step):
            self._cold_reference_pearson = refresh_reference(self.cold, ctx, self.rng, self.cold_start.reference)
            self._cold_success = None
        if self.cold.reference is None:  # reference="observed" before anything was observed: no prior yet
            return
        if self._cold_success is None:  # predicted success rate of every prompt, from the latest reference set
            self._cold_success = 1.0 - self.cold.predict().double().numpy()
        # Re-applied every step: with uninformative transition counts an unseen prompt's belief would otherwise
        # relax back to uniform after one prediction step.
        unseen = np.flatnonzero(~self.strategy.seen)
        if unseen.size:
            self.strategy.init_belief(unseen, cold_start_belief(self._cold_success[unseen], ctx.num_generations))

    def before_observe(self, prompt_ids: np.ndarray, success_rates: np.ndarray, step: int) -> dict[str, float]:
        predicted = self.strategy.predict_states(prompt_ids)
        observed = state_of(success_rates)
        self.step_tracker.reset()
        self.step_tracker.update(predicted, observed)
        self.tracker.update(predicted, observed)
        out = {f"dps/{k}": v for k, v in self.step_tracker.metrics().items()}
        out.update({f"dps/running_{k}": v for k, v in self.tracker.metrics().items()})
        out["dps/predicted_partial_mean"] = float(self.strategy.prob_partial(prompt_ids).mean())
        cand = self.strategy.last_candidates
        out["dps/candidates"] = float(self.strategy.num_prompts if cand is None else cand.size)
        if self.cold is not None:
            if self._cold_success is not None:  # the predictions that were in force when these prompts were chosen
                r = pearson(1.0 - self._cold_success[prompt_ids], 1.0 - success_rates)
                if np.isfinite(r):
                    out["dps/cold_start_pearson"] = float(r)
            self.cold.observe(prompt_ids, success_rates, step)  # online fit of the cold-start predictor
            r_ref = getattr(self, "_cold_reference_pearson", float("nan"))
            if np.isfinite(r_ref):
                out["dps/cold_start_reference_pearson"] = r_ref
                self._cold_reference_pearson = float("nan")
        return out

    def after_step(self, ctx: StepContext, output: StepOutput) -> None:
        super().after_step(ctx, output)
        if (ctx.rollout_step - 1) % self.confusion_every_n_steps == 0:
            ctx.log_text("dps/confusion", confusion_markdown(self.tracker.confusion))

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state:
            state["tracker"] = encode_state(self.tracker.state_dict())
            if self.cold is not None:
                state["cold_start"] = encode_state(self.cold.state_dict())
                state["embedding_key"] = self.embedding_key
                state["cold_success"] = encode_state(self._cold_success)
        return state

    def _load(self, state: dict[str, Any]) -> None:
        super()._load(state)
        if "tracker" in state:
            self.tracker.load_state_dict(decode_state(state["tracker"]))
        if self.cold is not None and "cold_start" in state:
            self.cold.load_state_dict(decode_state(state["cold_start"]))
            self._cold_success = decode_state(state.get("cold_success"))


def confusion_markdown(confusion: np.ndarray) -> str:
    """A 3x3 confusion matrix (rows observed, columns predicted) as a markdown table."""
    header = "| observed \\ predicted | " + " | ".join(STATE_NAMES) + " |"
    rows = [header, "|---|---|---|---|"]
    for o, name in enumerate(STATE_NAMES):
        rows.append(f"| {name} | " + " | ".join(str(int(c)) for c in confusion[o]) + " |")
    return "\n".join(rows)

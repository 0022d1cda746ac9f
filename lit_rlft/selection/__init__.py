"""Online data selection, Lightning-free (numpy only): which prompts to roll out next.

Strategies share :class:`~lit_rlft.selection.base.SelectionStrategy` (``observe`` / ``select`` / ``state_dict`` /
``load_state_dict``): :class:`UniformSampler` (plain GRPO), :class:`HistoryResampler` (SRPO), :class:`DPSSelector`
(dynamics-predictive sampling). :class:`DynamicFilter` is the bookkeeping of DAPO's dynamic sampling, which filters
rollouts instead of choosing prompts. DOTS (``lit_rlft.selection.dots``, torch) and the rollout-replay buffer
(``lit_rlft.selection.replay``) are imported from their modules.
"""

from lit_rlft.selection.base import (
    NUM_STATES,
    PARTIAL,
    SOLVED,
    STATE_NAMES,
    UNSOLVED,
    SelectionStrategy,
    effective_ratio,
    state_of,
    validate_batch_size,
    validate_observation,
)
from lit_rlft.selection.dps import PRIORS, DPSSelector, PredictionTracker, cold_start_belief, prior_matrix
from lit_rlft.selection.dynamic import DynamicFilter, FilterResult, FilterRound, keep_mask
from lit_rlft.selection.history import HistoryResampler
from lit_rlft.selection.uniform import EpochBatcher, UniformSampler

__all__ = [
    "NUM_STATES",
    "PARTIAL",
    "PRIORS",
    "SOLVED",
    "STATE_NAMES",
    "UNSOLVED",
    "DPSSelector",
    "DynamicFilter",
    "EpochBatcher",
    "FilterResult",
    "FilterRound",
    "HistoryResampler",
    "PredictionTracker",
    "SelectionStrategy",
    "UniformSampler",
    "cold_start_belief",
    "effective_ratio",
    "keep_mask",
    "prior_matrix",
    "state_of",
    "validate_batch_size",
    "validate_observation",
]

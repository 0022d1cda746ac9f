"""Online data selection, Lightning-free (numpy / torch only): which prompts to roll out next.

Strategies share :class:`~lit_rlft.selection.base.SelectionStrategy` (``observe`` / ``select`` / ``state_dict`` /
``load_state_dict``): :class:`UniformSampler` (plain GRPO), :class:`HistoryResampler` (SRPO), :class:`DPSSelector`
(dynamics-predictive sampling), :class:`DOTSSelector` (difficulty-targeted online selection, with its
:class:`AttentionDifficultyPredictor`), :class:`MoPPSSelector` (Thompson sampling of Beta posteriors) and
:class:`GRESOSelector` (pre-rollout skipping of zero-variance prompts). :class:`CandidateStream` draws the candidate
sets that DPS and MoPPS rank. :class:`DynamicFilter` is the bookkeeping of DAPO's dynamic sampling, which
filters rollouts instead of choosing prompts. :class:`ReplayBuffer` (of :class:`StoredGroup`) is the rollout-replay
buffer. DOTS' other building blocks (calibration, Gumbel-top-k sampling, offline adapter training, persistence) are
exported by ``lit_rlft.selection.dots``.
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
    top_k_random_ties,
    validate_batch_size,
    validate_observation,
)
from lit_rlft.selection.dots import AttentionDifficultyPredictor, DOTSSelector
from lit_rlft.selection.dps import PRIORS, DPSSelector, PredictionTracker, cold_start_belief, prior_matrix
from lit_rlft.selection.dynamic import DynamicFilter, FilterResult, FilterRound, keep_mask
from lit_rlft.selection.greso import GRESOSelector
from lit_rlft.selection.history import HistoryResampler
from lit_rlft.selection.mopps import MoPPSSelector
from lit_rlft.selection.replay import ReplayBuffer, StoredGroup, validate_replay_config
from lit_rlft.selection.uniform import CandidateStream, EpochBatcher, UniformSampler

__all__ = [
    "NUM_STATES",
    "PARTIAL",
    "PRIORS",
    "SOLVED",
    "STATE_NAMES",
    "UNSOLVED",
    "AttentionDifficultyPredictor",
    "CandidateStream",
    "DOTSSelector",
    "DPSSelector",
    "DynamicFilter",
    "EpochBatcher",
    "FilterResult",
    "FilterRound",
    "GRESOSelector",
    "HistoryResampler",
    "MoPPSSelector",
    "PredictionTracker",
    "ReplayBuffer",
    "SelectionStrategy",
    "StoredGroup",
    "UniformSampler",
    "cold_start_belief",
    "effective_ratio",
    "keep_mask",
    "prior_matrix",
    "state_of",
    "top_k_random_ties",
    "validate_batch_size",
    "validate_observation",
    "validate_replay_config",
]

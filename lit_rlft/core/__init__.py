"""Pure-torch maths of GRPO: advantages, per-token log-probs, losses. No Lightning, no transformers."""

from lit_rlft.core.advantages import ScaleRewards, effective_ratio, group_advantages, keep_mask, success_rates
from lit_rlft.core.aggregations import AGGREGATIONS, Aggregation
from lit_rlft.core.entropy_control import AdaptiveEntropyCoef
from lit_rlft.core.logprobs import completion_logprobs, entropy_from_logits, selective_log_softmax
from lit_rlft.core.loss_masks import (
    LOSS_MASKS,
    entropy_threshold,
    high_entropy_mask,
    loss_token_mask,
    off_policy_sequence_mask,
)
from lit_rlft.core.losses import (
    LOSS_TYPES,
    GRPOLoss,
    ImportanceSamplingLevel,
    LossOutput,
    LossType,
    LossTypeSpec,
    MismatchCorrection,
    OffPolicyForm,
    constant_length_sum,
    k3_kl,
    sequence_mean,
    sequence_sum_mean,
    token_mean,
)
from lit_rlft.core.surrogates import SURROGATES, Surrogate, SurrogateInput, SurrogateOutput

__all__ = [
    "AGGREGATIONS",
    "LOSS_MASKS",
    "LOSS_TYPES",
    "SURROGATES",
    "AdaptiveEntropyCoef",
    "Aggregation",
    "GRPOLoss",
    "ImportanceSamplingLevel",
    "LossOutput",
    "LossType",
    "LossTypeSpec",
    "MismatchCorrection",
    "OffPolicyForm",
    "ScaleRewards",
    "Surrogate",
    "SurrogateInput",
    "SurrogateOutput",
    "completion_logprobs",
    "constant_length_sum",
    "effective_ratio",
    "entropy_from_logits",
    "entropy_threshold",
    "group_advantages",
    "high_entropy_mask",
    "k3_kl",
    "keep_mask",
    "loss_token_mask",
    "off_policy_sequence_mask",
    "selective_log_softmax",
    "sequence_mean",
    "sequence_sum_mean",
    "success_rates",
    "token_mean",
]

"""Pure-torch maths of GRPO: advantages, per-token log-probs, losses. No Lightning, no transformers."""

from lit_rlft.core.advantages import ScaleRewards, group_advantages, success_rates
from lit_rlft.core.logprobs import completion_logprobs, entropy_from_logits, selective_log_softmax
from lit_rlft.core.losses import (
    AGGREGATIONS,
    GRPOLoss,
    LossOutput,
    LossType,
    OffPolicyForm,
    constant_length_sum,
    k3_kl,
    sequence_mean,
    token_mean,
)

__all__ = [
    "AGGREGATIONS",
    "GRPOLoss",
    "LossOutput",
    "LossType",
    "OffPolicyForm",
    "ScaleRewards",
    "completion_logprobs",
    "constant_length_sum",
    "entropy_from_logits",
    "group_advantages",
    "k3_kl",
    "selective_log_softmax",
    "sequence_mean",
    "success_rates",
    "token_mean",
]

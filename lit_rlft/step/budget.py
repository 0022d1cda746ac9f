"""Running totals of what rollouts cost, so strategies can be compared on cost as well as on accuracy."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RolloutBudget:
    """Cumulative rollout cost. Every rollout counts: training, reference sets, filtered-out candidates.

    ``by_purpose`` splits completions by why they were generated (``train``, ``reference``, ``filtered``, ...);
    ``tokens_by_purpose`` and ``tool_calls_by_purpose`` split the generated tokens (the policy's own: observations
    inside multi-turn episodes are not generated) and the environments' tool calls the same way.
    """

    prompts: int = 0
    completions: int = 0
    tokens: int = 0
    generation_s: float = 0.0
    by_purpose: dict[str, int] = field(default_factory=dict)
    tool_calls: int = 0
    tokens_by_purpose: dict[str, int] = field(default_factory=dict)
    tool_calls_by_purpose: dict[str, int] = field(default_factory=dict)

    def add(self, prompts: int, completions: int, tokens: int, seconds: float, purpose: str,
            tool_calls: int = 0) -> None:
        self.prompts += prompts
        self.completions += completions
        self.tokens += tokens
        self.generation_s += seconds
        self.tool_calls += tool_calls
        self.by_purpose[purpose] = self.by_purpose.get(purpose, 0) + completions
        self.tokens_by_purpose[purpose] = self.tokens_by_purpose.get(purpose, 0) + tokens
        self.tool_calls_by_purpose[purpose] = self.tool_calls_by_purpose.get(purpose, 0) + tool_calls

    def metrics(self) -> dict[str, float]:
        """TensorBoard scalars under ``budget/``."""
        out = {
            "budget/prompts": float(self.prompts),
            "budget/completions": float(self.completions),
            "budget/generated_tokens": float(self.tokens),
            "budget/generation_seconds": self.generation_s,
        }
        out.update({f"budget/completions_{k}": float(v) for k, v in self.by_purpose.items()})
        out.update({f"budget/generated_tokens_{k}": float(v) for k, v in self.tokens_by_purpose.items()})
        if self.tool_calls:  # runs with an environment
            out["budget/tool_calls"] = float(self.tool_calls)
            out.update({f"budget/tool_calls_{k}": float(v) for k, v in self.tool_calls_by_purpose.items()})
        return out

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            if hasattr(self, k):
                setattr(self, k, dict(v) if isinstance(v, dict) else v)

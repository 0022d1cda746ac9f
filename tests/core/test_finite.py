"""NaN and infinite settings are refused where they are given, naming the option (lit_rlft.core.finite), in every
config class: ``temperature: nan`` passes a ``<= 0`` check and gave NaN log-probs silently."""

from __future__ import annotations

import math

import pytest

from lit_rlft.core.finite import check_finite, nonfinite_paths


def test_paths_of_every_nonfinite_number_in_nested_values():
    value = {"a": 1.0, "b": [0.5, math.nan, {"c": math.inf}], "d": True, "e": "nan", "f": -math.inf}
    assert list(nonfinite_paths(value, "x")) == ["x.b[1]", "x.b[2].c", "x.f"]
    assert list(nonfinite_paths({"a": 1, "b": [2.0]}, "")) == []


def _configs():
    from lit_rlft import GenerationConfig, GRPOLoss
    from lit_rlft.step.config import OptimConfig

    return [
        (lambda: GenerationConfig(temperature=math.nan), "temperature", "nan"),
        (lambda: GenerationConfig(top_p=math.inf), "top_p", "inf"),
        (lambda: OptimConfig(learning_rate=math.nan), "learning_rate", "nan"),
        (lambda: GRPOLoss(epsilon=-math.inf), "epsilon", "-inf"),
    ]


@pytest.mark.parametrize("i", range(4))
def test_every_config_class_refuses_nan_and_inf_naming_the_field(i):
    build, field, shown = _configs()[i]
    with pytest.raises(ValueError, match=rf"\.{field} must be a finite number, got {shown}$"):
        build()


def test_a_grpo_config_refuses_a_nan_reward_weight():
    from lit_rlft import GRPOConfig

    with pytest.raises(ValueError, match=r"reward_weights\[0\] must be a finite number, got nan"):
        GRPOConfig(reward_weights=[math.nan])


def test_check_finite_passes_finite_values():
    from lit_rlft import GenerationConfig

    check_finite(GenerationConfig(temperature=0.7), "model.generation")

"""``--set``: one argument of the arms' callbacks changed, in every arm that has the callback or in one arm."""

from __future__ import annotations

import pytest

from lit_rlft.study.overrides import apply_overrides, parse_override
from lit_rlft.study.strategies import ArmError, resolve_arm


def _arms(*names):
    return {name: resolve_arm(name) for name in names}


def _apply(arms, *texts):
    return apply_overrides(arms, [parse_override(t) for t in texts])


def _args(arm, callback, seed=0):
    return next(s["args"] for s in arm.settings(seed) if s["callback"] == callback)


def test_an_override_without_an_arm_changes_every_arm_with_that_callback():
    arms = _arms("uniform", "dps", "dps_c8", "mopps")
    out, unused = _apply(arms, "DPSCallback.decay=0.7")
    assert unused == []
    assert _args(out["dps"], "DPSCallback")["decay"] == _args(out["dps_c8"], "DPSCallback")["decay"] == 0.7
    assert out["mopps"] == arms["mopps"] and out["uniform"] == arms["uniform"]
    # the rest of each arm as its overlay gives it
    assert _args(out["dps_c8"], "DPSCallback") == {**_args(arms["dps_c8"], "DPSCallback"), "decay": 0.7}


def test_an_override_with_an_arm_changes_that_arm_only_and_the_last_one_wins():
    arms = _arms("dps", "dps_c8", "dps_c8_handback")
    out, _ = _apply(arms, "dps_c8:DPSCallback.candidate_ratio=4", "dps_c8:DPSCallback.candidate_ratio=2")
    assert _args(out["dps_c8"], "DPSCallback")["candidate_ratio"] == 2
    assert _args(out["dps_c8_handback"], "DPSCallback")["candidate_ratio"] == 8
    assert _args(out["dps"], "DPSCallback")["candidate_ratio"] is None
    out, _ = _apply(arms, "dps_c8_handback:UniformHandbackCallback.end_passes=6")
    assert _args(out["dps_c8_handback"], "UniformHandbackCallback")["end_passes"] == 6
    assert _args(out["dps_c8_handback"], "UniformHandbackCallback")["seed"] == 0  # the run's seed, still given


def test_a_nested_field_changes_only_the_arms_that_give_the_dataclass():
    arms = _arms("dps", "dps_cold_start", "dps_content_prior")
    out, _ = _apply(arms, "DPSCallback.cold_start.reference_size=64")
    assert _args(out["dps_cold_start"], "DPSCallback")["cold_start"]["reference_size"] == 64
    assert _args(out["dps_content_prior"], "DPSCallback")["cold_start"]["reference_size"] == 64
    assert _args(out["dps_content_prior"], "DPSCallback")["cold_start"]["reference"] == "observed"  # kept
    assert _args(out["dps"], "DPSCallback")["cold_start"] is None
    spec = out["dps_cold_start"].specs(seed=1, cache_dir="here")[0]
    assert spec.kwargs["cold_start"].reference_size == 64 and spec.kwargs["cold_start"].cache_dir == "here"


def test_an_override_no_arm_of_the_study_holds_changes_nothing_and_is_returned():
    arms = _arms("uniform", "dps")
    out, unused = _apply(arms, "DOTSCallback.alpha=0.3", "DPSCallback.cold_start.reference_size=8")
    assert out == arms and [o.text for o in unused] == ["DOTSCallback.alpha=0.3",
                                                        "DPSCallback.cold_start.reference_size=8"]


def test_values_are_json_where_they_parse_and_text_otherwise():
    assert parse_override("DPSCallback.candidate_ratio=null").value is None
    assert parse_override("MoPPSCallback.prior=[2, 3]").value == [2, 3]
    assert parse_override("DPSCallback.prior=uniform").value == "uniform"
    o = parse_override("dps_c8:DPSCallback.cold_start.reference_size=64")
    assert (o.arm, o.callback, o.path, o.value) == ("dps_c8", "DPSCallback", ("cold_start", "reference_size"), 64)


@pytest.mark.parametrize("text, message", [
    ("DPSCallback.decay", "expected [ARM:]Callback.argument[.field]=VALUE"),
    ("DPSCallback=0.7", "expected [ARM:]Callback.argument[.field]=VALUE"),
    (":DPSCallback.decay=0.7", "expected [ARM:]Callback.argument[.field]=VALUE"),
])
def test_a_malformed_override_says_the_form(text, message):
    with pytest.raises(ArmError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_override(text)


@pytest.mark.parametrize("text, message", [
    ("mopps:MoPPSCallback.decay=1", "the study has no arm 'mopps' (arms: uniform, dps)"),
    ("DSPCallback.decay=1", "no callback class 'DSPCallback' in the study's arms or lit_rlft.callbacks"),
    ("DPSCallback.decy=1", "DPSCallback takes no argument 'decy' (it takes decay, prior,"),
    ("DPSCallback.cold_start.size=1", "DifficultyPredictorConfig has no field 'size' (fields: adapters,"),
    ("DPSCallback.decay.x=1", "DPSCallback.decay is not a dataclass argument with fields"),
    ("MoPPSCallback.decy=1", "MoPPSCallback takes no argument 'decy'"),  # checked though no arm has MoPPS
])
def test_a_wrong_override_names_what_is_wrong(text, message):
    with pytest.raises(ArmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _apply(_arms("uniform", "dps"), text)

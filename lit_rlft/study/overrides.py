"""``--set``: one argument of an arm's callbacks changed for a study, without copying its overlay file.

``[ARM:]Callback.argument[.field]=VALUE``: ``Callback`` is a class name of the arm's overlay (``DPSCallback``),
``argument`` one of its constructor's arguments, ``field`` a field of a dataclass argument (``DPSCallback.
cold_start.reference_size``); without ``ARM:`` every arm of the study that has such a callback changes (a nested
field only where the arm gives that argument). VALUE is read as JSON where it parses (``0.7``, ``null``, ``[1, 2]``)
and as a string otherwise. An override that names an arm the study does not have, a class that is neither one of
its arms' nor in ``lit_rlft.callbacks``, an argument the class does not take or a field its dataclass lacks is an
error naming it; one that no arm of this study gives a hold to (a ``DOTSCallback`` setting in a study without DOTS)
changes nothing and is returned, for the study to say so.

    arms, unused = apply_overrides(arms, [parse_override("dps_c8:DPSCallback.decay=0.7")])
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import lit_rlft.callbacks
from lit_rlft.study.strategies import Arm, ArmError, CallbackSpec, check_arguments, dataclass_argument

__all__ = ["Override", "apply_overrides", "parse_override"]

SYNTAX = "[ARM:]Callback.argument[.field]=VALUE, e.g. dps_c8:DPSCallback.decay=0.7"


@dataclass(frozen=True)
class Override:
    """One ``--set``: ``arm`` (None: every arm), the callback's class name, the argument path and the value."""

    text: str
    arm: str | None
    callback: str
    path: tuple[str, ...]
    value: Any


def parse_override(text: str) -> Override:
    """``text`` (``[ARM:]Callback.argument[.field]=VALUE``) as an :class:`Override`.

    Raises:
        ArmError: not of that form (the message quotes it and gives the form).
    """
    key, sep, raw = text.partition("=")
    arm, colon, target = key.strip().rpartition(":")
    callback, *path = target.split(".")
    if not sep or not callback or not path or not all(path) or (colon and not arm):
        raise ArmError(f"--set {text!r}: expected {SYNTAX}")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return Override(text=text, arm=arm or None, callback=callback, path=tuple(path), value=value)


def apply_overrides(arms: Mapping[str, Arm | None],
                    overrides: Iterable[Override]) -> tuple[dict[str, Arm | None], list[Override]]:
    """``arms`` with every override applied in order (``None`` entries, arms that are not lit_rlft's, stay), and
    the overrides that changed no arm.

    Raises:
        ArmError: an override names an arm that is not in the study, a class that is neither its arms' nor in
            ``lit_rlft.callbacks``, an argument the class does not take, a field its dataclass does not have, or
            gives a value the class then refuses.
    """
    out = dict(arms)
    unused = []
    for o in overrides:
        if o.arm is not None and o.arm not in out:
            raise ArmError(f"--set {o.text!r}: the study has no arm {o.arm!r} (arms: {', '.join(out)})")
        _check_target(o, [spec.cls for arm in out.values() if arm is not None for spec in arm.overlay])
        changed = 0
        for name, arm in out.items():
            if arm is None or (o.arm is not None and name != o.arm):
                continue
            specs = []
            for i, spec in enumerate(arm.overlay):
                new = _apply(spec, o) if spec.cls.__name__ == o.callback else None
                changed += new is not None
                specs.append(new or spec)
                if new is not None:
                    check_arguments(new.cls, new.kwargs, f"--set {o.text!r} on arm {name!r} ({new.cls.__name__} "
                                                         f"#{i})")
            out[name] = dataclasses.replace(arm, overlay=tuple(specs))
        if not changed:
            unused.append(o)
    return out, unused


def _check_target(o: Override, classes: list[type]) -> None:
    """Raise :class:`ArmError` unless ``o`` names a known callback class and an argument (and field) it takes."""
    known = {cls.__name__: cls for cls in classes}
    cls = known.get(o.callback) or getattr(lit_rlft.callbacks, o.callback, None)
    if not isinstance(cls, type):
        raise ArmError(f"--set {o.text!r}: no callback class {o.callback!r} in the study's arms or lit_rlft.callbacks")
    _apply(CallbackSpec(cls, {}), o)


def _apply(spec: CallbackSpec, o: Override) -> CallbackSpec | None:
    """``spec`` with the override applied, or None where it does not apply (a nested field of an argument the spec
    does not give).

    Raises:
        ArmError: the class takes no such argument, or its dataclass has no such field.
    """
    params = inspect.signature(spec.cls).parameters
    head, *rest = o.path
    if head not in params or head in ("self", "args", "kwargs"):
        raise ArmError(f"--set {o.text!r}: {spec.cls.__name__} takes no argument {head!r} "
                       f"(it takes {', '.join(params)})")
    kwargs = dict(spec.kwargs)
    if not rest:
        kwargs[head] = o.value
        return dataclasses.replace(spec, kwargs=kwargs)
    kind = dataclass_argument(spec.cls, head)
    if kind is None or len(rest) > 1:
        raise ArmError(f"--set {o.text!r}: {spec.cls.__name__}.{head} is not a dataclass argument with fields")
    fields = {f.name for f in dataclasses.fields(kind)}
    if rest[0] not in fields:
        raise ArmError(f"--set {o.text!r}: {kind.__name__} has no field {rest[0]!r} (fields: {', '.join(sorted(fields))})")
    given = kwargs.get(head)
    if given is None:
        return None
    if dataclasses.is_dataclass(given):
        given = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
    kwargs[head] = {**given, rest[0]: o.value}
    return dataclasses.replace(spec, kwargs=kwargs)

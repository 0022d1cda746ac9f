"""A reward an untrained tiny policy earns about half the time, so that a study's curves move in a test."""

from __future__ import annotations


def contains_one(completions: list[str], **columns) -> list[float]:
    """1 when the completion contains the character ``1``, else 0."""
    return [1.0 if "1" in c else 0.0 for c in completions]

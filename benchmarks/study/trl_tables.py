"""The tables of a recorded ``time_to_trl.json`` (``python -m benchmarks.time_to_trl``), for the script that writes
it and for the pages' ``time-to-trl-*`` blocks (:mod:`benchmarks.study.docs`).

A record is the product's summary (``lit-rlft study --baseline trl``, ``"format": 2``). Records made before it
(format 1: lit_rlft's arms against TRL's whole budget, other clocks) were all regenerated; one is refused with the
command that remakes it rather than shown beside figures measured another way.
"""

from __future__ import annotations

from typing import Any

FORMAT = 2


def result_table(result: dict[str, Any], *, source: str = "the record") -> str:
    """The table of a ``time_to_trl.json`` (format 2): the verdict lines, then the main table.

    Raises:
        ValueError: ``result`` is not format 2 (``source`` names it in the message).
    """
    if result.get("format") != FORMAT:
        raise ValueError(f"{source} is a time-to-TRL record of format {result.get('format', 1)}, made before the "
                         f"study's summary (format {FORMAT}: one crossing rule, both clocks from the first training "
                         f"step); regenerate it with: {result.get('command', 'python -m benchmarks.time_to_trl')}")
    from lit_rlft.study.report import main_rows, verdicts

    summary = result["summary"]
    arms = ["trl", "uniform", *result["recipes"]]
    return "\n".join([*verdicts(summary, arms), "", *main_rows(summary, arms)])

"""Reading a run's TensorBoard scalars back: ``{tag: [(step, value), ...]}``, for reports, plots and studies."""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_scalars"]


def read_scalars(log_dir: str | Path, latest: bool = False) -> dict[str, list[tuple[int, float]]]:
    """All scalars of the event files under ``log_dir`` as ``{tag: [(step, value), ...]}``.

    ``latest``: one value per step, the one written last (the event files in the order they were started: a run
    resumed from a checkpoint logs again the steps after it, and those values replace the killed attempt's)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(Path(log_dir).rglob("events.out.tfevents.*"), key=lambda f: (f.stat().st_mtime, f.name))
    for f in files if latest else sorted(files):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0}).Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    if latest:
        return {k: sorted(dict(v).items()) for k, v in out.items()}
    return {k: sorted(v) for k, v in out.items()}

"""Reading TensorBoard scalars back and plotting training curves (headless, matplotlib Agg).

matplotlib is optional (``pip install 'lit_rlft[plots]'``): only :func:`plot_curves` needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file backend (Agg), or an ImportError naming the extra to install."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'lit_rlft[plots]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_curves(scalars: dict[str, list[tuple[int, float]]], path: str | Path) -> Path:
    """Training reward and effective ratio (smoothed) and held-out accuracy by bucket, over rollout steps."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for tag, label in (("reward", "training reward"), ("effective_ratio", "effective ratio")):
        if tag in scalars:
            steps, vals = zip(*scalars[tag])
            axes[0].plot(steps, _smooth(list(vals)), label=f"{label} (10-step mean)")
    axes[0].set_xlabel("rollout step")
    axes[0].legend()
    axes[0].set_title("training batches")
    for tag in sorted(t for t in scalars if t.startswith("val/accuracy")):
        steps, vals = zip(*scalars[tag])
        axes[1].plot(steps, vals, marker="o", label=tag.removeprefix("val/"))
    axes[1].set_xlabel("rollout step")
    axes[1].set_ylabel("accuracy (sampled)")
    axes[1].set_title("held-out accuracy")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)

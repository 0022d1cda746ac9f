"""Plotting training curves (headless, matplotlib Agg) and the running mean the plots share.

matplotlib is optional (``pip install 'lit_rlft[plots]'``): :func:`pyplot` names the extra when it is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_curves", "pyplot", "smooth"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file backend (Agg), or an ImportError naming the extra to install."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'lit_rlft[plots]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def smooth(values: list[float], window: int = 10) -> list[float]:
    """The running mean of ``values`` over the last ``window`` of them (fewer at the start): one value per input."""
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
            axes[0].plot(steps, smooth(list(vals)), label=f"{label} (10-step mean)")
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

"""PNG plots written at the end of runs (matplotlib, no display needed)."""
from __future__ import annotations

import json
from pathlib import Path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_training_curves(metrics_path: str | Path, out_png: str | Path) -> Path | None:
    """Training loss, validation NLL (supervised / zero-shot) and learning rate over steps."""
    path = Path(metrics_path)
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in rows if "loss" in r]
    valid = [r for r in rows if "valid_nll" in r]
    plt = _pyplot()
    fig, (ax, ax_lr) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax.plot([r["step"] for r in train], [r["nll"] for r in train], label="train NLL / token")
    if valid:
        ax.plot([r["step"] for r in valid], [r["valid_nll"] for r in valid], "o-", label="valid NLL (supervised)")
        zs = [r for r in valid if "valid_zero_shot_nll" in r]
        if zs:
            ax.plot([r["step"] for r in zs], [r["valid_zero_shot_nll"] for r in zs], "s-", label="valid NLL (zero-shot)")
    ax.set_xlabel("step")
    ax.set_ylabel("nats per target token")
    ax.legend()
    ax.grid(alpha=0.3)
    if train:
        ax_lr.plot([r["step"] for r in train], [r["lr"] for r in train])
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("learning rate")
    ax_lr.grid(alpha=0.3)
    fig.suptitle(str(path.parent.name))
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)

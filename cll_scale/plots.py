"""PNG plots written at the end of runs (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

from cll_scale.metrics import read_rows


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, out_png: str | Path) -> Path:
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return Path(out_png)


def plot_training_curves(metrics_path: str | Path, out_png: str | Path) -> Path | None:
    """Training loss, validation NLL (supervised / zero-shot) and learning rate over steps."""
    path = Path(metrics_path)
    rows = read_rows(path)
    if not rows:
        return None
    train = [r for r in rows if r.get("loss") is not None]
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
    return _save(plt, fig, out_png)


def plot_bleu_offtarget(report: dict, out_png: str | Path) -> Path:
    """Per direction: BLEU and off-target rate (restricted) of each model, side by side."""
    plt = _pyplot()
    models = report["models"]
    directions = sorted({d["direction"] for r in models.values() for d in r["directions"]})
    # OPUS-100 has 218 test directions: past 40 the figure stops widening and the labels turn.
    many = len(directions) > 40
    fig, axes = plt.subplots(2, 1, figsize=(min(40, max(6, len(directions) * 0.9)), 7), sharex=True)
    width = 0.8 / max(1, len(models))
    for i, (name, r) in enumerate(models.items()):
        by = {d["direction"]: d for d in r["directions"]}
        xs = [j + i * width for j in range(len(directions))]
        axes[0].bar(xs, [by[d]["bleu"] if d in by else 0 for d in directions], width, label=name)
        axes[1].bar(xs, [by[d]["off_target_restricted"] if d in by else 0 for d in directions], width, label=name)
    kinds = {d["direction"]: d["kind"] for r in models.values() for d in r["directions"]}
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(directions))])
    zs = {d: kinds[d] == "zero-shot" for d in directions}
    if many:
        axes[1].set_xticklabels([d + (" ZS" if zs[d] else "") for d in directions], rotation=90, fontsize=6)
    else:
        axes[1].set_xticklabels([f"{d}\n{'ZS' if zs[d] else ''}" for d in directions])
    axes[0].set_ylabel("BLEU")
    axes[1].set_ylabel("off-target % (restricted LID)")
    axes[0].legend()
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, out_png)


def plot_t_weights(report: dict, out_png: str | Path) -> Path | None:
    """Learned t_l per language and CLL layer for each model (paper Fig. 6)."""
    # Baseline has no CLL layer; an LSL-off evaluation repeats its model's t_l.
    models = {k: r for k, r in report["models"].items() if r["cll_layers"] and r["use_lsl"]}
    if not models:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.5), squeeze=False)
    for ax, (name, r) in zip(axes[0], models.items()):
        for lang, values in r["t_weights"].items():
            ax.plot(r["cll_layers"], values, "o-", label=lang)
        ax.set_xticks(r["cll_layers"])
        ax.set_title(name)
        ax.set_xlabel("decoder layer")
        ax.set_ylabel("t_l")
        ax.legend()
        ax.grid(alpha=0.3)
    return _save(plt, fig, out_png)


def plot_validation_over_training(metrics: dict[str, list[dict]], out_png: str | Path) -> Path | None:
    """Validation over training, one line per model (``metrics``: its metrics.jsonl rows, as
    ``metrics.read_rows`` gives them): supervised BLEU (has it plateaued?) beside the zero-shot
    off-target rate (when does the collapse appear?). Both from greedy decoding."""
    panels = (("valid_bleu", "supervised BLEU (valid)", None),
              ("valid_zero_shot_offtarget", "zero-shot off-target % (valid)", (0, 100)))
    curves = {name: kept for name, rows in metrics.items()
              if (kept := [row for row in rows if "valid_zero_shot_offtarget" in row])}
    if not curves:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, (key, label, ylim) in zip(axes, panels):
        for name, rows in curves.items():
            kept = [r for r in rows if key in r]
            ax.plot([r["step"] for r in kept], [r[key] for r in kept], "o-", label=name)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    axes[0].legend()
    return _save(plt, fig, out_png)

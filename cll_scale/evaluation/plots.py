"""PNG plots written at the end of runs (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path


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


def plot_training_curves(rows: list[dict], title: str, out_png: str | Path) -> Path | None:
    """Training loss, validation NLL (supervised / zero-shot) and learning rate over steps, from a
    run's metrics.jsonl rows (:func:`cll_scale.training.metrics.read_rows`)."""
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
    fig.suptitle(title)
    return _save(plt, fig, out_png)


def plot_bleu_offtarget(report, out_png: str | Path) -> Path:
    """Per direction: BLEU and off-target rate (restricted) of each model of ``report`` (an
    :class:`cll_scale.evaluation.report.EvalReport`), side by side."""
    plt = _pyplot()
    models = report.models
    directions = sorted({d.direction for e in models.values() for d in e.directions})
    # OPUS-100 has 218 test directions: past 40 the figure stops widening and the labels turn.
    many = len(directions) > 40
    fig, axes = plt.subplots(2, 1, figsize=(min(40, max(6, len(directions) * 0.9)), 7), sharex=True)
    width = 0.8 / max(1, len(models))
    for i, (name, e) in enumerate(models.items()):
        by = {d.direction: d for d in e.directions}
        xs = [j + i * width for j in range(len(directions))]
        axes[0].bar(xs, [by[d].bleu if d in by else 0 for d in directions], width, label=name)
        axes[1].bar(xs, [by[d].off_target_restricted if d in by else 0 for d in directions], width, label=name)
    kinds = {d.direction: d.kind for e in models.values() for d in e.directions}
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


def plot_t_weights(report, out_png: str | Path) -> Path | None:
    """Learned t_l per language and CLL layer for each model of ``report`` (paper Fig. 6)."""
    # Baseline has no CLL layer; an LSL-off evaluation repeats its model's t_l.
    models = {k: e for k, e in report.models.items() if e.cll_layers and e.use_lsl}
    if not models:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.5), squeeze=False)
    for ax, (name, e) in zip(axes[0], models.items()):
        layers = [i - 1 for i in e.cll_layers]     # numbered from 0, as model.cll_layers (the entry counts from 1)
        for lang, values in e.t_weights.items():
            ax.plot(layers, values, "o-", label=lang)
        ax.set_xticks(layers)
        ax.set_title(name)
        ax.set_xlabel("decoder layer (from 0)")
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


def plot_zero_shot_gap(metrics: dict[str, list[dict]], out_png: str | Path, columns: int = 5) -> Path | None:
    """Validation NLL of the supervised and of the zero-shot directions against steps, one panel a
    model (``metrics``: its metrics.jsonl rows), on shared axes so that the gap between the two
    curves compares across models; None when no model validated zero-shot directions."""
    curves = {name: kept for name, rows in metrics.items()
              if (kept := [row for row in rows if "valid_zero_shot_nll" in row and "valid_nll" in row])}
    if not curves:
        return None
    plt = _pyplot()
    columns = min(columns, len(curves))
    rows = -(-len(curves) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.6 * columns, 2.2 * rows + 0.4), sharex=True, sharey=True,
                             squeeze=False)
    for ax, (name, kept) in zip(axes.flat, curves.items()):
        steps = [r["step"] for r in kept]
        ax.plot(steps, [r["valid_nll"] for r in kept], "o-", ms=3, label="supervised")
        ax.plot(steps, [r["valid_zero_shot_nll"] for r in kept], "s-", ms=3, label="zero-shot")
        ax.set_title(name, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(curves):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("valid NLL (nats)")
    axes.flat[0].legend(fontsize=7)
    return _save(plt, fig, out_png)


def plot_attribution(result: dict, out_png: str | Path) -> Path:
    """One sentence's layer attribution in the shape of paper Fig. 5: a row per (decoder layer,
    component), a column per target token, red where the component raised the token's
    log-probability and blue where it lowered it (``result``: ``Attribution.to_json()``)."""
    import numpy as np
    rows, labels = [], []
    for layer in range(len(result["attribution"]["ffn1"])):
        for name, values in result["attribution"].items():
            if values[layer] is not None:
                rows.append(values[layer])
                labels.append(f"layer {layer + 1} {name}")
    grid = np.array(rows)
    bound = float(np.abs(grid).max()) or 1.0
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5, 0.55 * grid.shape[1] + 2.5), 0.35 * len(rows) + 1.8))
    image = ax.imshow(grid, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), result["tgt_pieces"], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_title(f"→{result['tgt_lang']}: {result['src_text'][:70]}", fontsize=9)
    fig.colorbar(image, ax=ax, label="attribution to log p(token)")
    return _save(plt, fig, out_png)


def plot_attention(cases: dict[str, dict], kind: str, out_png: str | Path) -> Path:
    """Attention weights averaged over heads (paper Fig. 3): a row per case (model, tag kept or
    omitted), a column per layer; ``cases``: name -> {"src_pieces", "tgt_pieces", kind: per layer
    (queries, keys) lists}."""
    import numpy as np
    n_layers = max(len(c[kind]) for c in cases.values())
    plt = _pyplot()
    first = next(iter(cases.values()))
    side = 0.32 * len(first["src_pieces"]) + 1.5
    fig, axes = plt.subplots(len(cases), n_layers, figsize=(side * n_layers, side * len(cases) + 0.5),
                             squeeze=False)
    for row, (name, case) in enumerate(cases.items()):
        queries = case["src_pieces"] if kind == "encoder" else case["tgt_pieces"]
        keys = case["tgt_pieces"] if kind == "decoder" else case["src_pieces"]
        for layer, weights in enumerate(case[kind]):
            ax = axes[row][layer]
            ax.imshow(np.array(weights), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
            ax.set_yticks(range(len(queries)), queries, fontsize=6)
            ax.set_title(f"{name}: {kind} layer {layer + 1}", fontsize=8)
    return _save(plt, fig, out_png)


def plot_cll_layers(report, out_png: str | Path) -> Path | None:
    """Zero-shot and supervised BLEU against the number of CLL layers (paper Fig. 4), from a
    ``cll-repro --cll-layers`` report: one line per variant and side the layers were removed from
    (the set of every layer ends both), seeds averaged."""
    points: dict[tuple[str, tuple[int, ...]], list] = {}
    for name, entry in report.models.items():
        if " cll" in name and entry.use_lsl and entry.tagged and entry.cll_layers:
            points.setdefault((name.split(" cll")[0], tuple(entry.cll_layers)), []).append(entry)
    if not points:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for variant in sorted({v for v, _ in points}):
        sets = {layers: rows for (v, layers), rows in points.items() if v == variant}
        top = max(max(layers) for layers in sets)
        sides = {"lowest layers removed": [x for x in sets if x[-1] == top],
                 "highest layers removed": [x for x in sets if x[0] == 1]}
        for side, chosen in sides.items():
            chosen = sorted(chosen, key=len)
            if len(chosen) < 2:          # one point is no curve (e.g. only the top layer was kept)
                continue
            for ax, kind in zip(axes, ("zero-shot", "supervised")):
                ys = [sum(e.average(kind, "bleu") or 0.0 for e in sets[x]) / len(sets[x]) for x in chosen]
                ax.plot([len(x) for x in chosen], ys, "o-", label=f"{variant}, {side}")
    for ax, kind in zip(axes, ("zero-shot", "supervised")):
        ax.set_xlabel("CLL layers")
        ax.set_ylabel(f"{kind} BLEU")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    return _save(plt, fig, out_png)

"""The table and the verdict of ``docs/results/table6-row2.md`` (the paper's Table 6 row (2) at our
size), read from the two ``cll-repro`` reports under ``docs/results/table6-row2``; decodes nothing.
A model not trained yet is a row that says so, and the verdict waits for it.

    .venv/bin/python scripts/table6_row2_table.py docs/results/table6-row2

The directions compared are the three that are zero-shot in both conditions (fr→de, cs→fr,
de→cs); the off-target rate is langdetect's (the paper's measure). The reading written before
training: the Baseline's mean off-target on them falls from the centered model to the centered +
cycle model by more than twice the seed spread, and its mean zero-shot BLEU rises. The spreads
are the triangle's two seeds at 2,100 steps, read from their reports as
``scripts/diagnostics2_table.py`` reads them (``docs/results/triangle-diagnostics-2.md``): no
centered model has a second seed, so they stand in for the centered ones (an approximation the
page names).
"""
from __future__ import annotations

import argparse
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from diagnostics2_table import SEEDS, SPLITS, off_target  # noqa: E402

from cll_scale.evaluation.report import EvalReport  # noqa: E402

DIRECTIONS = ("fr-de", "cs-fr", "de-cs")
CONDITIONS = (("centered", "centered-diagnostics"), ("centered + cycle", "centered-cycle-diagnostics"))
VARIANTS = tuple(SEEDS)         # baseline, fcll: the variants with a measured seed spread


@lru_cache(maxsize=None)
def seed_spread(variant: str) -> dict[str, float]:
    """|seed 1 - seed 2| of the triangle's zero-shot off-target at 2,100 steps, per split, from the
    committed reports."""
    first, second = (off_target(ROOT / "docs" / "results", label) for label in SEEDS[variant])
    return {split: abs(a - b) for split, a, b in zip(SPLITS, first, second)}


@lru_cache(maxsize=None)
def load(path: Path) -> EvalReport | None:
    return EvalReport.load(path) if path.is_file() else None


def compared(folder: Path, report: str, split: str, model: str) -> dict | None:
    """Off-target % and BLEU of ``model`` on each compared direction and their means; None when the
    report or the model is not there yet."""
    loaded = load(folder / report / f"{split}.json")
    if loaded is None:
        return None
    entry = loaded.models.get(model)
    if entry is None:
        return None
    by = {r.direction: r for r in entry.directions}
    off = {d: by[d].off_target for d in DIRECTIONS}
    bleu = {d: by[d].bleu for d in DIRECTIONS}
    return {"off": off, "bleu": bleu, "mean_off": sum(off.values()) / 3, "mean_bleu": sum(bleu.values()) / 3}


def verdict(model: str, split: str, before: dict | None, after: dict | None) -> str:
    if before is None or after is None:
        return "not read yet: a model is not trained"
    bar = 2 * seed_spread(model)[split]
    fall, rise = before["mean_off"] - after["mean_off"], after["mean_bleu"] - before["mean_bleu"]
    holds = fall > bar and rise > 0
    return (f"off-target falls {fall:+.1f} points (bar {bar:.1f}), zero-shot BLEU {rise:+.2f}: "
            + ("holds in direction" if holds else "does not hold"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="docs/results/table6-row2")
    args = p.parse_args(argv)
    print("| model | split | " + " | ".join(d.replace("-", "→") for d in DIRECTIONS)
          + " | zero-shot off-target, their mean | zero-shot BLEU, their mean |")
    print("|---|---|" + "---:|" * (len(DIRECTIONS) + 2))
    rows = {}
    for model in VARIANTS:
        for split in SPLITS:
            for label, report in CONDITIONS:
                r = rows[label, model, split] = compared(args.folder, report, split, model)
                name = f"{label} {'Baseline' if model == 'baseline' else 'FCLL'}"
                cells = (["–"] * len(DIRECTIONS) + ["not trained yet", "–"] if r is None else
                         [f"{r['off'][d]:.1f}%" for d in DIRECTIONS] + [f"{r['mean_off']:.1f}%", f"{r['mean_bleu']:.2f}"])
                print(f"| {name} | {split.split('_')[1]} | " + " | ".join(cells) + " |")
    print()
    for model in VARIANTS:
        for split in SPLITS:
            print(f"{model}, {split}: " + verdict(model, split, rows["centered", model, split],
                                                   rows["centered + cycle", model, split]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

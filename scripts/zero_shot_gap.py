"""The zero-shot gap over training: validation NLL of the supervised and of the zero-shot
directions against steps, for every model of the diagnostics rounds (each report folder under
``docs/results/diagnostics*/`` with records), read from the records' metrics.jsonl; decodes
nothing. Draws the figure of the square's page and prints the gap (zero-shot − supervised NLL)
at each validated step, one row a model.

    .venv/bin/python scripts/zero_shot_gap.py docs/results \\
        --out docs/results/diagnostics-2/square-diagnostics/zero_shot_gap.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cll_scale.evaluation.plots import plot_zero_shot_gap  # noqa: E402
from cll_scale.training.metrics import read_rows  # noqa: E402


def label(metrics_file: Path) -> str:
    """``round 1: triangle baseline_half`` for ``diagnostics/<report>/records/multi30k-triangle-diagnostics-
    baseline_half/metrics.jsonl`` (``diagnostics-2``: round 2)."""
    folder = metrics_file.parents[3].name
    run = metrics_file.parent.name.removeprefix("multi30k-").replace("-diagnostics-", " ")
    return f"round {folder.removeprefix('diagnostics').lstrip('-') or '1'}: {run}"


def diagnostics_metrics(results: Path) -> dict[str, list[dict]]:
    """Every diagnostics model's metrics rows, by :func:`label`, in the order of the folders."""
    return {label(m): read_rows(m) for m in sorted(results.glob("diagnostics*/*/records/*/metrics.jsonl"))}


def gap_table(metrics: dict[str, list[dict]]) -> list[str]:
    """Zero-shot minus supervised validation NLL at each validated step, one row a model."""
    valid = {name: {r["step"]: r["valid_zero_shot_nll"] - r["valid_nll"] for r in rows
                    if "valid_zero_shot_nll" in r and "valid_nll" in r} for name, rows in metrics.items()}
    steps = sorted({s for gaps in valid.values() for s in gaps})
    lines = ["| model | " + " | ".join(f"{s:,}" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
    for name, gaps in valid.items():
        lines.append(f"| {name} | " + " | ".join(f"{gaps[s]:.2f}" if s in gaps else "–" for s in steps) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="the folder holding diagnostics*/ (docs/results)")
    p.add_argument("--out", type=Path, required=True, help="the PNG to draw")
    args = p.parse_args(argv)
    metrics = diagnostics_metrics(args.results)
    if not plot_zero_shot_gap(metrics, args.out):
        p.error(f"{args.results}: no diagnostics record logged a zero-shot validation NLL")
    print("\n".join(gap_table(metrics)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

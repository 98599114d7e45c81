"""The tables of ``docs/results/triangle-diagnostics.md`` (issue 34), read from the reports that
``cll-repro --settings diagnostics`` wrote (``<split>.json``) and their records' metrics, so the
page quotes the reports instead of copying numbers by hand. Decodes nothing.

    .venv/bin/python scripts/diagnostics_table.py docs/results/diagnostics
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from study_table import at_nll  # noqa: E402

from cll_scale.evaluation.report import EvalReport  # noqa: E402
from cll_scale.training.metrics import read_rows  # noqa: E402

# (question, report, model): the table, in its order.
QUESTIONS = [
    ("controls of the new defaults (mixed steps, authors' dropout)", "triangle", "baseline"),
    ("", "triangle", "fcll"),
    ("does Residual alone reproduce the paper's 5%?", "triangle", "residual"),
    ("do mixed-direction steps change zero-shot? (one direction a step, authors' dropout)", "triangle",
     "baseline_onedir"),
    ("", "triangle", "fcll_onedir"),
    ("the authors' dropout (one direction a step, the LSL dropped twice)", "triangle", "fcll_double"),
    # Built as `square` before 2026-12-05 (issue 50): the one-way cycle, not the paper's square.
    ("one-way 4-cycle de→fr→cs→en→de (built as `square` before 2026-12-05; every source still has one "
     "supervised target)", "cycle", "baseline"),
    ("", "cycle", "fcll"),
    ("does the gap grow with data? (half of the training sentences, same steps)", "triangle", "baseline_half"),
    ("", "triangle", "fcll_half"),
]
SPLITS = ("test_2016_flickr", "test_2018_flickr")
STEPS = (500, 1000, 1500, 2000)


def pct(x: float) -> str:
    return f"{x:.1f}%"


def record_of(report: Path, model: str) -> Path:
    """The record of ``model`` beside ``report`` (a ``cll-repro`` report folder): run directories
    are ``multi30k-<report>-<model>`` (a seed report's without its ``-seeds``, seeds as ``-seed2``)."""
    stem = report.name.removesuffix("-seeds")
    return report / "records" / f"multi30k-{stem}-{model.replace(' ', '-')}"


def model_row(question: str, label: str, report: Path, name: str) -> tuple[str, list[dict] | None]:
    """One row of the question table, and the model's validation rows (None: not trained yet)."""
    models = [EvalReport.load(report / f"{s}.json").models
              if (report / f"{s}.json").is_file() else {} for s in SPLITS]
    if name not in models[0]:
        return f"| {question} | {label} | not trained | | | | |", None
    a = [m[name] for m in models]
    off = [m.get(f"{name} (LSL off)") for m in models]
    rows = [r for r in read_rows(record_of(report, name) / "metrics.jsonl") if "valid_zero_shot_offtarget" in r]
    by_step = {r["step"]: r["valid_zero_shot_offtarget"] for r in rows}
    return (f"| {question} | {label} "
            f"| {pct(a[0].average('zero-shot', 'off_target'))} / {pct(a[0].average('zero-shot', 'lingua_off_target'))} "
            f"({pct(a[1].average('zero-shot', 'off_target'))}) "
            f"| {a[0].average('zero-shot', 'bleu'):.2f} ({a[1].average('zero-shot', 'bleu'):.2f}) "
            f"| {a[0].average('supervised', 'bleu'):.2f} ({a[1].average('supervised', 'bleu'):.2f}) "
            f"| {pct(off[0].average('zero-shot', 'off_target')) if off[0] else '–'} "
            f"| {' / '.join(f'{by_step[s]:.0f}' if s in by_step else '–' for s in STEPS)}% |"), rows


def print_question_table(questions: list[tuple[str, str, Path, str]]) -> dict[str, list[dict]]:
    """The question table of ``(question, label, report folder, model)`` rows; the validation rows
    of each trained model, by label."""
    print("| question | model | zero-shot off-target, langdetect / lingua | zero-shot BLEU | supervised BLEU "
          "| LSL off: zero-shot off-target | validation zero-shot off-target, steps "
          + " / ".join(f"{s:,}" for s in STEPS) + " |")
    print("|---|---|---:|---:|---:|---:|---|")
    curves = {}
    for question, label, report, name in questions:
        line, rows = model_row(question, label, report, name)
        print(line)
        if rows is not None:
            curves[label] = rows
    return curves


def print_nll_table(curves: dict[str, list[dict]], levels: list[float]) -> None:
    print("| model | " + " | ".join(f"valid NLL {v}: step / zero-shot off-target" for v in levels) + " |")
    print("|---|" + "---|" * len(levels))
    for label, rows in curves.items():
        cells = []
        for v in levels:
            found = at_nll(rows, v)
            cells.append(f"{found[0]:,.0f} / {found[1]:.0f}%" if found else "not reached")
        print(f"| {label} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="the --out of the diagnostics (holds <condition>-diagnostics/)")
    p.add_argument("--at-nll", default="3.0,2.6,2.3")
    p.add_argument("--study", type=Path,
                   help="the study's seed report folder (docs/results/triangle-seeds): its seed-1 Baseline and FCLL "
                        "are the one-direction, LSL-dropped-twice models of the same recipe, seed and data order, "
                        "so their first 2,100 steps stand for baseline/fcll_double on validation")
    args = p.parse_args(argv)
    curves = print_question_table([(q, f"{c} {name}", args.folder / f"{c}-diagnostics", name)
                                   for q, c, name in QUESTIONS])
    if args.study:
        for name in ("baseline", "fcll"):
            record = args.study / "records" / f"multi30k-triangle-{name}-seed1"
            rows = [r for r in read_rows(record / "metrics.jsonl")
                    if "valid_zero_shot_offtarget" in r and r["step"] <= 2100]
            curves[f"study (one direction, LSL dropped twice) {name}"] = rows
            by_step = {r["step"]: r["valid_zero_shot_offtarget"] for r in rows}
            print(f"| the study's code, validation only | study {name} seed 1 | | | | "
                  f"| {' / '.join(f'{by_step[s]:.0f}' if s in by_step else '–' for s in STEPS)}% |")
    print()
    print_nll_table(curves, [float(x) for x in args.at_nll.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())

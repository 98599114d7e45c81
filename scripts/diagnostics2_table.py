"""The tables of ``docs/results/triangle-diagnostics-2.md`` (issue 50, the second round), read from
the ``cll-repro`` reports and records of both rounds; decodes nothing. A model not trained yet is
a row that says so.

    .venv/bin/python scripts/diagnostics2_table.py docs/results

The seed spread of a variant is ``|seed 1 - seed 2|`` of its zero-shot off-target (langdetect,
the paper's measure) on each test set: the range of the two seeds of question c, both trained at
2,100 steps with the diagnostics' recipe. A difference between two models "exceeds twice the seed
spread" when it is larger than twice the larger spread of the two variants involved; with two
seeds that is a direction, not an interval. Two approximations, named in the page: the SD variants
have no second seed, so their verdicts take FCLL's spread (the nearest variant: SD keeps FCLL's
LSLs in one layer); the 4,200-step verdicts take the spread measured at 2,100 steps.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnostics_table import SPLITS, print_nll_table, print_question_table  # noqa: E402

from cll_scale.evaluation.report import EvalReport  # noqa: E402

R1, R2 = "diagnostics", "diagnostics-2"
STUDY, DEFAULTS = "triangle-seeds", "study-defaults/triangle-seeds"
# Every model the page reads, by label: (report folder under docs/results, model in the report).
MODELS = {
    "triangle baseline": (f"{R1}/triangle-diagnostics", "baseline"),
    "triangle fcll": (f"{R1}/triangle-diagnostics", "fcll"),
    "triangle residual": (f"{R1}/triangle-diagnostics", "residual"),
    "triangle baseline_onedir": (f"{R1}/triangle-diagnostics", "baseline_onedir"),
    "triangle fcll_onedir": (f"{R1}/triangle-diagnostics", "fcll_onedir"),
    "triangle baseline_half": (f"{R1}/triangle-diagnostics", "baseline_half"),
    "triangle fcll_half": (f"{R1}/triangle-diagnostics", "fcll_half"),
    "square baseline": (f"{R2}/square-diagnostics", "baseline"),
    "square fcll": (f"{R2}/square-diagnostics", "fcll"),
    "cycle baseline": (f"{R1}/cycle-diagnostics", "baseline"),
    "cycle fcll": (f"{R1}/cycle-diagnostics", "fcll"),
    "triangle baseline_postnorm": (f"{R2}/triangle-diagnostics", "baseline_postnorm"),
    "triangle fcll_postnorm": (f"{R2}/triangle-diagnostics", "fcll_postnorm"),
    "triangle baseline seed2": (f"{R2}/triangle-diagnostics-seeds", "baseline seed2"),
    "triangle fcll seed2": (f"{R2}/triangle-diagnostics-seeds", "fcll seed2"),
    **{f"4,200 {when} {model}": (report, f"{model} seed1") for when, report in (("study", STUDY), ("defaults", DEFAULTS))
       for model in ("baseline", "fcll", "sd", "sd_attn")},
}
# (question, model label): the order, each question beside the controls it is read
# against (the first round's seed-1 triangle models).
QUESTIONS = [
    ("controls: triangle, seed 1 (first round)", "triangle baseline"),
    ("", "triangle fcll"),
    ("a. the paper's square (de↔fr, fr↔cs, cs↔en, en↔de; zero-shot de↔cs, fr↔en)", "square baseline"),
    ("", "square fcll"),
    ("(the first round's one-way 4-cycle, for comparison)", "cycle baseline"),
    ("", "cycle fcll"),
    ("b. post-norm (model.pre_norm: false), nothing else changed", "triangle baseline_postnorm"),
    ("", "triangle fcll_postnorm"),
    ("c. seed 2 (the controls are seed 1)", "triangle baseline seed2"),
    ("", "triangle fcll seed2"),
]
# variant: (its seed-1 model, its seed-2 model), both 2,100 steps of the diagnostics' recipe
SEEDS = {variant: (f"triangle {variant}", f"triangle {variant} seed2") for variant in ("baseline", "fcll")}
# (verdict, where it was drawn, model A, model B, the variants whose spread applies): every
# single-seed verdict of both rounds, as the difference A - B in zero-shot off-target.
VERDICTS = [
    ("FCLL cures part of the Baseline's collapse (controls)", "diagnostics",
     "triangle baseline", "triangle fcll", ("baseline", "fcll")),
    ("Residual alone makes zero-shot worse", "diagnostics", "triangle residual", "triangle baseline", ("baseline",)),
    ("mixed steps help FCLL", "diagnostics", "triangle fcll_onedir", "triangle fcll", ("fcll",)),
    ("mixed steps do not move the Baseline", "diagnostics", "triangle baseline", "triangle baseline_onedir",
     ("baseline",)),
    ("half the rows: FCLL worse", "diagnostics", "triangle fcll_half", "triangle fcll", ("fcll",)),
    ("half the rows: the Baseline unchanged", "diagnostics", "triangle baseline", "triangle baseline_half",
     ("baseline",)),
    ("the one-way 4-cycle: FCLL below the Baseline", "diagnostics", "cycle baseline", "cycle fcll",
     ("baseline", "fcll")),
    ("4,200 steps, today's defaults: the Baseline rises", "triangle-study (retrain)",
     "4,200 defaults baseline", "4,200 study baseline", ("baseline",)),
    ("4,200 steps, today's defaults: FCLL falls", "triangle-study (retrain)",
     "4,200 study fcll", "4,200 defaults fcll", ("fcll",)),
    ("4,200 steps, today's defaults: SD (FFN) loses its lead", "triangle-study (retrain)",
     "4,200 defaults sd", "4,200 study sd", ("fcll",)),
    ("4,200 steps, today's defaults: SD (self-attention) loses its lead", "triangle-study (retrain)",
     "4,200 defaults sd_attn", "4,200 study sd_attn", ("fcll",)),
    ("4,200 steps, today's defaults: FCLL below SD (FFN)", "triangle-study (retrain)",
     "4,200 defaults sd", "4,200 defaults fcll", ("fcll",)),
    ("a. the square: Baseline against the triangle's", "second round", "triangle baseline", "square baseline",
     ("baseline",)),
    ("a. the square: FCLL against the triangle's", "second round", "triangle fcll", "square fcll", ("fcll",)),
    ("b. post-norm: the Baseline", "second round", "triangle baseline", "triangle baseline_postnorm", ("baseline",)),
    ("b. post-norm: FCLL", "second round", "triangle fcll", "triangle fcll_postnorm", ("fcll",)),
]

def off_target(results: Path, label: str) -> list[float] | None:
    """Zero-shot off-target (langdetect) on each split, or None when the model is not trained."""
    report, model = MODELS[label]
    found = []
    for split in SPLITS:
        path = results / report / f"{split}.json"
        models = EvalReport.load(path).models if path.is_file() else {}
        if model not in models:
            return None
        found.append(models[model].average("zero-shot", "off_target"))
    return found


def print_spread_table(results: Path) -> dict[str, list[float]] | None:
    """Each variant's seed spread on each split; None while a seed is missing."""
    spreads = {}
    print("| variant | seed 1 | seed 2 | spread (range) | twice the spread |")
    print("|---|---:|---:|---:|---:|")
    for variant, (seed1, seed2) in SEEDS.items():
        a, b = off_target(results, seed1), off_target(results, seed2)
        if a is None or b is None:
            print(f"| {variant} | {fmt(a)} | {fmt(b)} | seed 2 not trained | |")
            continue
        spreads[variant] = [abs(x - y) for x, y in zip(a, b)]
        print(f"| {variant} | {fmt(a)} | {fmt(b)} | {fmt(spreads[variant], 'pt')} "
              f"| {fmt([2 * x for x in spreads[variant]], 'pt')} |")
    return spreads if len(spreads) == len(SEEDS) else None


def print_verdict_table(results: Path, spreads: dict[str, list[float]] | None) -> None:
    print("| verdict | where | difference A − B, zero-shot off-target | twice the seed spread | exceeds it? |")
    print("|---|---|---:|---:|---|")
    for verdict, where, model_a, model_b, variants in VERDICTS:
        a, b = off_target(results, model_a), off_target(results, model_b)
        if a is None or b is None:
            print(f"| {verdict} | {where} | not trained | | |")
            continue
        diff = [x - y for x, y in zip(a, b)]
        if spreads is None:
            print(f"| {verdict} | {where} | {fmt(diff, 'pt')} | seed 2 not trained | |")
            continue
        twice = [2 * max(spreads[v][i] for v in variants) for i in range(len(SPLITS))]
        exceeds = [abs(d) > t for d, t in zip(diff, twice)]
        answer = "yes, both test sets" if all(exceeds) else "no, neither" if not any(exceeds) else \
            "test_2016 only" if exceeds[0] else "test_2018 only"
        print(f"| {verdict} | {where} | {fmt(diff, 'pt')} | {fmt(twice, 'pt')} | {answer} |")


def fmt(values: list[float] | None, unit: str = "%") -> str:
    """test_2016 (test_2018), as the question table writes them."""
    if values is None:
        return "not trained"
    sign = "+" if unit == "pt" else ""
    return f"{values[0]:{sign}.1f}{unit} ({values[1]:{sign}.1f}{unit})".replace("pt", " pt")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, help="docs/results (holds diagnostics/, diagnostics-2/ and the study)")
    p.add_argument("--at-nll", default="3.0,2.6,2.3")
    args = p.parse_args(argv)
    curves = print_question_table([(question, label, args.results / MODELS[label][0], MODELS[label][1])
                                   for question, label in QUESTIONS])
    print()
    print_nll_table(curves, [float(x) for x in args.at_nll.split(",")])
    print()
    spreads = print_spread_table(args.results)
    print()
    print_verdict_table(args.results, spreads)
    return 0


if __name__ == "__main__":
    sys.exit(main())

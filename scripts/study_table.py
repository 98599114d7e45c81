"""The triangle study's comparison table: every setting's seed report side by side, each variant's
figures as mean ± sample std over the seeds it has so far (paper Table 5 reports its seeds the same
way), and the zero-shot off-target on validation over training. Reads the merged ``<split>.json``
that ``cll-repro --seeds`` writes beside each report and the records' ``metrics.jsonl``, decodes
nothing, so ``docs/results/triangle-study.md`` quotes the reports instead of copying numbers by
hand. ``--at-nll`` adds the validation off-target at equal validation NLL, which compares settings
that converge at different speeds.

    .venv/bin/python scripts/study_table.py small=docs/results/triangle-seeds \\
        paper_small=docs/results/triangle-paper-small-seeds --at-nll 3.0,2.6
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cll_scale.training.metrics import read_rows  # noqa: E402
from cll_scale.evaluation.report import EvalReport, ModelEntry  # noqa: E402
from cll_scale.repro.report import mean_std  # noqa: E402

# The study's variants in the order of its tables, with the names its prose uses (paper §3; SD's two
# residual choices: the authors' code and Liu et al. 2021).
LABELS = {"baseline": "Baseline", "fcll": "FCLL", "sd": "SD (FFN residual)",
          "sd_attn": "SD (self-attention residual)"}
NAME = re.compile(r"^(?P<variant>.+) seed(?P<seed>\d+)(?P<off> \(LSL off\))?$")
# (group, key, unit) of the averages in each column after the seed count; the off-target column
# holds three identifiers' figures.
OFF_TARGET = [("zero-shot", key, "%") for key in ("off_target", "off_target_restricted", "lingua_off_target")]
COLUMNS = [("zero-shot", "bleu", ""), ("supervised", "bleu", ""), ("zero-shot", "lingua_code_switch", "%")]


def study_order(variant: str) -> tuple[int, str]:
    return (list(LABELS).index(variant) if variant in LABELS else len(LABELS)), variant


def setting_cell(setting: str, row: int) -> str:
    """The setting's name on its first row only, so its rows read as one block."""
    return f"`{setting}`" if row == 0 else ""


def seed_list(seeds: dict[int, object]) -> str:
    return ",".join(map(str, sorted(seeds)))


def by_variant(models: dict[str, ModelEntry]) -> dict[tuple[str, bool], dict[int, ModelEntry]]:
    """(variant, LSL off) -> seed -> entry, in the study's order; a model name that is not
    ``<variant> seed<N>[ (LSL off)]`` is an error (this reads seed reports only)."""
    rows: dict[tuple[str, bool], dict[int, ModelEntry]] = {}
    for name, entry in models.items():
        m = NAME.match(name)
        if m is None:
            raise ValueError(f"model {name!r} is not '<variant> seed<N>': not a --seeds report")
        rows.setdefault((m["variant"], bool(m["off"])), {})[int(m["seed"])] = entry
    return dict(sorted(rows.items(), key=lambda item: (*study_order(item[0][0]), item[0][1])))


def cell(rows: list[ModelEntry], group: str, key: str, unit: str = "") -> str:
    """A figure some seeds lack (scored without lingua) is a dash, not a mean over fewer seeds."""
    values = [v for r in rows if (v := r.average(group, key)) is not None]
    return mean_std(values, unit) if len(values) == len(rows) else "–"


def table(reports: dict[str, Path], split: str) -> str:
    lines = ["| setting | model | seeds | zero-shot off-target: langdetect (paper) / restricted / lingua "
             "| zero-shot BLEU | supervised BLEU | zero-shot code-switch (lingua) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for setting, folder in reports.items():
        path = folder / f"{split}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no merged report of {split} (run cll-repro --seeds first)")
        variants = by_variant(EvalReport.load(path).models)
        for i, ((variant, off), seeds) in enumerate(variants.items()):
            rows = [seeds[s] for s in sorted(seeds)]
            label = LABELS.get(variant, variant) + (", LSL off" if off else "")
            off_target = " / ".join(cell(rows, *column) for column in OFF_TARGET)
            rest = " | ".join(cell(rows, *column) for column in COLUMNS)
            lines.append(f"| {setting_cell(setting, i)} | {label} | {seed_list(seeds)} | {off_target} | {rest} |")
    return "\n".join(lines) + "\n"


def validations(folder: Path) -> dict[str, dict[int, list[dict]]]:
    """variant -> seed -> the validation rows of its record (``records/<stem>-<variant>-seed<N>/
    metrics.jsonl``, the rows that hold a zero-shot off-target), in step order."""
    out: dict[str, dict[int, list[dict]]] = {}
    for metrics in sorted((folder / "records").glob("*/metrics.jsonl")):
        *_, variant, seed = metrics.parent.name.rsplit("-", 2)
        if not seed.startswith("seed"):
            raise ValueError(f"{metrics.parent}: not a seed run's record")
        rows = [r for r in read_rows(metrics) if "valid_zero_shot_offtarget" in r]
        out.setdefault(variant, {})[int(seed[4:])] = sorted(rows, key=lambda r: r["step"])
    return out


Found = dict[str, dict[str, dict[int, list[dict]]]]     # setting -> validations(folder)


def load(reports: dict[str, Path]) -> Found:
    """Every setting's validation rows, read once for both tables below."""
    return {setting: validations(folder) for setting, folder in reports.items()}


def variant_rows(found: Found, cells) -> list[str]:
    """One table row per setting and variant: ``cells(seeds)`` gives the cells after the seed list."""
    lines = []
    for setting, by in found.items():
        for i, variant in enumerate(sorted(by, key=study_order)):
            seeds = by[variant]
            lines.append(f"| {setting_cell(setting, i)} | {LABELS.get(variant, variant)} | {seed_list(seeds)} | "
                         + " | ".join(cells(seeds)) + " |")
    return lines


def curve_table(found: Found) -> str:
    """The zero-shot off-target on validation over training, each variant's mean (± std) over
    seeds at each step that all its seeds validated."""
    steps = sorted({r["step"] for by in found.values() for seeds in by.values() for rows in seeds.values()
                    for r in rows})

    def cells(seeds: dict[int, list[dict]]) -> list[str]:
        by_step = [{r["step"]: r["valid_zero_shot_offtarget"] for r in rows} for rows in seeds.values()]
        return [mean_std([c[step] for c in by_step], "%", digits=0) if all(step in c for c in by_step) else "–"
                for step in steps]
    return "\n".join(["| setting | model | seeds | " + " | ".join(f"{s:,}" for s in steps) + " |",
                      "|---|---|---|" + "---:|" * len(steps), *variant_rows(found, cells)]) + "\n"


def at_nll(rows: list[dict], nll: float) -> tuple[float, float] | None:
    """(step, zero-shot off-target) where the supervised validation NLL first falls to ``nll``,
    linear in the NLL between the validations either side; None when the run never gets there.
    Two settings' models compared at one step differ in how far they have converged as well as in
    their settings; at one validation NLL (same shards, same vocabulary) only in their settings."""
    before = None
    for row in rows:
        if row["valid_nll"] <= nll:
            if before is None:
                return float(row["step"]), row["valid_zero_shot_offtarget"]
            f = (before["valid_nll"] - nll) / (before["valid_nll"] - row["valid_nll"])
            return (before["step"] + f * (row["step"] - before["step"]),
                    before["valid_zero_shot_offtarget"]
                    + f * (row["valid_zero_shot_offtarget"] - before["valid_zero_shot_offtarget"]))
        before = row
    return None


def nll_table(found: Found, levels: list[float]) -> str:
    """The validation zero-shot off-target at each validation NLL in ``levels`` (mean ± std over
    seeds, and the mean step it happened at); a dash where a seed never reached it."""
    def cells(seeds: dict[int, list[dict]]) -> list[str]:
        out = []
        for level in levels:
            found = [at_nll(rows, level) for rows in seeds.values()]
            if any(f is None for f in found):
                out.append("–")
                continue
            step = sum(s for s, _ in found) / len(found)
            out.append(f"{mean_std([o for _, o in found], '%', digits=0)} (step {step:,.0f})")
        return out
    return "\n".join(["| setting | model | seeds | " + " | ".join(f"NLL {v:g}" for v in levels) + " |",
                      "|---|---|---|" + "---:|" * len(levels), *variant_rows(found, cells)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", metavar="SETTING=FOLDER",
                   help="a setting's name and the folder beside its seed report (holds <split>.json)")
    p.add_argument("--splits", default="test_2016_flickr,test_2018_flickr")
    p.add_argument("--at-nll", default="", metavar="NLL[,NLL...]",
                   help="also print the validation zero-shot off-target where each model's validation NLL "
                        "first falls to these values (compares settings at equal convergence)")
    args = p.parse_args(argv)
    reports = {}
    for spec in args.reports:
        setting, sep, folder = spec.partition("=")
        if not sep or not setting or not folder:
            p.error(f"{spec!r}: expected SETTING=FOLDER")
        reports[setting] = Path(folder)
    try:
        levels = [float(v) for v in args.at_nll.split(",") if v.strip()]
    except ValueError:
        p.error(f"--at-nll {args.at_nll!r}: expected numbers separated by commas")
    try:
        for split in args.splits.split(","):
            print(f"### {split}\n\n{table(reports, split)}")
        found = load(reports)
        print(f"### validation over training (zero-shot off-target, restricted language ID)\n\n{curve_table(found)}")
        if levels:
            print(f"### validation at equal validation NLL (zero-shot off-target, restricted language ID)\n\n"
                  f"{nll_table(found, levels)}")
    except (OSError, ValueError, KeyError) as err:
        print(f"study_table: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

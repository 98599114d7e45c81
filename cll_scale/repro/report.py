"""The study's report, ``<out>/<report>.md``: what was trained and on what, validation over
training, each split's tables and plots, and with seeds the mean ± std per variant."""
from __future__ import annotations

import statistics
from pathlib import Path

from cll_scale.core.hardware import hardware
from cll_scale.core.outputs import write_atomic
from cll_scale.evaluation.evaluator import LSL_OFF, TAG_OMITTED
from cll_scale.evaluation.plots import (plot_bleu_offtarget, plot_cll_layers, plot_t_weights,
                                        plot_validation_over_training)
from cll_scale.evaluation.report import EvalReport, markdown
from cll_scale.evaluation.significance import Significance
from cll_scale.repro.plan import Budget
from cll_scale.model.export import ExportInfo
from cll_scale.repro.records import last_train_row, trained_on
from cll_scale.training.precision import trained_precision
from cll_scale.training.rundir import RunDir


def plot_links(report: EvalReport, figs: Path, prefix: str = "") -> list[str]:
    """Plot one evaluation report (BLEU/off-target; learned t_l when a model has CLL layers) into
    ``figs``; returns the markdown image links, relative to the folder that holds ``figs``."""
    pngs = {"BLEU and off-target": plot_bleu_offtarget(report, figs / f"{prefix}bleu_offtarget.png"),
            "learned t_l": plot_t_weights(report, figs / f"{prefix}t_weights.png")}
    return [f"![{alt}]({figs.name}/{png.name})" for alt, png in pngs.items() if png]


def validation_table(metrics: dict[str, list[dict]]) -> list[str]:
    """The plot's numbers: zero-shot off-target and supervised BLEU on validation at each
    validated step, one row a model (``metrics``: its metrics.jsonl rows; empty when no run
    validated)."""
    curves = {name: {row["step"]: row for row in rows if "valid_zero_shot_offtarget" in row}
              for name, rows in metrics.items()}
    steps = sorted({step for curve in curves.values() for step in curve})
    if not steps:
        return []
    # A curve and a test table can disagree by protocol alone
    # (docs/results/protocol.md measures each part), so both are named where the curve is shown.
    lines = ["", "Validation over training: zero-shot off-target % / supervised BLEU, by the validation protocol "
             "(the `valid` split, the first `valid.decode_sentences` sentences of each direction, greedy, "
             "off-target with the restricted language ID). The test tables below follow the test protocol (the "
             "test set's sentences, the beam their heading names, off-target with the paper's language ID beside "
             "the restricted one); docs/results/protocol.md compares the two.",
             "", "| model | " + " | ".join(f"{s:,}" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
    for name, curve in curves.items():
        cells = [f"{curve[s]['valid_zero_shot_offtarget']:.0f} / {curve[s].get('valid_bleu', float('nan')):.1f}"
                 if s in curve else "–" for s in steps]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def training_table(runs: dict[str, Path], metrics: dict[str, list[dict]], machines: dict[str, str] | None) -> list[str]:
    """One row a model: how far it trained and which export was evaluated (``machines``: each
    model's hardware and precision, when they differ)."""
    lines = ["| model | steps | epochs | target tokens seen | training minutes | last train NLL | last valid NLL "
             "| evaluated step |" + (" trained on |" if machines else ""),
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if machines else "")]
    for name, run_dir in runs.items():
        last = last_train_row(metrics[name])
        valid = [row for row in metrics[name] if "valid_nll" in row]
        lines.append(f"| {name} | {last.get('step', 0)} | {last.get('epoch', 0):.2f} | {last.get('tokens_seen', 0):,} "
                     f"| {last.get('elapsed_s', 0) / 60:.1f} | {last.get('nll', float('nan')):.3f} | "
                     f"{valid[-1]['valid_nll'] if valid else float('nan'):.3f} | "
                     f"{ExportInfo.load(RunDir(run_dir).export()).step} |"
                     + (f" {machines[name]} |" if machines else ""))
    return lines


# Where the generated report ends: what follows it in the report already written (a reading, a
# figure drawn from several reports) is kept when the report is written again.
BY_HAND = "<!-- Written by hand below: kept when cll-repro writes this report again. -->"


def kept_by_hand(path: Path) -> str:
    """The part of the report at ``path`` written by hand (from :data:`BY_HAND` on), or ""."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    at = text.find(BY_HAND)
    return "\n" + text[at:] if at >= 0 else ""


def write_report(condition: str, report_name: str, runs: dict[str, Path], reports: dict[str, EvalReport], budget: Budget,
                 command: str, out: Path, seed_groups: dict[str, list[str]] | None = None,
                 pending: tuple[str, ...] | list[str] = (), paired: dict[str, Significance] | None = None) -> Path:
    """The report of the models in ``runs``; ``pending``: the planned ones still to train, named
    at the top so that a report written part-way through a study says what it lacks; ``paired``:
    per split, each model tested against the first on the same sentences."""
    figs = out / report_name
    figs.mkdir(parents=True, exist_ok=True)
    same = ("for every model of one seed the same initial seed, data order and settings" if seed_groups
            else "same seed, data order and settings for every model")
    here = hardware()
    machines = {name: f"{trained_on(d, here)}; {trained_precision(d) or '?'}" for name, d in runs.items()}
    metrics = {name: RunDir(d).metrics() for name, d in runs.items()}
    one_machine = len(set(machines.values())) == 1
    lines = [f"# Multi30k, {condition} condition: Baseline vs CLL", "",
             f"Command: `{command}`", "",
             (f"Hardware: {next(iter(machines.values()))}. " if one_machine else
              "Hardware: per model, in the table below. ") +
             f"Budget: {budget.text()}; {same} (the recipes differ only in the variant's settings).", "",
             *([f"**In progress: {len(runs)} of {len(runs) + len(pending)} models.** Still to train: "
                f"{', '.join(pending)}. The same command continues them and rewrites this report as each "
                f"one ends.", ""] if pending else []),
             "Evaluated checkpoint: the one with the lowest supervised validation NLL (`export-best/`; "
             "zero-shot directions play no part in the choice), else the last one.", "",
             *training_table(runs, metrics, None if one_machine else machines)]
    curve = plot_validation_over_training(metrics, figs / "validation_over_training.png")
    if curve:
        lines += ["", f"![validation over training: supervised BLEU, zero-shot off-target]({report_name}/{curve.name})"]
    lines += validation_table(metrics)
    for split, report in reports.items():
        lines += ["", f"## {split}", ""]
        if seed_groups:
            lines += ["Mean ± sample standard deviation over seeds, then every model of every seed.", "",
                      seed_table(report, seed_groups)]
        lines += [markdown(report)]
        if paired and paired.get(split) and paired[split].comparisons:
            lines += [paired[split].markdown()]
        lines += plot_links(report, figs, f"{split}_")
        sweep = plot_cll_layers(report, figs / f"{split}_cll_layers.png")
        if sweep:
            lines.append(f"![BLEU against the number of CLL layers (paper Fig. 4)]({figs.name}/{sweep.name})")
    path = out / f"{report_name}.md"
    write_atomic(path, "\n".join(lines) + "\n" + kept_by_hand(path))
    return path


def mean_std(values: list[float], unit: str = "", digits: int = 2) -> str:
    """Mean ± sample std over seeds (paper Table 5 gives the variance over its seeds the same way);
    one seed is its value alone."""
    if len(values) < 2:
        return f"{values[0]:.{digits}f}{unit}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}{unit}"


def seed_table(report: EvalReport, groups: dict[str, list[str]]) -> str:
    """:func:`mean_std` of each variant's averages, with the LSL-off and tag-omitted rows when the
    report has them."""
    columns = [("zero-shot", "off_target", "%"), ("zero-shot", "off_target_restricted", "%"),
               ("zero-shot", "bleu", ""), ("supervised", "bleu", ""), ("zero-shot", "to_trained", "%"),
               ("zero-shot", "to_outside", "%"), ("zero-shot", "on_target_bleu", "")]
    lines = ["| model | seeds | zero-shot off-target (paper) | zero-shot off-target (restricted) "
             "| zero-shot BLEU | supervised BLEU | zero-shot in a trained target | zero-shot outside the model's "
             "languages | zero-shot on-target BLEU |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for variant, names in groups.items():
        for suffix in ("", LSL_OFF, TAG_OMITTED):
            rows = [report.models[n + suffix] for n in names if n + suffix in report.models]
            if not rows:
                continue
            cells = [mean_std([e.average(group, key) for e in rows], unit)
                     if all(e.average(group, key) is not None for e in rows) else "–" for group, key, unit in columns]
            lines.append(f"| {variant}{suffix} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

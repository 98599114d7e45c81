"""``cll-repro``: the Multi30k zero-shot reproduction, one command, resumable.

    cll-repro --condition triangle --minutes-per-model 90
    cll-repro --condition centered --variants baseline,sd,fcll --minutes-per-model 120
    cll-repro --condition triangle --variants baseline,fcll,sd,sd_attn --seeds 1,2,3 --steps-per-model 4200
    cll-repro --condition triangle --settings paper --seeds 1,2,3 --steps-per-model 4000
    cll-repro --condition triangle --settings paper_small --seeds 1,2,3 --steps-per-model 4200

Builds the shards of the condition (paper §4.1) if missing, trains every variant from
``recipes/multi30k_<condition>_<variant>.yaml`` (``--settings paper``: the
``multi30k_<condition>_paper_<variant>.yaml`` recipes, which follow the authors' code;
``--settings paper_small``: their settings at the ``small`` size, the closest a CPU trains) with the
same seed and budget (with ``--seeds``, every variant once per seed, seed 1 of every variant
first; a seed sets both the initialisation and the data order, so the variants of one seed see
the same batches, and the report gives mean ± std over seeds beside each seed's rows; re-running resumes
each unfinished model from its checkpoint, so a long CPU run can span several sittings; a GPU is
used when present), evaluates every export on the Multi30k test sets, and writes
``<out>/<condition>.md`` (``<condition>-seeds.md`` with ``--seeds``) with the tables, plots,
budget, steps, epochs, hardware and command; it is rewritten as each model ends, naming the ones
still to train. A finished model's record (no weights) is kept beside the report and stands in for
its run directory when that is gone.
Everything goes under ``runs/repro/`` of the current directory unless told otherwise; the
project's committed reports are rewritten only with an explicit ``--out docs/results``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from cll_scale import engine as ds
from cll_scale.checkpointer import BEST_EXPORT, chosen_export
from cll_scale.cli import (add_debug_argument, add_lid_arguments, csv_list, non_negative_float, non_negative_int,
                           pick_device, positive_int, run)
from cll_scale.config import PRESETS, ModelConfig, TrainConfig, apply_overrides, load_recipe
from cll_scale.decoding import DecodeConfig
from cll_scale.evaluate import (LSL_OFF, TAG_OMITTED, evaluate_entries, file_name, lid_pool, markdown,
                                pairs_from_shards, select_directions, summarize)
from cll_scale.metrics import read_rows
from cll_scale.outputs import json_text, write_atomic
from cll_scale.translate import TranslateConfig, Translator

ROOT = Path(__file__).resolve().parents[1]
CONDITION_LANGS = {"triangle": "de,fr,cs", "square": "de,fr,cs,en"}    # the cycles' order (paper §4.1)
# The recipe families: the study's (issue 20), and the diagnostics of issue 34 (small, 2,100 steps,
# one question per variant; docs/results/triangle-diagnostics.md).
SETTINGS = ("small", "paper", "paper_small", "diagnostics")


class StepFailed(RuntimeError):
    """A command cll-repro ran failed; it printed its own error, and its exit code is passed on."""

    def __init__(self, what: str, code: int):
        super().__init__(f"{what} failed (exit {code}); its message is above")
        self.exit_code = code


def sh(cmd: list[str], what: str) -> None:
    code = subprocess.run(cmd, cwd=ROOT).returncode
    if code:
        raise StepFailed(what, code)


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    model, flags = ds.cpu_model_and_flags()
    return f"{os.cpu_count()} CPU cores ({model}, {flags or 'no AVX-512'}), no GPU"


def build_shards(condition: str, multi30k: str, shards: Path) -> None:
    if (shards / "manifest.json").exists():
        return
    cmd = [sys.executable, "-m", "data_tools", "build", "--input", multi30k, "--condition", condition,
           "--out", str(shards)]
    if condition in CONDITION_LANGS:
        cmd += ["--langs", CONDITION_LANGS[condition]]
    sh(cmd, f"building the {condition} shards")


def last_train_row(rows: list[dict]) -> dict:
    """The last training line of a run's metrics (validation lines carry no loss)."""
    return next((row for row in reversed(rows) if "loss" in row), {})


def run_state(run_dir: Path) -> dict:
    """Where a run stands: its last metrics line and whether the export is current."""
    last = last_train_row(read_rows(run_dir / "metrics.jsonl"))
    export = run_dir / "export" / "export.json"
    exported_step = json.loads(export.read_text()).get("step") if export.exists() else None
    return {"last": last, "exported_step": exported_step}


def export_id(run_dir: Path) -> str:
    """The evaluated export's identity: the hash of its export.json, which holds every file's sha256."""
    return hashlib.sha256((chosen_export(run_dir) / "export.json").read_bytes()).hexdigest()


def finished(run_dir: Path, budget: dict, state: dict | None = None) -> bool:
    """The run spent this budget and exported its last step (``state``: its run_state, if read)."""
    state = state or run_state(run_dir)
    last = state["last"]
    spent = TrainConfig(max_steps=budget["steps"], max_minutes=budget["minutes"]).budget_spent(
        last.get("step", 0), last.get("epoch", 0.0), last.get("elapsed_s", 0.0))
    return spent and state["exported_step"] == last.get("step")


def train_command(recipe: Path, run_dir: Path, shards: Path, budget: dict, overrides: list[str]) -> list[str] | None:
    """The cll-train command that trains (or resumes) one model; None when it is finished."""
    state = run_state(run_dir)
    if finished(run_dir, budget, state):
        print(f"[cll-repro] {run_dir.name}: finished ({state['last']['step']} steps), skipping", file=sys.stderr)
        return None
    cmd = [sys.executable, "-m", "cll_scale.train", "--recipe", str(recipe), "--data", str(shards),
           "--run-dir", str(run_dir), "--max-minutes", str(budget["minutes"]), "--max-steps", str(budget["steps"])]
    for o in overrides:
        cmd += ["--set", o]
    if (run_dir / "checkpoints" / "latest").exists():
        cmd.append("--resume")
    print(f"[cll-repro] {' '.join(shlex.quote(c) for c in cmd)}", file=sys.stderr)
    return cmd


def train(recipe: Path, run_dir: Path, shards: Path, budget: dict, overrides: list[str]) -> None:
    """Train (or resume, or skip when finished) one model, in this process's turn."""
    cmd = train_command(recipe, run_dir, shards, budget, overrides)
    if cmd:
        train_all([(run_dir.name, run_dir, cmd)], parallel=1)


class Stopped(RuntimeError):
    """cll-repro was told to stop (a scheduler's SIGTERM): the trainings it ran were stopped the
    same way, and each saved its checkpoint."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}; the trainings it ran saved their "
                         f"checkpoints, and the same command continues them")
        self.exit_code = 128 + signum


def train_all(commands: list[tuple[str, Path, list[str]]], parallel: int, done=None) -> None:
    """Run the training commands in order, ``parallel`` at a time (one GPU holds several small
    models; each process picks its own free port). With more than one at a time each writes its
    output to ``<run dir>/train.log``; the first failure stops the others and is raised.
    ``done(name)`` runs as each training ends well, while the others go on. A SIGTERM
    to cll-repro (a job scheduler's stop) is passed on to the running trainings, which checkpoint
    their step and stop: without that they would go on alone, holding their run directories."""
    def stop(signum, frame):
        raise Stopped(signum)
    previous = signal.signal(signal.SIGTERM, stop)
    waiting, running, ended = list(commands), [], []
    try:
        while waiting or running or ended:
            while waiting and len(running) < parallel:
                name, run_dir, cmd = waiting.pop(0)
                log, log_path = None, None
                if parallel > 1:
                    log_path = run_dir / "train.log"
                    run_dir.mkdir(parents=True, exist_ok=True)
                    log = open(log_path, "a")
                running.append((name, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log and subprocess.STDOUT),
                                log, log_path))
            while ended:                 # after the next trainings started, so no slot waits on it
                done(ended.pop(0))
            time.sleep(0.5)
            for item in list(running):
                name, proc, log, log_path = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                if log:
                    log.close()
                if proc.returncode:
                    raise StepFailed(f"training {name}" + (f" (its output: {log_path})" if log_path else ""),
                                     proc.returncode)
                if done:
                    ended.append(name)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for _, proc, _, _ in running:
            proc.terminate()         # SIGTERM: each checkpoints its current step and stops
        for _, proc, log, _ in running:
            proc.wait()
            if log:
                log.close()


# What a record keeps of a finished run: everything the report and the evaluation cache read,
# without the weights and checkpoints (about 100 MB a `small` model).
RECORD_FILES = ("metrics.jsonl", "config.json", "ds_config.json", "git.txt", "export/export.json",
                f"{BEST_EXPORT}/export.json")
RECORD = "record.json"


def training_identity(recipe: Path, overrides: list[str], budget: dict) -> dict:
    """What decides a trained model: the recipe's bytes, the overrides and the budget."""
    return {"recipe": recipe.name, "recipe_sha256": hashlib.sha256(recipe.read_bytes()).hexdigest(),
            "overrides": list(overrides), "budget": budget}


def is_record(run_dir: Path) -> bool:
    return (run_dir / RECORD).is_file()


def write_record(run_dir: Path, record_dir: Path, identity: dict) -> None:
    """Keep a finished run's metrics, configs and export manifests (not its weights) under the
    report, so that the report and its cached evaluations outlive the run directory: on machines
    whose ``runs/`` is gone by the next sitting (a fresh CI or cloud node), a multi-seed study
    still grows one sitting at a time. Written beside it and renamed into place, so a record is
    whole, and holds nothing of an earlier one (an ``export-best/`` the new run did not make)."""
    fresh, old = record_dir.with_name(f".{record_dir.name}.new"), record_dir.with_name(f".{record_dir.name}.old")
    for leftover in (fresh, old):
        shutil.rmtree(leftover, ignore_errors=True)
    for rel in RECORD_FILES:
        if (run_dir / rel).is_file():
            write_atomic(fresh / rel, (run_dir / rel).read_bytes())
    write_atomic(fresh / RECORD, json_text({**identity, "hardware": hardware(), "run_dir": str(run_dir)}, indent=1))
    if record_dir.exists():
        record_dir.rename(old)
    fresh.rename(record_dir)
    shutil.rmtree(old, ignore_errors=True)


# Train settings that cll-repro itself sets per run or through its budget flags.
PER_RUN = {"data", "run_dir", "max_steps", "max_minutes", "max_epochs"}


def recorded_differences(run_dir: Path, recipe: Path, overrides: list[str]) -> list[str]:
    """What the recipe and overrides ask that the run (or record) in ``run_dir`` was not trained
    with, read from its config.json: a rerun with another ``--set`` must not report a model
    under settings it never had."""
    path = run_dir / "config.json"
    if not path.is_file():
        return []
    trained = json.loads(path.read_text())
    wanted = apply_overrides(load_recipe(recipe), list(overrides))
    diff = []
    for section in ("model", "data", "train"):
        for key, value in (wanted.get(section) or {}).items():
            if section == "train" and key in PER_RUN or key not in trained.get(section, {}):
                continue
            have = trained[section][key]
            same = have == value or (isinstance(have, (int, float)) and isinstance(value, (int, float, str))
                                     and not isinstance(value, bool) and _as_number(value) == have)
            if not same:
                diff.append(f"{section}.{key}={value!r} (trained with {have!r})")
    return diff


def _as_number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_trained_settings(runs: dict[str, Path], recipe_of: dict[str, Path], overrides: dict[str, list[str]],
                           extra: list[str]) -> None:
    """Refuse, before anything runs, models whose run or record was trained with other settings
    than the recipe and ``--set`` now give, naming each difference."""
    problems = [f"{name}: {', '.join(diff)}" for name, run_dir in runs.items()
                if (diff := recorded_differences(run_dir, recipe_of[name], overrides[name] + extra))]
    if problems:
        raise ValueError("the trained models differ from what the recipes and --set ask: " + "; ".join(problems)
                         + ". Train these settings into another --runs-root (and --out), or drop the --set")


def use_records(runs: dict[str, Path], identities: dict[str, dict], records: Path, budget: dict) -> dict[str, Path]:
    """Each model's run directory, or its record where the run directory is gone (never started
    here) and the record is of the same recipe, overrides and budget; a record of other settings
    is left alone and the model is trained anew."""
    chosen = {}
    for name, run_dir in runs.items():
        record = records / run_dir.name
        chosen[name] = run_dir
        if (run_dir / "metrics.jsonl").exists() or not is_record(record):
            continue
        kept = json.loads((record / RECORD).read_text())
        same = {k: kept.get(k) for k in identities[name]} == identities[name]
        if same and finished(record, budget):
            print(f"[cll-repro] {name}: trained before ({kept.get('hardware')}); using its record {record}",
                  file=sys.stderr)
            chosen[name] = record
        else:
            print(f"[cll-repro] {name}: its record {record} is of another recipe, override or budget "
                  f"({kept.get('recipe')}, {kept.get('overrides')}, {kept.get('budget')}); training it anew",
                  file=sys.stderr)
    return chosen


def plot_links(report: dict, figs: Path, prefix: str = "") -> list[str]:
    """Plot one evaluation report (BLEU/off-target; learned t_l when a model has CLL layers) into
    ``figs``; returns the markdown image links, relative to the folder that holds ``figs``."""
    from cll_scale.plots import plot_bleu_offtarget, plot_t_weights
    pngs = {"BLEU and off-target": plot_bleu_offtarget(report, figs / f"{prefix}bleu_offtarget.png"),
            "learned t_l": plot_t_weights(report, figs / f"{prefix}t_weights.png")}
    return [f"![{alt}]({figs.name}/{png.name})" for alt, png in pngs.items() if png]


def budget_text(budget: dict) -> str:
    parts = ([f"{budget['steps']:,} steps"] if budget["steps"] else []) + \
            ([f"{budget['minutes']:g} minutes"] if budget["minutes"] else [])
    return " or ".join(parts) + " of training per model" + (", whichever comes first" if len(parts) > 1 else "")


def trained_on(run_dir: Path, here: str) -> str:
    """The hardware a run was trained on: its record says so; a run of this sitting, ``here``."""
    return json.loads((run_dir / RECORD).read_text()).get("hardware", "?") if is_record(run_dir) else here


def trained_precision(run_dir: Path) -> str | None:
    """The precision a run trains in (its ``ds_config.json``, which its record keeps); None before
    it started."""
    path = run_dir / "ds_config.json"
    return ds.precision(json.loads(path.read_text())) if path.is_file() else None


def planned_precision(recipe: Path, overrides: list[str]) -> tuple[str, str]:
    """The precision cll-train trains (or resumes) a recipe in on this machine, and why."""
    train = apply_overrides(load_recipe(recipe), overrides).get("train", {})
    path, why = ds.resolve_ds_config(train.get("ds_config", TrainConfig.ds_config))
    return ds.precision(json.loads(path.read_text())), why


def check_one_precision(runs: dict[str, Path], planned: dict[str, tuple[str, str]], allow: bool) -> None:
    """The models of one report train in one precision, or the spread over seeds mixes the seed's
    effect with bf16's rounding. ``planned``: the models this sitting trains or resumes, with the
    precision this machine gives them. ``auto`` picks bf16 only where the CPU runs it fast, so a
    study begun on a CPU with avx512_bf16 and continued on one without would otherwise go on in
    fp32 unnoticed (and a run begun in one would be resumed in the other)."""
    used: dict[tuple[str, str], list[str]] = {}         # (precision, how) -> models
    for name, run_dir in runs.items():
        if (p := trained_precision(run_dir)) and not (name in planned and planned[name][0] == p):
            used.setdefault((p, "trained so far" if name in planned else "trained"), []).append(name)
    for name, (p, why) in planned.items():
        used.setdefault((p, f"this sitting: {why}"), []).append(name)
    if len({p for p, _ in used}) < 2:
        return
    what = "; ".join(f"{p}: {', '.join(names)} ({how})" for (p, how), names in used.items())
    if allow:
        print(f"[cll-repro] warning: this study mixes precisions ({what}); the report names each model's "
              f"precision",
              file=sys.stderr)
        return
    raise ValueError(f"the models of this study would train in more than one precision: {what}. Train the rest "
                     f"where the study's precision runs (a GPU; for bf16 on a CPU, one with avx512_bf16 or AMX), "
                     f"or pass --allow-mixed-precision (the report then names each model's precision)")


def validation_table(metrics: dict[str, list[dict]]) -> list[str]:
    """The plot's numbers: zero-shot off-target and supervised BLEU on validation at each
    validated step, one row a model (``metrics``: its metrics.jsonl rows; empty when no run
    validated)."""
    curves = {name: {row["step"]: row for row in rows if "valid_zero_shot_offtarget" in row}
              for name, rows in metrics.items()}
    steps = sorted({step for curve in curves.values() for step in curve})
    if not steps:
        return []
    lines = ["", "Validation over training (greedy, the first `train.valid_decode_sentences` sentences of each "
             "direction; off-target with the restricted language ID): zero-shot off-target % / supervised BLEU.",
             "", "| model | " + " | ".join(f"{s:,}" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
    for name, curve in curves.items():
        cells = [f"{curve[s]['valid_zero_shot_offtarget']:.0f} / {curve[s].get('valid_bleu', float('nan')):.1f}"
                 if s in curve else "–" for s in steps]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def write_report(condition: str, report_name: str, runs: dict[str, Path], reports: dict[str, dict], budget: dict,
                 command: str, out: Path, seed_groups: dict[str, list[str]] | None = None,
                 pending: tuple[str, ...] | list[str] = ()) -> Path:
    """The report of the models in ``runs``; ``pending``: the planned ones still to train, named
    at the top so that a report written part-way through a study says what it lacks."""
    from cll_scale.plots import plot_cll_layers, plot_validation_over_training
    figs = out / report_name
    figs.mkdir(parents=True, exist_ok=True)
    same = ("for every model of one seed the same initial seed, data order and settings" if seed_groups
            else "same seed, data order and settings for every model")
    here = hardware()
    machines = {name: f"{trained_on(d, here)}; {trained_precision(d) or '?'}" for name, d in runs.items()}
    metrics = {name: read_rows(d / "metrics.jsonl") for name, d in runs.items()}
    one_machine = len(set(machines.values())) == 1
    lines = [f"# Multi30k, {condition} condition: Baseline vs CLL", "",
             f"Command: `{command}`", "",
             (f"Hardware: {next(iter(machines.values()))}. " if one_machine else
              "Hardware: per model, in the table below. ") +
             f"Budget: {budget_text(budget)}; {same} (the recipes differ only in the variant's settings).", "",
             *([f"**In progress: {len(runs)} of {len(runs) + len(pending)} models.** Still to train: "
                f"{', '.join(pending)}. The same command continues them and rewrites this report as each "
                f"one ends.", ""] if pending else []),
             "Evaluated checkpoint: the one with the lowest supervised validation NLL (`export-best/`; "
             "zero-shot directions play no part in the choice), else the last one.", "",
             "| model | steps | epochs | target tokens seen | training minutes | last train NLL | last valid NLL "
             "| evaluated step |" + ("" if one_machine else " trained on |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|" + ("" if one_machine else "---|")]
    for name, run_dir in runs.items():
        last = last_train_row(metrics[name])
        valid = [row for row in metrics[name] if "valid_nll" in row]
        lines.append(f"| {name} | {last.get('step', 0)} | {last.get('epoch', 0):.2f} | {last.get('tokens_seen', 0):,} "
                     f"| {last.get('elapsed_s', 0) / 60:.1f} | {last.get('nll', float('nan')):.3f} | "
                     f"{valid[-1]['valid_nll'] if valid else float('nan'):.3f} | "
                     f"{json.loads((chosen_export(run_dir) / 'export.json').read_text())['step']} |"
                     + ("" if one_machine else f" {machines[name]} |"))
    curve = plot_validation_over_training(metrics, figs / "validation_over_training.png")
    if curve:
        lines += ["", f"![validation over training: supervised BLEU, zero-shot off-target]({report_name}/{curve.name})"]
    lines += validation_table(metrics)
    for split, report in reports.items():
        lines += ["", f"## {split}", ""]
        if seed_groups:
            lines += ["Mean ± sample standard deviation over seeds, then every model of every seed.", "",
                      seed_table(report, seed_groups)]
        lines += [markdown(report), *plot_links(report, figs, f"{split}_")]
        sweep = plot_cll_layers(report, figs / f"{split}_cll_layers.png")
        if sweep:
            lines.append(f"![BLEU against the number of CLL layers (paper Fig. 4)]({figs.name}/{sweep.name})")
    path = out / f"{report_name}.md"
    write_atomic(path, "\n".join(lines) + "\n")
    return path


class Evaluations:
    """Each model's evaluation on every test split, kept on its own under
    ``<report>/evaluated/<split>/<model>.json`` and keyed by its export and the decoding settings:
    a re-run after an interruption, or with more seeds, decodes only what is new."""

    def __init__(self, args, shards: Path, splits: list[str], figs: Path, pool):
        self.args, self.shards, self.splits, self.figs, self.pool = args, shards, splits, figs, pool
        self.decoding = {"beam": args.beam, "max_sentences": args.max_sentences, "ablate_lsl": args.ablate_lsl,
                         "lid": list(args.lid)}
        if args.omit_lang_tag:      # only when asked: the evaluations cached before it existed still match
            self.decoding["omit_lang_tag"] = True
        self.done: dict[str, dict[str, dict]] = {}
        self.test_sets: dict[str, tuple] = {}       # read only if some model has to be decoded

    def test_set(self, split: str) -> tuple:
        if split not in self.test_sets:
            pairs = pairs_from_shards(self.shards, split)
            self.test_sets[split] = pairs, select_directions(pairs, None, split)
        return self.test_sets[split]

    def of(self, name: str, run_dir: Path) -> dict[str, dict]:
        """split -> the model's report entries, decoded now where no cached one fits."""
        if name in self.done:
            return self.done[name]
        settings = {"export": export_id(run_dir), **self.decoding}
        result, translator = {}, None
        for split in self.splits:
            cached = self.figs / "evaluated" / split / f"{file_name(name)}.json"
            previous = json.loads(cached.read_text()) if cached.exists() else {}
            if previous.get("settings") == settings:
                print(f"[cll-repro] {split}: {name} evaluated before with this export and these settings, "
                      f"reusing {cached}", file=sys.stderr)
                result[split] = previous["entries"]
                continue
            if is_record(run_dir):
                before = {k: v for k, v in previous.get("settings", {}).items() if k != "export"}
                raise ValueError(
                    f"{name}: only its record is left ({run_dir}: no weights), and it was not evaluated on "
                    f"{split} with these settings ({json_text(self.decoding)}; before: {json_text(before)}): "
                    f"evaluate with the settings it was evaluated with, or move the record away to train it again")
            print(f"[cll-repro] evaluating on {split}: {name}", file=sys.stderr)
            if translator is None:
                translator = Translator.load(chosen_export(run_dir), pick_device(None),
                                             TranslateConfig(DecodeConfig(beam=self.args.beam)))
            pairs, directions = self.test_set(split)
            result[split] = evaluate_entries(translator, name, pairs, directions, self.args.max_sentences,
                                             self.args.ablate_lsl, lambda s: print(s, file=sys.stderr),
                                             self.args.lid, self.pool, self.figs / "hyps" / split,
                                             self.args.omit_lang_tag)
            write_atomic(cached, json_text({"settings": settings, "entries": result[split]}, indent=1,
                                            ensure_ascii=False))
        self.done[name] = result
        return result


def seed_list(text: str) -> list[int]:
    seeds = [positive_int(x) for x in csv_list(text)]
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: expected distinct positive seeds, e.g. 1,2,3")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-repro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--condition", choices=("centered", "triangle", "square"), required=True)
    p.add_argument("--variants", default="baseline,fcll",
                   help="comma-separated variants with a recipe: baseline, fcll, sd (the FFN residual of the "
                        "middle encoder layer removed, as the authors' code), sd_attn (its self-attention "
                        "residual removed, as Liu et al. 2021)")
    p.add_argument("--settings", choices=SETTINGS, default="small",
                   help="small: the CPU-sized recipes; paper: the recipes that follow the authors' code; "
                        "paper_small: the authors' settings at the small size, the closest a CPU trains; "
                        "diagnostics: small models that each answer one question of issue 34")
    p.add_argument("--seeds", type=seed_list,
                   help="e.g. 1,2,3: train every variant once per seed and report mean ± std over them")
    p.add_argument("--steps-per-model", type=non_negative_int, default=0,
                   help="step budget: every variant sees exactly the same batches (preferred)")
    p.add_argument("--minutes-per-model", type=non_negative_float, default=0.0,
                   help="time budget (default 90 when no step budget is given)")
    p.add_argument("--multi30k", default=os.environ.get("MULTI30K", str(ROOT.parent / "shared" / "data" / "multi30k")))
    p.add_argument("--shards-root", default="runs/repro/shards")
    p.add_argument("--runs-root", default="runs/repro/runs")
    p.add_argument("--recipes", default=str(ROOT / "recipes"))
    p.add_argument("--out", default="runs/repro/results",
                   help="where the report goes (the project's own reports: --out docs/results)")
    p.add_argument("--splits", default="test_2016_flickr,test_2018_flickr")
    p.add_argument("--beam", type=positive_int, default=4)
    p.add_argument("--max-sentences", type=non_negative_int, default=0,
                   help="evaluate only the first N per direction (0: all)")
    p.add_argument("--set", action="append", default=[], help="recipe override for every model")
    p.add_argument("--parallel", type=positive_int, default=1,
                   help="models trained at once (a GPU holds several small ones), in the training order")
    p.add_argument("--eval-only", action="store_true", help="evaluate the existing exports, train nothing")
    p.add_argument("--allow-mixed-precision", action="store_true",
                   help="train the models still missing even where this machine trains them in another "
                        "precision than the study's trained ones (refused by default)")
    p.add_argument("--ablate-lsl", action="store_true",
                   help="also evaluate CLL models with their LSLs off (paper Tables 9-10)")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="also evaluate the models trained with language tags without the tag (paper Table 8)")
    p.add_argument("--cll-layers", metavar="SETS",
                   help="train each CLL variant once per set of decoder layers with CLL (1-based, e.g. "
                        "1-3,2-3,3), or 'sweep': paper Fig. 4's sets (layers removed from the bottom, then "
                        "from the top, down to one); the report is <condition>-cll-layers.md with BLEU "
                        "against the number of CLL layers")
    add_lid_arguments(p)
    add_debug_argument(p)
    return p


def recipe_prefix(condition: str, settings: str) -> str:
    """Recipes are ``multi30k_<condition>_<variant>.yaml`` for the small settings,
    ``multi30k_<condition>_<settings>_<variant>.yaml`` for the others."""
    return f"multi30k_{condition}_" + ("" if settings == "small" else f"{settings}_")


def settings_suffix(settings: str) -> str:
    """What run directories and reports of these settings add to their names."""
    return "" if settings == "small" else "-" + settings.replace("_", "-")


def recipe_files(recipes: Path, condition: str, settings: str) -> dict[str, Path]:
    """Variant name -> recipe, for a condition and settings (without the recipes of settings whose
    prefix extends this one: ``paper_small_fcll`` is not the paper settings' variant ``small_fcll``)."""
    prefix = recipe_prefix(condition, settings)
    longer = [q for q in (recipe_prefix(condition, s) for s in SETTINGS) if q != prefix and q.startswith(prefix)]
    return {p.stem[len(prefix):]: p for p in sorted(recipes.glob(f"{prefix}*.yaml"))
            if not any(p.stem.startswith(q) for q in longer)}


def plan_runs(args) -> tuple[dict[str, Path], dict[str, Path], dict[str, list[str]], dict[str, list[str]]]:
    """Every model to train, in training order (with seeds: seed 1 of every variant first), as
    name -> run dir, name -> recipe and name -> its own overrides, and variant -> its names."""
    variants = csv_list(args.variants)
    recipes = recipe_files(Path(args.recipes), args.condition, args.settings)
    missing = [v for v in variants if v not in recipes]
    if missing or not variants:            # before any shard is built
        prefix = recipe_prefix(args.condition, args.settings)
        raise ValueError(f"--variants {args.variants}: no recipe "
                         f"{', '.join(str(Path(args.recipes) / f'{prefix}{v}.yaml') for v in missing) or '(empty list)'}"
                         f"; variants with a {args.settings} recipe: {', '.join(recipes) or 'none'}")
    stem = f"multi30k-{args.condition}" + settings_suffix(args.settings)
    runs, recipe_of, overrides, groups = {}, {}, {}, {}
    sweeps = {v: layer_sweep(v, recipes[v], args.set, args.cll_layers) for v in variants}
    for seed in args.seeds or [None]:
        for v in variants:
            for model, own in sweeps[v]:
                name = model if seed is None else f"{model} seed{seed}"
                runs[name] = Path(args.runs_root) / (f"{stem}-{model.replace(' ', '-')}"
                                                     + ("" if seed is None else f"-seed{seed}"))
                recipe_of[name] = recipes[v]
                # One seed sets the initialisation and the data order alike.
                overrides[name] = own + ([] if seed is None else [f"train.seed={seed}", f"data.seed={seed}"])
                groups.setdefault(model, []).append(name)
    return runs, recipe_of, overrides, groups


def cll_layer_sets(text: str, decoder_layers: int) -> list[tuple[int, ...]]:
    """``--cll-layers``: 1-based decoder layer sets written ``1-3,2-3,3`` (a range or one layer
    each), or ``sweep``: paper Fig. 4's, every layer, then the lowest removed one at a time down
    to the top one alone, then the highest removed down to the bottom one alone."""
    d = decoder_layers
    if text == "sweep":
        return ([tuple(range(1, d + 1))] + [tuple(range(k, d + 1)) for k in range(2, d + 1)]
                + [tuple(range(1, k + 1)) for k in range(d - 1, 0, -1)])
    sets = []
    for item in csv_list(text):
        first, _, last = item.partition("-")
        if not (first.isdigit() and (last or first).isdigit() and 1 <= int(first) <= int(last or first) <= d):
            raise ValueError(f"--cll-layers {text}: {item!r} is not a layer or a range a-b of layers 1..{d}")
        sets.append(tuple(range(int(first), int(last or first) + 1)))
    if not sets or len(set(sets)) != len(sets):
        raise ValueError(f"--cll-layers {text}: give distinct layer sets, e.g. 1-{d},{d}")
    return sets


def layer_sweep(name: str, recipe: Path, overrides: list[str], spec: str | None) -> list[tuple[str, list[str]]]:
    """(model name, its own overrides) of a variant: itself, or with ``--cll-layers`` one model per
    layer set, its CLL in those decoder layers and its encoder as the variant has it (SD's residual
    change kept: paper Fig. 4's two curves are FCLL-like and SD-like variants)."""
    if spec is None:
        return [(name, [])]
    r = apply_overrides(load_recipe(recipe), overrides)
    cfg = ModelConfig(**{"vocab_size": 8, **PRESETS[r.get("preset", "small")], **r.get("model", {})})
    if not cfg.cll_layers:
        raise ValueError(f"--cll-layers: the {name} recipe {recipe} has no CLL layer to move; sweep a CLL variant")
    residual = ([f"model.residual_sublayer={cfg.residual_sublayer}", f"model.residual_layer={cfg.residual_layer}"]
                if cfg.residual_sublayer else [])
    return [(f"{name} cll{layers[0]}" + (f"-{layers[-1]}" if len(layers) > 1 else ""),
             ["model.variant=custom", f"model.cll_layers=[{','.join(str(i - 1) for i in layers)}]", *residual])
            for layers in cll_layer_sets(spec, cfg.decoder_layers)]


def mean_std(values: list[float], unit: str = "", digits: int = 2) -> str:
    """Mean ± sample std over seeds (paper Table 5 gives the variance over its seeds the same way);
    one seed is its value alone."""
    if len(values) < 2:
        return f"{values[0]:.{digits}f}{unit}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}{unit}"


def seed_table(report: dict, groups: dict[str, list[str]]) -> str:
    """:func:`mean_std` of each variant's averages, with the LSL-off rows when the report has them."""
    columns = [("zero-shot", "off_target", "%"), ("zero-shot", "off_target_restricted", "%"),
               ("zero-shot", "bleu", ""), ("supervised", "bleu", "")]
    lines = ["| model | seeds | zero-shot off-target (paper) | zero-shot off-target (restricted) "
             "| zero-shot BLEU | supervised BLEU |", "|---|---:|---:|---:|---:|---:|"]
    models = report["models"]
    for variant, names in groups.items():
        for suffix in ("", LSL_OFF, TAG_OMITTED):
            rows = [models[n + suffix]["averages"] for n in names if n + suffix in models]
            if not rows:
                continue
            cells = [mean_std([r[group][key] for r in rows], unit) if all(group in r for r in rows) else "–"
                     for group, key, unit in columns]
            lines.append(f"| {variant}{suffix} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def reproduce(args, argv) -> int:
    # The commands run from the project root: every path they get is absolute.
    for name in ("shards_root", "runs_root", "recipes", "out", "multi30k"):
        setattr(args, name, str(Path(getattr(args, name)).resolve()))
    command = "cll-repro " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    budget = {"steps": args.steps_per_model,
              "minutes": args.minutes_per_model or (0.0 if args.steps_per_model else 90.0)}
    runs, recipe_of, overrides, groups = plan_runs(args)
    # A multi-seed study is its own report (``<condition>-seeds.md``) beside the one-seed one.
    report_name = (args.condition + settings_suffix(args.settings) + ("-cll-layers" if args.cll_layers else "")
                   + ("-seeds" if args.seeds else ""))
    figs = Path(args.out) / report_name
    identities = {name: training_identity(recipe_of[name], overrides[name] + args.set, budget) for name in runs}
    runs = use_records(runs, identities, figs / "records", budget)
    check_trained_settings(runs, recipe_of, overrides, args.set)
    if not args.eval_only:
        # Once per recipe, not per model: a seed's own overrides set train.seed and data.seed only.
        to_train = [name for name, d in runs.items() if not finished(d, budget)]
        planned = {r: planned_precision(r, args.set) for r in {recipe_of[name] for name in to_train}}
        check_one_precision(runs, {name: planned[recipe_of[name]] for name in to_train}, args.allow_mixed_precision)
    else:
        absent = [str(chosen_export(d)) for d in runs.values() if not (chosen_export(d) / "export.json").exists()]
        if absent:
            raise ValueError(f"--eval-only: no trained model at {', '.join(absent)}; train first (without "
                             f"--eval-only) or point --runs-root at the runs")
    shards = Path(args.shards_root) / f"multi30k-{args.condition}"
    build_shards(args.condition, args.multi30k, shards)
    splits = args.splits.split(",")
    with lid_pool(args.lid_workers) as pool:         # its workers start with the first job scored
        evaluations = Evaluations(args, shards, splits, figs, pool)

        def settle(name: str) -> None:
            """Evaluate a trained model now, and keep its record: a sitting that ends while other
            models train loses none of the finished ones."""
            if name in evaluations.done:
                return
            evaluations.of(name, runs[name])
            if not is_record(runs[name]) and finished(runs[name], budget):
                write_record(runs[name], figs / "records" / runs[name].name, identities[name])

        def report() -> Path:
            """The report of every model settled so far: a study that spans sittings shows what it
            has at the end of each, not only once its last model is trained."""
            settled = {name: d for name, d in runs.items() if name in evaluations.done}
            pending = [name for name in runs if name not in settled]
            reports = {}
            for split in splits:
                entries = {k: v for name in settled for k, v in evaluations.done[name][split].items()}
                reports[split] = summarize(entries, f"Multi30k {split}", args.beam, args.lid,
                                           log=lambda s: print(s, file=sys.stderr))
                write_atomic(figs / f"{split}.json", json_text(reports[split], indent=1, ensure_ascii=False))
            path = write_report(args.condition, report_name, settled, reports, budget, command, Path(args.out),
                                groups if args.seeds else None, pending)
            print(f"[cll-repro] wrote {path}: {len(settled)} of {len(runs)} models"
                  + (f", still to train: {', '.join(pending)}" if pending else ""), file=sys.stderr)
            return path

        if not args.eval_only:
            # The models trained in earlier sittings first (cached evaluations make that cheap), so
            # the report holds them before the first training of this sitting ends.
            commands, ready = [], []
            for name, run_dir in runs.items():
                cmd = train_command(recipe_of[name], run_dir, shards, budget, overrides[name] + args.set)
                if cmd:
                    commands.append((name, run_dir, cmd))
                else:
                    ready.append(name)
            for name in ready:
                settle(name)
            if ready and commands:
                report()

            def trained(name: str) -> None:
                settle(name)
                if len(evaluations.done) < len(runs):      # the last one's report is written below
                    report()

            train_all(commands, args.parallel, done=trained)
        for name in runs:
            settle(name)
        path = report()
    print(path.read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run("cll-repro", lambda: reproduce(args, argv), args.debug)


if __name__ == "__main__":
    sys.exit(main())

"""Where each model of a study stands, and its record: a finished run's metrics, configs and
export manifests kept beside the report (no weights), which stands in for the run directory when
that is gone, if it was trained with the same recipe, overrides and budget."""
from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from cll_scale.core.compat import RULES, as_first_named, upgrade_override
from cll_scale.core.hardware import hardware
from cll_scale.core.jsonfiles import read_json_object
from cll_scale.core.outputs import json_text, write_atomic
from cll_scale.repro.plan import Budget
from cll_scale.run.recipe import SECTIONS, TrainConfig, apply_overrides, load_recipe, named_rules, training_rules
from cll_scale.model.export import ExportInfo
from cll_scale.training.precision import trained_precision
from cll_scale.training.rundir import BEST_EXPORT, CONFIG, METRICS, RunDir, chosen_export

# What a record keeps of a finished run: everything the report and the evaluation cache read,
# without the weights and checkpoints (about 100 MB a `small` model).
RECORD_FILES = (METRICS, CONFIG, "ds_config.json", "git.txt", "versions.json", "export/export.json",
                f"{BEST_EXPORT}/export.json")
RECORD = "record.json"
# Train settings that cll-repro sets per run, through its budget and its --precision (the precision
# an engine settings file names is compared on its own, check_one_precision).
PER_RUN = {"shards", "run_dir", "max_steps", "max_minutes", "max_epochs", "ds_config"}


def last_train_row(rows: list[dict]) -> dict:
    """The last training line of a run's metrics (validation lines carry no loss)."""
    return next((row for row in reversed(rows) if "loss" in row), {})


def run_state(run_dir: Path) -> dict:
    """Where a run stands: its last metrics line and whether the export is current."""
    last = last_train_row(RunDir(run_dir).metrics())
    export = run_dir / "export"
    exported_step = ExportInfo.load(export).step if ExportInfo.exists(export) else None
    return {"last": last, "exported_step": exported_step}


def export_id(run_dir: Path) -> str:
    """The evaluated export's identity: the hash of its export.json, which holds every file's sha256."""
    return hashlib.sha256((chosen_export(run_dir) / "export.json").read_bytes()).hexdigest()


def finished(run_dir: Path, budget: Budget, state: dict | None = None) -> bool:
    """The run spent this budget and exported its last step (``state``: its run_state, if read)."""
    state = state or run_state(run_dir)
    last = state["last"]
    spent = TrainConfig(max_steps=budget.steps, max_minutes=budget.minutes).budget_spent(
        last.get("step", 0), last.get("epoch", 0.0), last.get("elapsed_s", 0.0))
    return spent and state["exported_step"] == last.get("step")


def training_identity(recipe: Path, overrides: list[str], budget: Budget) -> dict:
    """What decides a trained model: the recipe's settings, the overrides and the budget. The
    settings are hashed as read (moved settings in their sections, renamed ones under their first
    names, empty sections left out, keys sorted), so rewording a recipe keeps its records."""
    settings = {k: v for k, v in as_first_named(load_recipe(recipe)).items() if v not in ({}, None)}
    return {"recipe": recipe.name,
            "recipe_settings_sha256": hashlib.sha256(json_text(settings, sort_keys=True).encode()).hexdigest(),
            "recipe_sha256": hashlib.sha256(recipe.read_bytes()).hexdigest(),
            "overrides": list(overrides), "budget": budget.as_dict()}


def _same_recipe(kept: dict, wanted: dict) -> bool:
    """The settings' hash where the record has one; a record of before it (cll-scale 2026-12-05
    and older) has only the recipe's bytes."""
    key = "recipe_settings_sha256" if "recipe_settings_sha256" in kept else "recipe_sha256"
    return kept.get("recipe") == wanted["recipe"] and kept.get(key) == wanted[key]


def is_record(run_dir: Path) -> bool:
    return (run_dir / RECORD).is_file()


def trained_on(run_dir: Path, here: str) -> str:
    """The hardware a run was trained on: its record says so; a run of this sitting, ``here``."""
    return read_json_object(run_dir / RECORD).get("hardware", "?") if is_record(run_dir) else here


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


def use_records(runs: dict[str, Path], identities: dict[str, dict], records: Path, budget: Budget) -> dict[str, Path]:
    """Each model's run directory, or its record where the run directory is gone (never started
    here) and the record is of the same recipe, overrides and budget; a record of other settings
    is left alone and the model is trained anew."""
    chosen = {}
    for name, run_dir in runs.items():
        record = records / run_dir.name
        chosen[name] = run_dir
        if RunDir(run_dir).has_metrics() or not is_record(record):
            continue
        kept = read_json_object(record / RECORD)
        trained = recorded_rules(record)
        wanted = _as_trained(identities[name], trained)
        same = _same_recipe(kept, wanted) and all(_as_trained(kept, trained).get(k) == wanted[k]
                                                  for k in ("overrides", "budget"))
        if same and finished(record, budget):
            print(f"[cll-repro] {name}: trained before ({kept.get('hardware')}); using its record {record}",
                  file=sys.stderr)
            chosen[name] = record
        else:
            print(f"[cll-repro] {name}: its record {record} is of another recipe, override or budget "
                  f"({kept.get('recipe')}, {kept.get('overrides')}, {kept.get('budget')}); training it anew",
                  file=sys.stderr)
    return chosen


def recorded_differences(run_dir: Path, recipe: Path, overrides: list[str]) -> list[str]:
    """What the recipe and overrides ask that the run (or record) in ``run_dir`` was not trained
    with, read from its config.json: a rerun with another ``--set`` must not report a model
    under settings it never had."""
    if not RunDir(run_dir).has_config():
        return []
    trained = RunDir(run_dir).config()              # a run of before the sections reads the same
    wanted = apply_overrides(load_recipe(recipe), list(overrides))       # both map moved settings
    diff = []
    for section in SECTIONS:
        for key, value in (wanted.get(section) or {}).items():
            if section == "train" and key in PER_RUN or key not in trained.get(section, {}):
                continue
            have = trained[section][key]
            same = have == value or (isinstance(have, (int, float)) and isinstance(value, (int, float, str))
                                     and not isinstance(value, bool) and _as_number(value) == have)
            if not same:
                diff.append(f"{section}.{key}={value!r} (trained with {have!r})")
    return diff


def _as_trained(identity: dict, trained: dict[str, object]) -> dict:
    """``identity``, its overrides under today's names, without those that restate a training rule
    the record was trained with (``trained``: its :func:`recorded_rules`; ``--set data.mixing=direction``
    on a record of before issue 34, whose recipe names no rule): they ask nothing the record does
    not have, so a study continued under its own rules keeps its records."""
    def restates(item: str) -> bool:
        key = item.partition("=")[0]
        return key in trained and named_rules(apply_overrides({}, [item])).get(key) == trained[key]

    return {**identity, "overrides": [o for o in map(upgrade_override, identity.get("overrides") or []) if not restates(o)]}


def recipe_rules(recipe: Path, overrides: list[str]) -> tuple[dict[str, object], dict[str, object]]:
    """The training rules a recipe with these overrides names itself, and all it trains with today
    (the unnamed ones at today's defaults)."""
    config = apply_overrides(load_recipe(recipe), list(overrides))
    return named_rules(config), training_rules(config, recorded=False)


def recorded_rules(run_dir: Path) -> dict[str, object]:
    """The training rules a run (or record) was trained with, from its config.json (core.compat.LEGACY)."""
    return training_rules(RunDir(run_dir).config(), recorded=True)


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


def check_one_precision(runs: dict[str, Path], planned: dict[str, tuple[str, str]], allow: bool) -> None:
    """The models of one report train in one precision, or the spread over seeds mixes the seed's
    effect with bf16's rounding. ``planned``: the models this sitting trains or resumes, with the
    precision this machine gives them (:func:`cll_scale.repro.plan.planned_precision`). ``auto``
    picks bf16 only where the CPU runs it fast, so a study begun on a CPU with avx512_bf16 and
    continued on one without would otherwise go on in fp32 unnoticed (and a run begun in one
    would be resumed in the other)."""
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
    trained = sorted({p for (p, how), _ in used.items() if how.startswith("trained")})
    fix = f"pass --precision {trained[0]} to train the rest in the study's precision" if len(trained) == 1 else \
        "train the rest in one precision (--precision)"
    raise ValueError(f"the models of this study would train in more than one precision: {what}. To keep one, {fix} "
                     f"(bf16 on a CPU without avx512_bf16 or AMX runs its matmuls in fp32 on bf16 values, at about "
                     f"0.9x fp32's speed), or pass --allow-mixed-precision (the report then names each model's "
                     f"precision)")


def check_one_rule(runs: dict[str, Path], rules: dict[str, tuple[dict, dict]], planned: list[str]) -> None:
    """A training rule (core.compat.LEGACY: issue 34's ``data.mixing`` and ``model.lsl_dropout``) differs
    between the models of one report only where their recipes say so. The study recipes of before
    name neither rule, so a study begun under the old defaults and continued today would
    otherwise average seeds of two rules without a word. ``rules``: each model's
    :func:`recipe_rules`; ``planned``: the models this sitting trains or resumes."""
    trained = {name: recorded_rules(d) for name, d in runs.items() if RunDir(d).has_config()}
    problems, fix = [], {}
    for key in RULES:
        values: dict[object, list[str]] = {}
        for name in runs:
            if key in rules[name][0]:
                continue                                   # the recipe names it: meant to differ
            if name in trained:
                fix[key] = trained[name][key]
                values.setdefault(fix[key], []).append(f"{name} (trained)")
            if name in planned:
                values.setdefault(rules[name][1][key], []).append(f"{name} (this sitting)")
        if len(values) > 1:
            problems.append(f"{key} " + "; ".join(f"{v}: {', '.join(names)}" for v, names in values.items()))
    if problems:
        raise ValueError(f"the models of this study would train under different rules that their recipes do not "
                         f"name ({' | '.join(problems)}); the defaults changed with issue 34. Continue the study "
                         f"as it was trained with " + " ".join(f"--set {k}={v}" for k, v in fix.items())
                         + ", or train today's rules into another --runs-root and --out")

"""What a study trains: the recipe families, the models of a condition (variants × seeds × CLL
layer sets), their run directories, recipes and overrides, and the step or time budget."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cll_scale.core.cli import csv_list
from cll_scale.model.config import PRESETS, ModelConfig
from cll_scale.run.recipe import TrainConfig, apply_overrides, load_recipe
from cll_scale.training.precision import ds_config_of, precision, read_ds_config, resolve_ds_config

CONDITIONS = ("centered", "triangle", "square", "cycle", "centered-cycle")    # cll_scale.data.corpora, paper §4.1
# The recipe families: the study's (issue 20), the diagnostics of issue 34 (small, 2,100 steps,
# one question per variant; docs/results/triangle-diagnostics.md), and make quickstart's (issue 52).
SETTINGS = ("small", "paper", "paper_small", "diagnostics", "quickstart")


@dataclass(frozen=True)
class Budget:
    """Training per model: a step budget (every variant sees exactly the same batches) or a time
    budget, whichever ends first when both are given."""
    steps: int = 0
    minutes: float = 0.0

    @classmethod
    def of(cls, steps: int, minutes: float) -> "Budget":
        """The CLI's rule: 90 minutes when neither is given."""
        return cls(steps, minutes or (0.0 if steps else 90.0))

    def as_dict(self) -> dict:
        """As records keep it (``record.json``'s ``budget``)."""
        return {"steps": self.steps, "minutes": self.minutes}

    def text(self) -> str:
        parts = ([f"{self.steps:,} steps"] if self.steps else []) + \
                ([f"{self.minutes:g} minutes"] if self.minutes else [])
        return " or ".join(parts) + " of training per model" + (", whichever comes first" if len(parts) > 1 else "")


@dataclass
class Plan:
    """Every model to train, in training order (with seeds: seed 1 of every variant first)."""
    runs: dict[str, Path] = field(default_factory=dict)            # name -> run directory
    recipe_of: dict[str, Path] = field(default_factory=dict)       # name -> recipe
    overrides: dict[str, list[str]] = field(default_factory=dict)  # name -> its own overrides
    groups: dict[str, list[str]] = field(default_factory=dict)     # model -> its names over seeds


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


def plan_runs(condition: str, variants: list[str], settings: str, recipes_dir: Path, runs_root: Path,
              seeds: list[int] | None = None, overrides: list[str] = (), cll_layers: str | None = None) -> Plan:
    """The models of a study; ``overrides`` (``--set``) apply to every model and decide nothing
    here but the CLL layer sweep's base."""
    recipes = recipe_files(recipes_dir, condition, settings)
    missing = [v for v in variants if v not in recipes]
    if missing or not variants:            # before any shard is built
        prefix = recipe_prefix(condition, settings)
        asked = ",".join(variants)
        raise ValueError(f"--variants {asked}: no recipe "
                         f"{', '.join(str(recipes_dir / f'{prefix}{v}.yaml') for v in missing) or '(empty list)'}"
                         f"; variants with a {settings} recipe: {', '.join(recipes) or 'none'}")
    stem = f"multi30k-{condition}" + settings_suffix(settings)
    plan = Plan()
    sweeps = {v: layer_sweep(v, recipes[v], list(overrides), cll_layers) for v in variants}
    for seed in seeds or [None]:
        for v in variants:
            for model, own in sweeps[v]:
                name = model if seed is None else f"{model} seed{seed}"
                plan.runs[name] = runs_root / (f"{stem}-{model.replace(' ', '-')}"
                                               + ("" if seed is None else f"-seed{seed}"))
                plan.recipe_of[name] = recipes[v]
                # One seed sets the initialisation and the data order alike.
                plan.overrides[name] = own + ([] if seed is None else [f"train.seed={seed}", f"data.seed={seed}"])
                plan.groups.setdefault(model, []).append(name)
    return plan


def cll_layer_sets(text: str, decoder_layers: int) -> list[tuple[int, ...]]:
    """``--cll-layers``: decoder layer sets numbered from 0, as ``model.cll_layers`` numbers them,
    written ``0-2,1-2,2`` (a range or one layer each), or ``sweep``: paper Fig. 4's, every layer,
    then the lowest removed one at a time down to the top one alone, then the highest removed down
    to the bottom one alone (the figure counts layers from 1)."""
    d = decoder_layers
    if text == "sweep":
        return ([tuple(range(d))] + [tuple(range(k, d)) for k in range(1, d)]
                + [tuple(range(k)) for k in range(d - 1, 0, -1)])
    sets = []
    for item in csv_list(text):
        first, _, last = item.partition("-")
        if not (first.isdigit() and (last or first).isdigit() and 0 <= int(first) <= int(last or first) < d):
            raise ValueError(f"--cll-layers {text}: {item!r} is not a layer or a range a-b of layers 0..{d - 1} "
                             "(numbered from 0, as model.cll_layers)")
        sets.append(tuple(range(int(first), int(last or first) + 1)))
    if not sets or len(set(sets)) != len(sets):
        raise ValueError(f"--cll-layers {text}: give distinct layer sets, e.g. 0-{d - 1},{d - 1}")
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
             ["model.variant=custom", f"model.cll_layers=[{','.join(map(str, layers))}]", *residual])
            for layers in cll_layer_sets(spec, cfg.decoder_layers)]


def planned_precision(recipe: Path, overrides: list[str], asked: str = "auto") -> tuple[str, str]:
    """The precision cll-train trains (or resumes) a recipe in on this machine, and why, named
    where it comes from: ``asked`` (cll-repro's ``--precision``, which decides over the recipe as
    it does for the trainings cll-repro starts), an override of ``train.ds_config`` (``--set``),
    the recipe, or ``auto``'s choice for this machine."""
    if asked != "auto":
        path, _ = resolve_ds_config(ds_config_of(asked))
        return precision(read_ds_config(path)), f"--precision {asked}"
    train = apply_overrides(load_recipe(recipe), overrides).get("train", {})
    value = train.get("ds_config", TrainConfig.ds_config)
    path, why = resolve_ds_config(value)
    if str(value) != "auto" and any(o.partition("=")[0].strip() == "train.ds_config" for o in overrides):
        why = f"--set train.ds_config={value}"
    return precision(read_ds_config(path)), why

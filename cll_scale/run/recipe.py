"""The recipe layer: the file a user writes, gathered into one typed config per component.

A recipe has one section per component, each a dataclass in its component's layer (in a module
that imports no torch, so that ``cll-train --help`` answers at once); this module sits above them
all and is the only one that knows the whole list:

=============  ==================================================  ================================
section        dataclass                                           used by
=============  ==================================================  ================================
``model``      ``cll_scale.model.config.ModelConfig`` (PRESETS)    the CLL Transformer
``data``       ``cll_scale.data.stream_config.StreamConfig``       the training stream
``optim``      ``cll_scale.training.configs.OptimConfig``          AdamW and its schedule
``checkpoint`` ``cll_scale.training.configs.CheckpointConfig``     checkpoints and exports
``valid``      ``cll_scale.training.configs.ValidConfig``          validation and model selection
``log``        ``cll_scale.training.configs.LogConfig``            metrics.jsonl, the monitor, MFU
``train``      :class:`TrainConfig` (here)                         the run: data, budget, numerics
=============  ==================================================  ================================

Every field made with ``setting()`` is also a ``cll-train`` flag (``--optim.lr``), its default
and help written once, in its dataclass (:func:`add_recipe_arguments`). DeepSpeed's JSON
files in ``ds_configs/`` hold engine settings only (ZeRO stage, precision, offload, monitor); batch
size, accumulation, clipping and learning rate are filled in by
``cll_scale.training.engine.make_ds_config``. Old names are read through :mod:`cll_scale.core.compat`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from cll_scale.core.cli import add_config_arguments, default_text
from cll_scale.core.compat import LEGACY, MOVED, notice, upgrade
from cll_scale.core.settings import coerce_number, default_of, setting
from cll_scale.data.inputs import source_length
from cll_scale.data.stream_config import StreamConfig
from cll_scale.model.config import DEFAULT_PRESET, PRESETS, ModelConfig
from cll_scale.training.configs import CheckpointConfig, LogConfig, OptimConfig, ValidConfig


@dataclass
class TrainConfig:
    """The recipe's ``train`` section: what the run trains on, where it writes, its budget and its
    numerics. (The other sections own the optimizer, checkpoints, validation and logging.)"""

    shards: str = setting("", "shard directory (cll-shards build)", flag="--data")
    run_dir: str = setting("runs/default", "run directory", flag="--run-dir")
    ds_config: str = setting("auto", "a ds_configs/*.json (engine settings), or auto: gpu_bf16 on CUDA; on a CPU "
                        "cpu_bf16 where a probe finds bf16 faster than fp32 (avx512_bf16, AMX), else cpu_fp32",
                        flag="--ds-config")
    grad_accum: int = setting(1, "microbatches (token-budget batches) per optimizer step and rank")
    label_smoothing: float = setting(0.1, "label smoothing of the training loss")
    compile: str = setting("", "a torch.compile backend (inductor), applied per block and to the loss with "
                      "dynamic shapes; empty: eager")
    seed: int = setting(1, "seed of the initial weights and of dropout")
    # starting point (fine-tuning: back-translation, new-language extension)
    init_from: str = setting("", "an export/ to start from: architecture and weights, fresh optimizer")
    freeze: list[str] = setting([], "parameter-name globs kept fixed, e.g. [\"encoder.*\"]")
    new_data: bool = setting(False, "--resume on other shards: weights and optimizer carry on, the stream "
                             "starts afresh")
    # budget: whichever comes first
    max_steps: int = setting(0, "stop after this many steps (0: no step limit)", flag="--max-steps")
    max_epochs: float = setting(0.0, "stop after this many epochs of train.shards (0: no limit)")
    max_minutes: float = setting(0.0, "stop after this many minutes of training (0: no limit)", flag="--max-minutes")
    max_skips_in_a_row: int = setting(50, "skipped steps in a row (non-finite, out of memory) that end the run")

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing must be in [0, 1), not {self.label_smoothing}")
        if self.grad_accum < 1 or self.max_skips_in_a_row < 1:
            raise ValueError("train.grad_accum and train.max_skips_in_a_row must be >= 1")
        if min(self.max_steps, self.max_minutes, self.max_epochs) < 0:
            raise ValueError("max_steps, max_epochs and max_minutes must be >= 0")
        if self.seed < 0:
            raise ValueError(f"train.seed must be >= 0, not {self.seed}")

    def budget_spent(self, step: int, epoch: float, elapsed_s: float) -> bool:
        """Whichever of max_steps, max_epochs and max_minutes comes first (0: no limit)."""
        return bool((self.max_steps and step >= self.max_steps)
                    or (self.max_epochs and epoch >= self.max_epochs)
                    or (self.max_minutes and elapsed_s >= self.max_minutes * 60))


def section_classes() -> dict[str, type]:
    """Each recipe section's dataclass, in the order config.json lists them."""
    return {"model": ModelConfig, "data": StreamConfig, "optim": OptimConfig, "checkpoint": CheckpointConfig,
            "valid": ValidConfig, "log": LogConfig, "train": TrainConfig}


SECTIONS = tuple(section_classes())


def load_recipe(path: str | Path) -> dict:
    """A recipe: ``{"preset": ..., "model": {...}, "data": {...}, "optim": {...}, ...}`` in YAML
    or JSON. A file that does not parse, or whose sections are not mappings, is an error naming
    the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                         "save the recipe as UTF-8") from None
    recipe = _parse(text, str(path))
    if not isinstance(recipe, dict):
        raise ValueError(f"{path}: a recipe is a mapping with sections preset, {', '.join(SECTIONS)}; "
                         f"this file holds a {type(recipe).__name__}")
    unknown = set(recipe) - {"preset", *SECTIONS}
    if unknown:
        raise ValueError(f"{path}: unknown recipe sections {sorted(unknown)} "
                         f"(expected preset, {', '.join(SECTIONS)})")
    check_sections(recipe, str(path))
    return upgrade(recipe, str(path))


def _parse(text: str, path: str):
    """YAML (``.yaml``/``.yml``) or JSON, with the line of a syntax error. A key given twice in one
    mapping is an error in both: YAML and JSON parsers keep the last one silently, so a recipe with
    two ``optim:`` blocks lost the first."""
    if path.endswith((".yaml", ".yml")):
        import yaml
        try:
            return yaml.load(text, Loader=_unique_key_loader()) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ValueError(f"{path}:{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None

    def unique(pairs: list[tuple[str, object]]) -> dict:
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"{path}: {', '.join(map(repr, twice))} given twice in one object; the JSON parser "
                             "would keep only the last: merge them")
        return dict(pairs)
    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {err.lineno}, column {err.colno}: not valid JSON ({err.msg})") from None


def _unique_key_loader():
    """yaml's SafeLoader, refusing a key given twice in one mapping (a ``yaml.YAMLError`` with its line)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} given twice in one mapping (first on line {seen[key] + 1}); YAML "
                        "would keep only the last: merge them", key_node.start_mark)
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep)
    return UniqueKeyLoader


def check_sections(recipe: dict, where: str) -> None:
    """Each section a mapping, the preset a known name."""
    for section in SECTIONS:
        if section in recipe and not isinstance(recipe[section], dict):
            raise ValueError(f"{where}: section {section!r} must be a mapping of settings "
                             f"(key: value lines), not {recipe[section]!r}")
    preset = recipe.get("preset", DEFAULT_PRESET)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"{where}: unknown preset {preset!r}; presets: {', '.join(PRESETS)}")


def apply_overrides(recipe: dict, overrides: list[str]) -> dict:
    """``section.key=value`` (or ``preset=NAME``) overrides, each value read by its setting's type
    (:func:`flag_value`): a path or a name is taken as typed, never as YAML."""
    for item in overrides:
        key, eq, value = item.partition("=")
        if key == "preset" and eq:
            if value not in PRESETS:
                raise ValueError(f"unknown preset {value!r}; presets: {', '.join(PRESETS)}")
            recipe["preset"] = value
            continue
        if key in MOVED:
            notice(f"--set {key} is now {MOVED[key]} (read as such; the old name will go)")
            key = MOVED[key]
        section, dot, name = key.partition(".")
        if not eq or not dot or section not in SECTIONS:
            raise ValueError(f"override {item!r}: expected section.key=value, section in {'/'.join(SECTIONS)}")
        recipe.setdefault(section, {})[name] = flag_value(section, name, value)
    return recipe


def _kind(section: str, name: str) -> tuple[str, str, bool] | None:
    """How a setting is typed: (``str``/``list``/``number``, element type of a list, may be None),
    or None for a name the section does not have (its error, with a suggestion, comes later)."""
    f = next((f for f in dataclasses.fields(section_classes()[section]) if f.name == name), None)
    return None if f is None else _field_kind(f)


def _field_kind(f: dataclasses.Field) -> tuple[str, str, bool]:
    parts = [part.strip() for part in str(f.type).split("|")]
    optional, (main,) = "None" in parts, [part for part in parts if part != "None"]
    if main.startswith(("list[", "tuple[")):
        return "list", main[main.index("[") + 1:].split(",")[0].rstrip("]").strip(), optional
    return ("str" if main == "str" else "number"), "", optional


def flag_value(section: str, name: str, text: str):
    """A ``--set``/flag value as its setting's type wants it. A string setting (a path, a name)
    is the text as typed: YAML would drop `` #1`` as a comment, read ``a: b`` as a mapping and
    ``yes`` as true. A list takes ``[a, b]`` (YAML/JSON) or ``a,b``. Numbers and switches are read
    as YAML (``7e-4``, ``true``) and checked by :func:`coerce_number`."""
    import yaml
    kind = _kind(section, name)
    if kind is not None and kind[2] and text.strip().lower() in ("null", "none", "~"):
        return None
    if kind is not None and kind[0] == "str":
        return text
    if kind is not None and kind[0] == "list" and not text.lstrip().startswith("["):
        return text                      # a comma-separated list; split at the boundary (_coerce)
    return yaml.safe_load(text)


_LIST_EXAMPLES = {"int": "[0, 2] or 0,2", "float": "[0.9, 0.98] or 0.9,0.98"}


def _checked_value(section: str, name: str, value, kind: tuple[str, str, bool]):
    """The boundary for strings and lists, from a recipe file or a flag alike: a string setting
    holds a string, a list setting a list (a comma-separated string is split; nothing else is
    iterated, so ``freeze: encoder.*`` is one pattern, not nine characters)."""
    what, element, optional = kind
    key = f"{section}.{name}"
    if value is None and optional:
        return None
    if what == "str":
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, not {value!r} (in a YAML recipe, put it in quotes; "
                             f"an empty value is null there: write '' for an empty string)")
        return value
    if what != "list":
        return value
    if isinstance(value, str):
        value = [item.strip() for item in value.split(",") if item.strip()]
    if not isinstance(value, (list, tuple)):
        example = _LIST_EXAMPLES.get(element, "[a, b] or a,b")
        raise ValueError(f"{key} must be a list, e.g. {example}; not {value!r}")
    if element in ("int", "float"):
        return [coerce_number(f"{key}[{i}]", item, int if element == "int" else float) for i, item in enumerate(value)]
    bad = [item for item in value if not isinstance(item, str)]
    if bad:
        raise ValueError(f"{key} must be a list of strings, e.g. [a, b] or a,b; {bad[0]!r} is not one")
    return list(value)


def _numeric_kind(f: dataclasses.Field) -> type | None:
    """``bool``, ``int`` or ``float`` for a field annotated so (``int | None`` too), else None."""
    names = {part.strip() for part in str(f.type).split("|")} - {"None"}
    return {"bool": bool, "int": int, "float": float}.get(names.pop()) if len(names) == 1 else None


def _coerce(cls, section: str, kw: dict) -> dict:
    """Recipe values checked against their field: known names, numbers as :func:`coerce_number` says."""
    out = dict(kw)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in out:
        if key not in names:
            raise ValueError(f"unknown setting {section}.{key}; " + _suggest(section, str(key), names))
    for f in dataclasses.fields(cls):
        if f.name not in out:
            continue
        kind = _numeric_kind(f)
        if kind is not None and out[f.name] is not None:
            out[f.name] = coerce_number(f"{section}.{f.name}", out[f.name], kind)
        elif kind is None:
            out[f.name] = _checked_value(section, f.name, out[f.name], _field_kind(f))
    return out


def _suggest(section: str, key: str, names: list[str]) -> str:
    """A near name in the section, else in another section, else the section's names."""
    import difflib
    near = difflib.get_close_matches(key, names, n=1)
    if near:
        return f"did you mean {section}.{near[0]}?"
    others = {f.name: name for name, cls in section_classes().items() if name != section
              for f in dataclasses.fields(cls)}
    near = difflib.get_close_matches(key, list(others), n=1)
    if near:
        return f"did you mean {others[near[0]]}.{near[0]}?"
    return f"{section} settings are {', '.join(names)}"


def check_recipe(recipe: dict, where: str) -> None:
    """What can be checked of a recipe (overrides applied) without its shards: every setting's
    name, and every section's values but the model's (whose sizes come from the shards). A command
    that starts trainings later (cll-repro) calls this first, so that a misspelled ``--set`` key is
    found before any shard is built."""
    check_sections(recipe, where)
    for section, cls in section_classes().items():
        values = recipe.get(section) or {}
        try:
            if section == "model":
                names = [f.name for f in dataclasses.fields(cls)]
                unknown = next((key for key in values if key not in names), None)
                if unknown is not None:
                    raise ValueError(f"unknown setting model.{unknown}; " + _suggest(section, str(unknown), names))
            else:
                build_section(section, values)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None


def build_section(section: str, values: dict):
    """One section's dataclass from recipe values, checked at the boundary."""
    cls = section_classes()[section]
    try:
        return cls(**_coerce(cls, section, values))
    except TypeError as err:
        raise ValueError(f"recipe: {err}") from None


@dataclass
class RunConfig:
    """A recipe resolved against a shard manifest: one typed config per section."""
    preset: str
    model: ModelConfig
    data: StreamConfig
    optim: OptimConfig
    checkpoint: CheckpointConfig
    valid: ValidConfig
    log: LogConfig
    train: TrainConfig

    def to_json(self) -> dict:
        """config.json of a run (every section, then the preset's name first)."""
        return {"preset": self.preset, **{name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}}


def named_rules(config: dict) -> dict[str, object]:
    """The :data:`LEGACY` rules a recipe (overrides applied) or a run's config.json names itself,
    as ``{"data.mixing": ..., ...}``."""
    config = upgrade(config)
    return {f"{section}.{key}": config[section][key] for section, legacy in LEGACY.items() for key in legacy
            if key in (config.get(section) or {})}


def training_rules(config: dict, recorded: bool) -> dict[str, object]:
    """Every :data:`LEGACY` rule a config trains with: the ones it names, and for the others,
    today's default (the preset's, else the field's) for a recipe, or the legacy rule for a run's
    config.json (``recorded``), which was written before the rule existed."""
    preset = PRESETS.get(config.get("preset", DEFAULT_PRESET), {})
    classes = section_classes()
    unnamed = {f"{section}.{key}": old if recorded else
               (preset if section == "model" else {}).get(key, default_of(classes[section], key))
               for section, legacy in LEGACY.items() for key, old in legacy.items()}
    return {**unnamed, **named_rules(config)}


def build_configs(recipe: dict, languages: list[str], central: str | None, tokenizer,
                  where: str = "recipe", max_length: int | None = None) -> RunConfig:
    """Resolve a recipe, as :func:`load_recipe` and :func:`apply_overrides` give it (old names
    already read in their new places), against a shard manifest's languages and tokenizer (and
    ``max_length``, the longest training pair it holds, in subwords)."""
    check_sections(recipe, where)
    model_kw = dict(PRESETS[recipe.get("preset", DEFAULT_PRESET)])
    model_kw.update(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                    eos_id=tokenizer.eos_id, languages=list(languages), central_language=central)
    model_kw.update(recipe.get("model", {}))
    sections = {name: build_section(name, model_kw if name == "model" else recipe.get(name) or {})
                for name in SECTIONS}
    check_model_fits_shards(sections["model"], languages, central, tokenizer, where, max_length,
                            sections["data"].add_lang_tag)
    return RunConfig(preset=recipe.get("preset", DEFAULT_PRESET), **sections)


def check_model_fits_shards(model: ModelConfig, languages: list[str], central: str | None, tokenizer,
                            where: str, max_length: int | None = None, tagged: bool = True) -> None:
    """The model's vocabulary, special ids and languages are the shards' (the manifest owns them):
    a recipe that sets them otherwise would index past the embedding or the LSLs at the first step.
    Its position table holds the shards' longest input (``max_length`` subwords, with ``</s>`` and
    the tag when ``tagged``): a shorter one would fail at whichever step first draws a long pair."""
    longest = None if max_length is None else source_length(max_length, tagged)
    if longest is not None and model.max_positions < longest:
        extra = longest - max_length
        raise ValueError(f"{where}: model.max_positions {model.max_positions} is shorter than the shards' longest "
                         f"input ({max_length} subwords + {'tag and ' if tagged else ''}</s>: {longest} positions); build the shards with "
                         f"--max-length {model.max_positions - extra} or less, or set model.max_positions={longest}")
    if model.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"{where}: model.vocab_size {model.vocab_size} is smaller than the shards' vocabulary "
                         f"({tokenizer.vocab_size} subwords); leave it unset, it comes from the shards")
    ids = {"pad_id": tokenizer.pad_id, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id}
    wrong = [f"model.{k}={getattr(model, k)} (the shards' {v})" for k, v in ids.items() if getattr(model, k) != v]
    if list(model.languages) != list(languages) or model.central_language != central:
        wrong.append(f"model.languages={model.languages}, central {model.central_language} (the shards': "
                     f"{languages}, central {central})")
    if wrong:
        raise ValueError(f"{where}: {'; '.join(wrong)}; leave them unset, they come from the shards")


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per recipe setting that has a help text, one argument group a section, made by the
    package's one generator (:func:`cll_scale.core.cli.add_config_arguments`): ``--optim.lr``, or
    the short name a setting declares (``--max-steps``). Values are read as ``--set`` reads them,
    so a flag and ``--set`` meet the same checks. The default shown is what a recipe that leaves
    the setting out trains with: the field's, or for a size the preset's (:func:`preset_defaults`)."""
    for section, cls in section_classes().items():
        group = parser.add_argument_group(f"{section} settings" + (" (the preset sets the sizes)"
                                                                   if section == "model" else ""))
        add_config_arguments(group, cls, section=section, shown=preset_defaults() if section == "model" else None)
    add_old_recipe_flags(parser)


def preset_defaults() -> dict[str, str]:
    """The model settings a preset sets, as their help shows the default: the default preset's
    value, and which setting of the recipe decides it."""
    default = PRESETS[DEFAULT_PRESET]
    return {name: f"the preset's; {DEFAULT_PRESET}: {default_text(default.get(name, default_of(ModelConfig, name)))}"
            for name in sorted({k for values in PRESETS.values() for k in values})}


def add_old_recipe_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the settings :data:`~cll_scale.core.compat.MOVED` renamed or moved
    (``--data.max_tokens``, ``--train.data``, ``--train.lr``…), still read as the docs promise
    for old names, but hidden from ``--help``: their value goes to the new setting with a notice."""
    for old in MOVED:
        section, name = old.split(".")
        flags = dict.fromkeys([f"--{old}", f"--{section}.{name.replace('_', '-')}"])
        parser.add_argument(*flags, dest=old, default=None, help=argparse.SUPPRESS)


def recipe_flags(args: argparse.Namespace) -> list[str]:
    """The recipe settings given as flags, as ``--set`` overrides; an old flag
    (:func:`add_old_recipe_flags`) as its new setting, with a notice."""
    given = {dest: value for dest, value in vars(args).items()
             if "." in dest and dest.split(".")[0] in SECTIONS and value is not None}
    for old in [dest for dest in given if dest in MOVED]:
        new = MOVED[old]
        if new in given:
            raise ValueError(f"--{old} and --{new} are the same setting; keep --{new}")
        notice(f"--{old} is now --{new} (read as such; the old name will go)")
        given[new] = given.pop(old)
    return [f"{dest}={value}" for dest, value in given.items()]


def recipe_from_args(args: argparse.Namespace) -> dict:
    """cll-train's recipe: the ``--recipe`` file, then ``--preset`` and the setting flags, then
    ``--set`` (the last word wins)."""
    recipe = load_recipe(args.recipe) if args.recipe else {}
    if args.preset:
        recipe["preset"] = args.preset
    return apply_overrides(recipe, recipe_flags(args) + args.set)

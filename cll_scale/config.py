"""Typed configs: one owner per setting.

* :class:`ModelConfig` — the network (with size presets, :data:`PRESETS`);
* :class:`cll_scale.stream.StreamConfig` — what the data stream feeds;
* :class:`TrainConfig` — optimisation, budget, checkpoints and logging.

DeepSpeed's JSON files in ``ds_configs/`` hold engine settings only (ZeRO stage, precision,
offload, monitor); batch size, accumulation, clipping and learning rate come from here and are
filled in by :func:`cll_scale.engine.make_ds_config`.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

VARIANTS = ("baseline", "residual", "sd", "fcll", "custom")
RESIDUAL_SUBLAYERS = ("ffn", "self_attn")
INITS = ("torch", "xavier")
LSL_DROPOUTS = ("authors", "double")
# What a model config written before a setting existed meant by its absence: records, exports and
# resumed runs from before issue 34 were trained with this rule. (Their data configs lack
# `mixing`, which meant one direction a step; a resumed run's stream state says so itself.)
LEGACY_MODEL = {"lsl_dropout": "double"}


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer with optional CLL (paper Eq. 3) in the decoder."""

    vocab_size: int = 8000
    pad_id: int = 0
    bos_id: int = 2
    eos_id: int = 3
    d_model: int = 256
    n_heads: int = 4
    ffn_dim: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    max_positions: int = 1024
    pre_norm: bool = True
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    init: str = "torch"                     # Linear weights: torch's default, or "xavier" as fairseq
                                            # (the paper's code): Xavier-uniform, zero biases
    # --- CLL (paper §3, Eq. 3) -------------------------------------------------------------
    languages: list[str] = field(default_factory=list)   # index = tgt_lang id (manifest order)
    central_language: str | None = None                   # None: every language has an LSL
    variant: str = "fcll"
    cll_layers: list[int] | None = None     # decoder layers (0-based) with CLL; set by variant
    lsl_dim: int = 256                      # R, inner size of each language-specific layer
    cll_dropout: float = 0.2                # dropout on LSL output (paper App. A: 0.2-0.3)
    lsl_dropout: str = "authors"            # "authors": FFN gets `dropout`, LSL `cll_dropout`,
                                            # each once, then added; "double": the rule before
                                            # issue 34 (the sum dropped again: LSL dropped twice)
    t_init: float = 0.1                     # initial t_l
    # --- Residual removal (Liu et al. 2021) in the middle encoder layer ---------------------
    residual_sublayer: str | None = None    # "ffn" (paper's code) or "self_attn" (Liu et al.)
    residual_layer: int | None = None       # 0-based encoder layer; default encoder_layers // 2

    def __post_init__(self):
        for name in ("dropout", "attention_dropout", "activation_dropout", "cll_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:     # 1.0 divides by zero, above 1 flips the sign of activations
                raise ValueError(f"model.{name} must be in [0, 1), not {value}")
        for name in ("vocab_size", "d_model", "n_heads", "ffn_dim", "encoder_layers", "decoder_layers",
                     "max_positions", "lsl_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, not {getattr(self, name)}")
        if not math.isfinite(self.t_init):
            raise ValueError(f"model.t_init must be finite, not {self.t_init}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.lsl_dropout not in LSL_DROPOUTS:
            raise ValueError(f"model.lsl_dropout must be one of {LSL_DROPOUTS}, not {self.lsl_dropout!r}")
        if self.init not in INITS:
            raise ValueError(f"model.init must be one of {INITS}, not {self.init!r}")
        if self.residual_sublayer not in (None, *RESIDUAL_SUBLAYERS):
            raise ValueError(f"residual_sublayer must be one of {RESIDUAL_SUBLAYERS} or None")
        if self.central_language is not None and self.central_language not in self.languages:
            raise ValueError(f"central language {self.central_language!r} is not in {self.languages}")
        self.resolve_variant()

    def resolve_variant(self) -> None:
        """Baseline: no CLL. Residual: drop one residual of the middle encoder layer. SD:
        Residual + CLL in decoder layer N/2+1 (1-based). FCLL: CLL in every decoder layer."""
        mid_dec = self.decoder_layers // 2
        if self.variant == "baseline":
            self.cll_layers, self.residual_sublayer = [], None
        elif self.variant == "residual":
            self.cll_layers = []
            self.residual_sublayer = self.residual_sublayer or "ffn"
        elif self.variant == "sd":
            self.cll_layers = [mid_dec]
            self.residual_sublayer = self.residual_sublayer or "ffn"
        elif self.variant == "fcll":
            self.cll_layers = list(range(self.decoder_layers))
        elif self.cll_layers is None:
            raise ValueError("variant 'custom' needs cll_layers")
        bad = [i for i in self.cll_layers if not 0 <= i < self.decoder_layers]
        if bad:
            raise ValueError(f"cll_layers {bad} outside 0..{self.decoder_layers - 1}")
        self.cll_layers = sorted(set(self.cll_layers))
        if self.residual_sublayer and self.residual_layer is None:
            self.residual_layer = self.encoder_layers // 2
        if self.residual_layer is not None and not 0 <= self.residual_layer < self.encoder_layers:
            raise ValueError(f"residual_layer {self.residual_layer} outside the encoder")

    @property
    def lsl_languages(self) -> list[str]:
        """Languages that get an LSL: every one but the central language."""
        return [x for x in self.languages if x != self.central_language]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "ModelConfig":
        return cls(**{**LEGACY_MODEL, **d})


# Size presets (the rest of ModelConfig keeps its defaults). `small` is the CPU experiment size,
# `base` the paper's OPUS-100 model (App. A), `big` the usual Transformer-big. `paper` is the
# model of the authors' code for the triangle and Europarl runs (github zhiqu22/AdapNonCenter, a
# fairseq `transformer`): 5+5 post-norm layers, dropout 0.3, Xavier init, and LSLs hard-coded at
# 512 -> 1024 -> 512 with CLL dropout 0.3. Their dropout after `t_l ·` equals ours before it
# (dropout commutes with a scalar).
PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=32, n_heads=2, ffn_dim=64, encoder_layers=2, decoder_layers=2, lsl_dim=16,
                 max_positions=512),
    "small": dict(d_model=256, n_heads=4, ffn_dim=1024, encoder_layers=3, decoder_layers=3, lsl_dim=256),
    "base": dict(d_model=512, n_heads=8, ffn_dim=2048, encoder_layers=6, decoder_layers=6, lsl_dim=256),
    "paper": dict(d_model=512, n_heads=8, ffn_dim=2048, encoder_layers=5, decoder_layers=5, lsl_dim=1024,
                  dropout=0.3, cll_dropout=0.3, pre_norm=False, init="xavier"),
    "big": dict(d_model=1024, n_heads=16, ffn_dim=4096, encoder_layers=6, decoder_layers=6, lsl_dim=512,
                dropout=0.3),
}


@dataclass
class TrainConfig:
    """Optimisation (paper App. A defaults), budget, checkpoints, logging."""

    data: str = ""                       # shard directory (cll-shards build)
    run_dir: str = "runs/default"
    ds_config: str = "auto"              # a ds_configs/*.json; "auto": gpu_bf16 on CUDA, on a CPU cpu_bf16 where
                                         # bf16 runs faster than fp32 (avx512_bf16, AMX), else cpu_fp32 (precision.py)
    # optimisation
    lr: float = 7e-4
    warmup_steps: int = 4000
    schedule_offset: int = 0             # the schedule goes on as if this many steps were done
                                         # (new-language extension continues pre-training's decay)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    grad_accum: int = 1                  # microbatches (token-budget batches) per step and rank
    compile: str = ""                    # "": eager; else a torch.compile backend ("inductor"),
                                         # applied per block (CLLTransformer.compile_blocks) and to
                                         # the loss, with dynamic shapes (no compile per batch shape)
    # starting point (fine-tuning: back-translation, new-language extension)
    init_from: str = ""                  # an export/: architecture and weights; fresh optimizer
    freeze: list[str] = field(default_factory=list)   # parameter-name globs kept fixed
    new_data: bool = False               # --resume on other shards: the stream starts afresh
    # budget: whichever comes first
    max_steps: int = 0                   # 0: no step limit
    max_epochs: float = 0.0              # 0: no limit; epochs of the current train.data
    max_minutes: float = 0.0             # 0: no time limit
    # validation, checkpoints, logging
    valid_every: int = 500
    valid_max_batches: int = 0           # 0: whole validation split
    valid_max_sentences: int = 0         # 0: every sentence; N: the first N sentences (dev-set lines)
                                         # of each validation direction, split over the ranks
                                         # (OPUS-100: 200 of the 2,000 in each of 188 directions)
    valid_decode_sentences: int = 0      # >0: also greedy-translate this many validation sentences
                                         # per direction and log BLEU and the off-target rate
    best_metric: str = "valid_nll"       # export-best/ follows this supervised validation metric:
                                         # valid_nll (lower is better), valid_bleu (needs
                                         # valid_decode_sentences), or "" for no selection
    ckpt_every: int = 1000
    keep_last: int = 3
    log_every: int = 50                  # also how often the host reads the device's metrics
    max_skips_in_a_row: int = 50         # skipped steps (non-finite, out of memory) that end the run
    seed: int = 1
    export: bool = True

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"train.lr must be a positive number, not {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"train.betas must be two numbers in [0, 1), not {list(self.betas)}")
        if not self.eps > 0 or self.weight_decay < 0 or self.clip_norm < 0 or self.warmup_steps < 0:
            raise ValueError("train.eps must be > 0, and weight_decay, clip_norm, warmup_steps >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing must be in [0, 1), not {self.label_smoothing}")
        if self.valid_max_batches < 0 or self.valid_max_sentences < 0:
            raise ValueError("train.valid_max_batches and train.valid_max_sentences must be >= 0 (0: all)")
        if self.grad_accum < 1:
            raise ValueError("grad_accum must be >= 1")
        if min(self.max_steps, self.max_minutes, self.max_epochs) < 0:
            raise ValueError("max_steps, max_epochs and max_minutes must be >= 0")
        self.best_metric = self.best_metric or ""      # `--set train.best_metric=` reads as None
        if self.best_metric not in ("", "valid_nll", "valid_bleu"):
            raise ValueError(f"best_metric must be valid_nll, valid_bleu or empty, not {self.best_metric!r}")
        if self.seed < 0:
            raise ValueError(f"train.seed must be >= 0, not {self.seed}")
        if self.keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        if min(self.log_every, self.valid_every, self.ckpt_every, self.max_skips_in_a_row) < 1:
            raise ValueError("log_every, valid_every, ckpt_every and max_skips_in_a_row must be >= 1")


    def budget_spent(self, step: int, epoch: float, elapsed_s: float) -> bool:
        """Whichever of max_steps, max_epochs and max_minutes comes first (0: no limit)."""
        return bool((self.max_steps and step >= self.max_steps)
                    or (self.max_epochs and epoch >= self.max_epochs)
                    or (self.max_minutes and elapsed_s >= self.max_minutes * 60))


def load_recipe(path: str | Path) -> dict:
    """A recipe: ``{"preset": ..., "model": {...}, "data": {...}, "train": {...}}`` in YAML or JSON.
    A file that does not parse, or whose sections are not mappings, is an error naming the file
    and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                         "save the recipe as UTF-8") from None
    if str(path).endswith((".yaml", ".yml")):
        import yaml
        try:
            recipe = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ValueError(f"{path}:{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    else:
        try:
            recipe = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {err.lineno}, column {err.colno}: not valid JSON ({err.msg})") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{path}: a recipe is a mapping with sections preset, model, data, train; "
                         f"this file holds a {type(recipe).__name__}")
    unknown = set(recipe) - {"preset", "model", "data", "train"}
    if unknown:
        raise ValueError(f"{path}: unknown recipe sections {sorted(unknown)} "
                         f"(expected preset, model, data, train)")
    check_sections(recipe, str(path))
    return recipe


def check_sections(recipe: dict, where: str) -> None:
    """Each section a mapping, the preset a known name."""
    for section in ("model", "data", "train"):
        if section in recipe and not isinstance(recipe[section], dict):
            raise ValueError(f"{where}: section {section!r} must be a mapping of settings "
                             f"(key: value lines), not {recipe[section]!r}")
    preset = recipe.get("preset", "small")
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"{where}: unknown preset {preset!r}; presets: {', '.join(PRESETS)}")


def apply_overrides(recipe: dict, overrides: list[str]) -> dict:
    """``section.key=value`` (or ``preset=NAME``) overrides, values parsed as YAML."""
    import yaml
    for item in overrides:
        key, eq, value = item.partition("=")
        if key == "preset" and eq:
            if value not in PRESETS:
                raise ValueError(f"unknown preset {value!r}; presets: {', '.join(PRESETS)}")
            recipe["preset"] = value
            continue
        section, dot, name = key.partition(".")
        if not eq or not dot or section not in ("model", "data", "train"):
            raise ValueError(f"override {item!r}: expected section.key=value, section in model/data/train")
        recipe.setdefault(section, {})[name] = yaml.safe_load(value)
    return recipe


SECTIONS = {"ModelConfig": "model", "StreamConfig": "data", "TrainConfig": "train"}


def _numeric_kind(f: dataclasses.Field) -> type | None:
    """``bool``, ``int`` or ``float`` for a field annotated so (``int | None`` too), else None."""
    names = {part.strip() for part in str(f.type).split("|")} - {"None"}
    return {"bool": bool, "int": int, "float": float}.get(names.pop()) if len(names) == 1 else None


def coerce_number(name: str, value, kind: type):
    """The config boundary of every numeric setting: a count is a whole number, a float is finite
    (NaN would pass every ``<``/``>`` check and reach config.json as invalid JSON), a switch is a
    boolean. YAML reads ``7e-4`` as a string and ``1e3`` as a float, so both convert here."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, not {value!r}")
        return value
    try:
        number = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None:
        raise ValueError(f"{name}: {value!r} is not a{'n integer' if kind is int else ' number'}")
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    if kind is int:
        if number != int(number):
            raise ValueError(f"{name} must be a whole number, not {value!r}")
        return int(value) if isinstance(value, int) else int(number)
    return number


def _coerce(cls, kw: dict) -> dict:
    """Recipe values checked against their field: known names, numbers as :func:`coerce_number` says."""
    out = dict(kw)
    names = [f.name for f in dataclasses.fields(cls)]
    section = SECTIONS.get(cls.__name__, cls.__name__)
    for key in out:
        if key not in names:
            import difflib
            near = difflib.get_close_matches(str(key), names, n=1)
            raise ValueError(f"unknown setting {section}.{key}" + (f"; did you mean {section}.{near[0]}?" if near
                             else f"; {section} settings are {', '.join(names)}"))
    for f in dataclasses.fields(cls):
        kind = _numeric_kind(f)
        if f.name in out and kind is not None and out[f.name] is not None:
            out[f.name] = coerce_number(f"{section}.{f.name}", out[f.name], kind)
    return out


def build_configs(recipe: dict, languages: list[str], central: str | None, tokenizer) -> tuple:
    """Resolve a recipe against a shard manifest into (ModelConfig, StreamConfig, TrainConfig)."""
    from cll_scale.stream import StreamConfig
    check_sections(recipe, "recipe")
    model_kw = dict(PRESETS[recipe.get("preset", "small")])
    model_kw.update(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id,
                    eos_id=tokenizer.eos_id, languages=list(languages), central_language=central)
    model_kw.update(recipe.get("model", {}))
    try:
        return (ModelConfig(**_coerce(ModelConfig, model_kw)),
                StreamConfig(**_coerce(StreamConfig, recipe.get("data", {}))),
                TrainConfig(**_coerce(TrainConfig, recipe.get("train", {}))))
    except TypeError as err:
        raise ValueError(f"recipe: {err}") from None

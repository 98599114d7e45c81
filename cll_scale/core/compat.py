"""The old names of settings, which every layer reads: recipes, flags, a run's config.json,
cll-repro's records and overrides. Each shim is marked with the version that may drop it ("kept"
where committed results still need it).

A shim for one file format lives beside that format's owner, with its own mark: the manifest's
(:mod:`cll_scale.data.manifest`), a stream position's (:mod:`cll_scale.data.stream`), the model's
state-dict layout (:mod:`cll_scale.model.model`), export.json (:mod:`cll_scale.model.export`), the
evaluation report (:mod:`cll_scale.evaluation.report`), checkpoints
(:mod:`cll_scale.training.rundir`, :mod:`cll_scale.training.checkpointer`) and the fine-tuning
commands' settings.json (:mod:`cll_scale.loops.finetune`).
"""
from __future__ import annotations

import sys

# Kept (the committed records and reports of docs/results were trained before it). The training
# rules whose default changed (issue 34), and what a config written before they existed meant by
# their absence: records, exports and resumed runs from before were trained with one direction a
# step and the LSL dropped twice. (A resumed run's stream state names its mixing
# itself; cll-repro keeps one rule per study, records.check_one_rule.)
LEGACY = {"model": {"lsl_dropout": "double"}, "data": {"mixing": "direction"}}
LEGACY_MODEL = LEGACY["model"]
RULES = tuple(f"{section}.{key}" for section, legacy in LEGACY.items() for key in legacy)


# May go in v0.2.0. Settings that lived in ``train`` before the sections (issue 36), read with a
# one-line notice; config.json files of runs trained before are read the same way.
MOVED_TO_SECTIONS = {
    **{f"train.{k}": f"optim.{k}" for k in ("lr", "warmup_steps", "schedule_offset", "betas", "eps", "weight_decay",
                                            "clip_norm")},
    "train.ckpt_every": "checkpoint.every", "train.keep_last": "checkpoint.keep_last",
    "train.export": "checkpoint.export", "train.valid_every": "valid.every",
    "train.valid_max_batches": "valid.max_batches", "train.valid_max_sentences": "valid.max_sentences",
    "train.valid_decode_sentences": "valid.decode_sentences", "train.best_metric": "valid.best_metric",
    "train.log_every": "log.every"}

# May go in v0.3.0. Names that changed with issue 53: three settings were all called max_tokens
# (the stream's microbatch budget is now data.batch_tokens, the shards' length filter max_length,
# the decoder's batch beam_tokens), and the run's shard directory shared the word "data" with the
# stream's section (it is train.shards; the flag stays --data). Old flags are kept as aliases.
RENAMED = {"data.max_tokens": "data.batch_tokens", "train.data": "train.shards"}
MOVED = {**MOVED_TO_SECTIONS, **RENAMED}
OLD_FLAGS = {"--batch-tokens": ("--max-tokens",), "--max-length": ("--max-tokens",),
             "--beam-tokens": ("--max-tokens",)}




def upgrade_override(item: str) -> str:
    """A ``--set section.key=value`` under today's name of its setting: what two overrides are
    compared as (a record made with ``data.max_tokens=1024`` asked ``data.batch_tokens=1024``)."""
    key, eq, value = item.partition("=")
    return f"{MOVED[key]}{eq}{value}" if key in MOVED else item


def as_first_named(recipe: dict) -> dict:
    """A recipe (as :func:`upgrade` reads it) under the names of :data:`RENAMED` before the
    change: what cll-repro hashes to recognise a record, so that records kept from before the
    rename still match their recipe."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in recipe.items()}
    for old, new in RENAMED.items():
        (old_section, old_key), (section, key) = old.split("."), new.split(".")
        if key in (out.get(section) or {}):
            out.setdefault(old_section, {})[old_key] = out[section].pop(key)
    return out


def upgrade(recipe: dict, where: str = "") -> dict:
    """``recipe`` with every :data:`MOVED` setting in its section. ``where`` names a recipe the
    user wrote: then one line says what moved (once per process; records and old config.json
    files are read silently). A setting given both ways in one recipe is an error."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in recipe.items()}
    moved = []
    for old, new in MOVED.items():
        section, key = old.split(".")
        if key not in (out.get(section) or {}):
            continue
        new_section, new_key = new.split(".")
        if new_key in (out.get(new_section) or {}):
            raise ValueError(f"{where or 'recipe'}: {old} and {new} are the same setting; keep {new}")
        out.setdefault(new_section, {})[new_key] = out[section].pop(key)
        moved.append(f"{old} -> {new}")
    if moved and where:
        notice(f"{where}: settings renamed or moved to their own sections, read as such (the old names "
               f"will go): {', '.join(moved)}")
    return out


_NOTICES: set[str] = set()


def notice(message: str) -> None:
    if message not in _NOTICES:
        _NOTICES.add(message)
        print(f"[cll-scale] {message}", file=sys.stderr)

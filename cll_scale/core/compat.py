"""Every shim for what earlier versions wrote, in one place, each with the version that may drop it.

Recipes, configs (a run's config.json, an export's), checkpoints and exports written by v0.1.0 before
a change are read through these functions; nothing else in the package knows an old name.
"""
from __future__ import annotations

import sys

# The training rules whose default changed (issue 34), and what a config written before they
# existed meant by their absence: records, exports and resumed runs from before were trained with
# one direction a step and the LSL dropped twice. (A resumed run's stream state names its mixing
# itself; cll-repro keeps one rule per study, records.check_one_rule.)
LEGACY = {"model": {"lsl_dropout": "double"}, "data": {"mixing": "direction"}}
LEGACY_MODEL = LEGACY["model"]
RULES = tuple(f"{section}.{key}" for section, legacy in LEGACY.items() for key in legacy)


# Settings that lived in ``train`` before the sections (issue 36): still read, with a one-line
# notice, until the next release. config.json files of runs trained before are read the same way.
MOVED = {**{f"train.{k}": f"optim.{k}" for k in ("lr", "warmup_steps", "schedule_offset", "betas", "eps",
                                                  "weight_decay", "clip_norm")},
         "train.ckpt_every": "checkpoint.every", "train.keep_last": "checkpoint.keep_last",
         "train.export": "checkpoint.export", "train.valid_every": "valid.every",
         "train.valid_max_batches": "valid.max_batches", "train.valid_max_sentences": "valid.max_sentences",
         "train.valid_decode_sentences": "valid.decode_sentences", "train.best_metric": "valid.best_metric",
         "train.log_every": "log.every"}


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
        notice(f"{where}: settings moved to their own sections, read as such (the old names go in the next "
                f"release): {', '.join(moved)}")
    return out


_NOTICES: set[str] = set()


def notice(message: str) -> None:
    if message not in _NOTICES:
        _NOTICES.add(message)
        print(f"[cll-scale] {message}", file=sys.stderr)


def upgrade_client_state(client: dict) -> dict:
    """A checkpoint's client state in today's layout: one entry per registered state. Checkpoints
    written before the states were registered kept the train state's fields at the top level,
    and ``streams``/``rng`` lists beside them."""
    if "train" in client:
        return client
    train = {k: client[k] for k in ("step", "elapsed", "tokens_seen") if k in client}
    data = {"data": client["data"]} if "data" in client else {}      # the oldest kept none: any data matched
    streams = [{**data, "stream": s} for s in client["streams"]]
    return {"train": train, "stream": streams, "rng": client["rng"]}


# Evaluation entries (cll-eval's results.json, cll-repro's cached evaluations) written before the
# skipped directions, the language identifiers, the timing and the central language were recorded
# (22 entries of docs/results' oldest reports), read with what they were: nothing skipped,
# langdetect alone. Kept while committed reports hold such entries.
ENTRY_DEFAULTS = {"skipped": {}, "lid": ["langdetect"], "timing": {}, "central_language": None}


def upgrade_entry(entry: dict) -> dict:
    """An evaluation entry with every key today's reader expects."""
    return {**ENTRY_DEFAULTS, **entry} if ENTRY_DEFAULTS.keys() - entry.keys() else entry

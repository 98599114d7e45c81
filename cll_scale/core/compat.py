"""Every shim for what earlier versions wrote, in one place, each marked with the version that may
drop it ("kept" where committed results still need it).

Recipes and flags, configs (a run's config.json), manifests, checkpoints, exports, evaluation
reports and the fine-tuning commands' settings written before a change are read through here;
nothing else in the package knows an old name.
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
MANIFEST_RENAMED = {"max_tokens": "max_length"}            # shard manifests of schema version 1
FINE_TUNING_RENAMED = {"max_tokens": "batch_tokens"}       # cll-bt's and cll-extend's settings.json


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


def _renamed(d: dict, names: dict[str, str]) -> dict:
    return {names.get(k, k): v for k, v in d.items()}


def upgrade_manifest(d: dict) -> dict:
    """A shard manifest in schema version 2 (version 1 called max_length max_tokens)."""
    if d.get("schema_version") != 1:
        return dict(d)
    return {**_renamed(d, MANIFEST_RENAMED), "schema_version": 2}


def upgrade_fine_tuning_settings(settings: dict) -> dict:
    """The settings a cll-bt / cll-extend run recorded, under today's names."""
    return _renamed(settings, FINE_TUNING_RENAMED)


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


# May go in v0.2.0: checkpoints of before the registered states (issue 41).
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


# Kept. Evaluation reports and entries (cll-eval's results.json, cll-repro's cached evaluations)
# written before the skipped directions, the language identifiers, the timing and the central
# language were recorded (docs/results' oldest: 6 reports, 22 entries), read with what they were:
# nothing skipped, langdetect alone. Kept while committed reports hold them.
def upgrade_report(report: dict) -> dict:
    """An evaluation report with the language identifiers it was scored with (the oldest name none)."""
    return {"lid": ["langdetect"], **report}


def upgrade_entry(entry: dict) -> dict:
    """An evaluation entry with every key today's reader expects (fresh defaults each time: an
    entry's lists and dicts are its own)."""
    return {"skipped": {}, "lid": ["langdetect"], "timing": {}, "central_language": None,
            **upgrade_entry_version(entry)}


# Kept. Entries of format version 1 (no ``format_version``: every one written before the zero-shot
# destinations were measured) have no destinations, on-target scores or per-sentence languages:
# their directions read them as None ("not measured"), and a report shows "–" until
# scripts/fill_destinations.py identifies the languages of the stored hypotheses.
ENTRY_FORMAT = 2


def upgrade_entry_version(entry: dict) -> dict:
    """An entry with its format version (1 when it names none)."""
    return {"format_version": 1, **entry}


# May go in v0.2.0: exports written before the LSLs moved into one Parameter per language (issue 38).
def pack_per_layer_lsl(state_dict: dict, prefix: str = "") -> None:
    """Pack the per-layer LSL tensors of such an export (``decoder.{i}.ffn.{w1,b1,w2,b2,t}.{slot}``)
    into ``lsl.{slot}``, in place, so that it still loads (a ``load_state_dict`` pre-hook)."""
    import torch
    old = sorted({k for k in state_dict if k.startswith(prefix + "decoder.")
                  and k.rsplit(".", 2)[-2] in ("w1", "b1", "w2", "b2", "t") and ".ffn." in k})
    if not old:
        return
    slots = sorted({int(k.rsplit(".", 1)[1]) for k in old})
    layers = sorted({int(k[len(prefix) + len("decoder."):].split(".")[0]) for k in old})
    for slot in slots:
        parts = [state_dict.pop(f"{prefix}decoder.{i}.ffn.{name}.{slot}").reshape(-1)
                 for i in layers for name in ("w1", "b1", "w2", "b2", "t")]
        state_dict[f"{prefix}lsl.{slot}"] = torch.cat(parts)


# Kept: exports of before ``lang_tag`` was recorded in export.json were all trained with tags (the
# setting had no other value in any recipe then); committed exports' infos may lack it.
EXPORT_DEFAULTS = {"lang_tag": True}


def upgrade_export_info(info: dict) -> dict:
    """An export.json as today's reader expects it."""
    return {**EXPORT_DEFAULTS, **info}


# May go in v0.2.0: checkpoints committed before cll_meta.json listed their files and sizes.
def unlisted_checkpoint_problem(directory, world_size: int | None) -> str | None:
    """Such a checkpoint is complete when it has DeepSpeed's model states and one optimizer file a rank."""
    optim = len(list(directory.glob("*optim_states.pt")))
    model = any(directory.glob("*model_states.pt"))
    return None if model and optim == world_size else "model or optimizer states missing"


# May go in v0.2.0: stream positions saved before ``pool_blocks`` was recorded (every pool held
# ``pool_blocks`` blocks then, whatever the row budget).
def upgrade_stream_state(state: dict, pool_blocks: int) -> dict:
    return {"pool_blocks": pool_blocks, **state}

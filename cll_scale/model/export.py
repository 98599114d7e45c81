"""``export/``: what inference loads — no DeepSpeed, no GPU, nothing pickled.

    model.safetensors    consolidated fp32 weights
    model_config.json    ModelConfig
    spm.model            the SentencePiece model
    manifest.json        the shard manifest (languages, supervised / zero-shot directions, ids)
    export.json          provenance (step, run), whether inputs carry the language tag
                         (``lang_tag``), the software and machine that wrote it (``versions``:
                         :func:`cll_scale.core.versions.versions`), and the sha256 of every file above
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from cll_scale.core.jsonfiles import read_json_object
from cll_scale.core.outputs import atomic_dir, json_text
from cll_scale.core.versions import versions
from cll_scale.data.manifest import Manifest, sha256_file
from cll_scale.model.config import ModelConfig
from cll_scale.model.model import CLLTransformer

FILES = ("model.safetensors", "model_config.json", "spm.model", "manifest.json")
INFO = "export.json"


# Kept: exports of before ``lang_tag`` was recorded in export.json were all trained with tags (the
# setting had no other value in any recipe then); committed exports' infos may lack it.
EXPORT_DEFAULTS = {"lang_tag": True}


def upgrade_export_info(info: dict) -> dict:
    """An export.json as today's reader expects it."""
    return {**EXPORT_DEFAULTS, **info}


class ExportError(ValueError):
    """An export directory is missing, incomplete or has been tampered with."""


def write_export(out_dir: str | os.PathLike, state_dict: dict[str, torch.Tensor], model_cfg: ModelConfig,
                 shard_dir: str | os.PathLike, info: dict | None = None, manifest: Manifest | None = None) -> Path:
    """Write atomically: built in a temporary directory, then exchanged with the old export in
    one step, so that a crash at any moment leaves a loadable export (the old or the new).
    ``manifest``: the shards' (a training run hands its own; read from ``shard_dir`` without)."""
    out = Path(out_dir)
    with atomic_dir(out, replace=True) as tmp:
        tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state_dict.items()}
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "model_config.json").write_text(json_text(model_cfg.to_json(), indent=1))
        manifest = manifest or Manifest.load(shard_dir)
        shutil.copyfile(Path(shard_dir) / manifest.tokenizer.file, tmp / "spm.model")
        replace(manifest, tokenizer=replace(manifest.tokenizer, file="spm.model")).save(tmp)
        sums = {f: sha256_file(tmp / f) for f in FILES}
        info = {**(info or {}), "versions": versions()}      # the software and machine that wrote it
        (tmp / INFO).write_text(json_text({**info, "sha256": sums}, indent=1))
    return out


@dataclass(frozen=True)
class ExportInfo:
    """export.json, typed: the one reader of it. ``fields`` keeps the whole file (the run's git
    commit, its checkpoint tag, an extension's origin...) for the readers of a key of their own."""
    sha256: dict[str, str]
    lang_tag: bool                       # inputs carry the target-language tag
    step: int | None = None              # the training step exported (None: not written by cll-train)
    run_dir: str = ""                    # the run directory as it was typed when training
    best: dict = field(default_factory=dict)      # export-best/: metric, step and value it was chosen on
    pretrain: dict | None = None         # an extension's init export: the pre-training schedule it continues
    fields: dict = field(default_factory=dict)

    @classmethod
    def load(cls, export_dir: str | os.PathLike) -> "ExportInfo":
        path = Path(export_dir) / INFO
        if not path.is_file():
            raise ExportError(f"{export_dir}: not a cll-scale export (no {INFO})")
        d = upgrade_export_info(read_json_object(path))
        if not isinstance(d["lang_tag"], bool):
            raise ExportError(f"{path}: lang_tag must be true or false, not {d['lang_tag']!r}")
        return cls(sha256=d.get("sha256", {}), lang_tag=d["lang_tag"], step=d.get("step"),
                   run_dir=d.get("run_dir", ""), best=d.get("best", {}), pretrain=d.get("pretrain"), fields=d)

    @staticmethod
    def exists(export_dir: str | os.PathLike) -> bool:
        return (Path(export_dir) / INFO).is_file()


def export_model_config(export_dir: str | os.PathLike) -> dict:
    path = Path(export_dir) / "model_config.json"
    if not path.is_file():
        raise ExportError(f"{export_dir}: not a cll-scale export (no model_config.json)")
    return read_json_object(path)


def export_lang_tag(export_dir: str | os.PathLike) -> bool:
    """Whether the exported model was trained with target-language tags (``lang_tag`` in
    export.json, from ``data.add_lang_tag``; exports of before it read as :func:`upgrade_export_info` says)."""
    return ExportInfo.load(export_dir).lang_tag


def load_export(export_dir: str | os.PathLike, device: str | torch.device = "cpu", check: bool = True
                ) -> tuple[CLLTransformer, Manifest]:
    """Rebuild the model from an export; with ``check`` every file's sha256 must match."""
    d = Path(export_dir)
    missing = [f for f in (*FILES, INFO) if not (d / f).is_file()]
    if missing:
        raise ExportError(f"{d}: not a cll-scale export (missing {', '.join(missing)})")
    if check:
        sums = ExportInfo.load(d).sha256
        bad = [f for f in FILES if sums.get(f) != sha256_file(d / f)]
        if bad:
            raise ExportError(f"{d}: {', '.join(bad)} differ from the checksums in export.json "
                              f"(modified or damaged); refusing to load")
    cfg = ModelConfig.from_json(read_json_object(d / "model_config.json"))
    model = CLLTransformer(cfg)
    try:
        state = load_file(str(d / "model.safetensors"), device="cpu")
    except Exception as err:  # safetensors raises its own error types on malformed files
        raise ExportError(f"{d / 'model.safetensors'}: cannot be read ({err})") from None
    model.load_state_dict(state, strict=True)
    manifest = Manifest.load(d)
    return model.to(device).eval(), manifest

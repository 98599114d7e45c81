"""What a run directory holds, read without an engine: its settings (``config.json``), its metrics
(``metrics.jsonl``), which export its evaluation uses (:class:`RunDir`), and its checkpoints (which tag
``latest`` names, whether one is complete, which to resume from, at which world size it was written).
:func:`cll_scale.run.build.build_run`, the metrics logger and the Checkpointer write them;
cll-train's resume, cll-repro, the loops and the scripts read them through here, so none of them
loads the engine or knows the files' layout.

``checkpoints/step<N>/`` is committed when rank 0 has listed its files with their sizes in
``cll_meta.json`` and rewritten ``latest``; ``export/`` and ``export-best/`` are what inference loads.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cll_scale.core.compat import upgrade
from cll_scale.core.jsonfiles import read_json_object
from cll_scale.training.configs import CheckpointConfig  # noqa: F401  (the section this module uses)
from cll_scale.training.metrics import read_rows


BEST_EXPORT = "export-best"     # the checkpoint chosen on validation (ValidConfig.best_metric)
CONFIG = "config.json"          # the run's resolved settings, every section (RunConfig.to_json)
METRICS = "metrics.jsonl"       # one line per log step or validation (cll_scale.training.metrics)


def chosen_export(run_dir: str | os.PathLike) -> Path:
    """The export a run's evaluation uses: the checkpoint chosen on supervised validation when the
    run made one (``export-best/``), else its last one (``export/``)."""
    best = Path(run_dir) / BEST_EXPORT
    return best if (best / "export.json").exists() else Path(run_dir) / "export"


@dataclass(frozen=True)
class RunDir:
    """A run directory (or cll-repro's record of one), read: the one reader of its config.json."""
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    def has_config(self) -> bool:
        return (self.path / CONFIG).is_file()

    def config(self) -> dict:
        """The settings the run trained with, every one under today's name (a run of before the
        sections or the renames reads the same, :func:`cll_scale.core.compat.upgrade`); ``{}``
        without a config.json."""
        return upgrade(read_json_object(self.path / CONFIG)) if self.has_config() else {}

    def metrics(self, warn: bool = True) -> list[dict]:
        """Every metrics.jsonl line (:func:`cll_scale.training.metrics.read_rows`)."""
        return read_rows(self.path / METRICS, warn)

    def has_metrics(self) -> bool:
        return (self.path / METRICS).exists()

    def export(self) -> Path:
        """The export its evaluation uses (:func:`chosen_export`)."""
        return chosen_export(self.path)


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[2]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
        return head + (" (uncommitted changes)" if dirty.strip() else "") if head else "unknown"
    except OSError:
        return "unknown"


def tag_for(step: int) -> str:
    return f"step{step:08d}"


META = "cll_meta.json"


# May go in v0.2.0: checkpoints committed before cll_meta.json listed their files and sizes.
def unlisted_checkpoint_problem(directory: Path, world_size: int | None) -> str | None:
    """Such a checkpoint is complete when it has DeepSpeed's model states and one optimizer file a rank."""
    optim = len(list(directory.glob("*optim_states.pt")))
    model = any(directory.glob("*model_states.pt"))
    return None if model and optim == world_size else "model or optimizer states missing"


def latest_tag(ckpt_dir: Path) -> str | None:
    """The tag ``latest`` names (it may be missing or damaged: see :func:`resumable_tag`)."""
    latest = ckpt_dir / "latest"
    return latest.read_text().strip() if latest.is_file() else None


def has_checkpoints(ckpt_dir: Path) -> bool:
    return (ckpt_dir / "latest").is_file() or any(p.is_dir() for p in ckpt_dir.glob("step*"))


def checkpoint_problem(ckpt_dir: Path, tag: str) -> str | None:
    """None if ``tag`` is complete: its files are all there at the sizes recorded when it was
    committed. Otherwise what is wrong."""
    d = ckpt_dir / tag
    if not d.is_dir():
        return "missing"
    try:
        meta = json.loads((d / META).read_text())
    except (OSError, ValueError):
        return f"no readable {META} (never committed)"
    files = meta.get("files")
    if files is None:       # committed before sizes were recorded
        return unlisted_checkpoint_problem(d, meta.get("world_size"))
    for name, size in files.items():
        f = d / name
        if not f.is_file():
            return f"{name} missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, {size} when it was written"
    return None


def resumable_tag(ckpt_dir: Path) -> tuple[str | None, str]:
    """The checkpoint to resume from: the one ``latest`` names if it is complete, else the newest
    complete one, with a warning naming both. No complete checkpoint at all is an error."""
    named = latest_tag(ckpt_dir)
    problem = checkpoint_problem(ckpt_dir, named) if named else "no latest file"
    if named and problem is None:
        return named, ""
    tags = sorted((p.name for p in ckpt_dir.glob("step*") if p.is_dir() and not p.name.endswith("_universal")),
                  reverse=True)
    problems = {t: problem if t == named else checkpoint_problem(ckpt_dir, t) for t in tags}
    good = [t for t in tags if problems[t] is None]
    if good:
        return good[0], (f"{ckpt_dir / 'latest'} names {named} ({problem}); resuming from {good[0]}, "
                         f"the newest complete checkpoint" if named else
                         f"{ckpt_dir} has no latest file; resuming from {good[0]}, the newest complete checkpoint")
    if not tags and not named:
        return None, ""
    listing = "; ".join(f"{t}: {why}" for t, why in problems.items()) or "no step directory"
    raise ValueError(f"{ckpt_dir}: no complete checkpoint to resume from (latest names {named or 'nothing'}"
                     f"{f', {problem}' if named else ''}; {listing})")


def checkpoint_world_size(ckpt_dir: Path, tag: str) -> int:
    meta = ckpt_dir / tag / META
    if meta.is_file():
        return read_json_object(meta)["world_size"]
    return len(list((ckpt_dir / tag).glob("*optim_states.pt")))



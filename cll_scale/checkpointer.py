"""A run's checkpoints and exports: save, restore, export, and the model chosen on validation.

``checkpoints/`` holds DeepSpeed checkpoints (every rank writes its ZeRO shard; ``latest`` is
the commit point), ``export/`` and ``export-best/`` what inference loads. DeepSpeed is reached
only through :mod:`cll_scale.engine`.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import torch

from cll_scale import engine as ds
from cll_scale.export import write_export
from cll_scale.outputs import write_atomic

BEST_EXPORT = "export-best"     # the checkpoint chosen on validation (TrainConfig.best_metric)


def chosen_export(run_dir: str | os.PathLike) -> Path:
    """The export a run's evaluation uses: the checkpoint chosen on supervised validation when the
    run made one (``export-best/``), else its last one (``export/``)."""
    best = Path(run_dir) / BEST_EXPORT
    return best if (best / "export.json").exists() else Path(run_dir) / "export"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous one is untouched."""


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
        return head + (" (uncommitted changes)" if dirty.strip() else "") if head else "unknown"
    except OSError:
        return "unknown"


class Checkpointer:
    def __init__(self, run_dir: Path, every: int, keep_last: int, rank: int):
        self.run_dir, self.every, self.keep_last, self.rank = run_dir, every, keep_last, rank
        self.dir = run_dir / "checkpoints"
        self._saved: tuple[int | None, str | None] = (None, None)   # newest (step, tag) of this process

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def latest(self) -> str | None:
        return ds.latest_tag(self.dir)

    def exists(self) -> bool:
        return ds.has_checkpoints(self.dir)

    def resumable_tag(self, world: int, log) -> tuple[str | None, bool]:
        """The newest complete checkpoint (``latest`` unless it is missing or damaged, which is
        logged), converted to a universal checkpoint when the world size changed; returns
        (tag, universal)."""
        tag, warning = ds.resumable_tag(self.dir)
        if warning:
            log(f"warning: {warning}")
            self._set_aside_newer_than(tag, log)
        universal = bool(tag) and ds.checkpoint_world_size(self.dir, tag) != world
        if universal:
            tag = ds.convert_to_universal(self.dir, tag)
        return tag, universal

    def _set_aside_newer_than(self, tag: str, log) -> None:
        """A checkpoint found damaged is never used again: the tags newer than the one resumed
        from move to ``damaged-<tag>`` (kept for inspection, out of every glob of ``step*``) and
        ``latest`` names the one resumed from. Otherwise the run would reach the damaged step,
        find ``latest`` already naming it, skip the save and export from the damaged files."""
        if self.rank == 0:
            for path in sorted(self.dir.glob("step*")):
                name = path.name.removesuffix("_universal")
                if path.is_dir() and name > tag:
                    aside = self.dir / f"damaged-{path.name}"
                    shutil.rmtree(aside, ignore_errors=True)
                    path.rename(aside)
                    log(f"moved the damaged {path.name} aside to {aside.name}")
            write_atomic(self.dir / "latest", tag)
        ds.barrier()

    def save(self, engine, step: int, client_state, fault: str = "") -> str:
        """Save ``step`` on every rank (``client_state()`` is called only when a save happens)."""
        if self._saved[0] == step:            # validation already saved this step
            return self._saved[1]
        if self.latest() == ds.tag_for(step):  # resumed with the budget spent: never rewrite the latest
            return ds.tag_for(step)
        state = client_state()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tag = ds.save_checkpoint(engine, self.dir, step, state, self.keep_last, fault)
        except (OSError, RuntimeError) as err:   # disk full, quota, unwritable directory (torch.save
            # reports a failed write as a RuntimeError from its zip writer)
            previous = self.latest()
            raise CheckpointError(f"saving the step {step} checkpoint in {self.dir} failed ({err}); "
                                  + (f"the previous checkpoint {previous} is intact and --resume continues "
                                     f"from it" if previous else "no earlier checkpoint exists")) from None
        self._saved = (step, tag)
        return tag

    def restore(self, engine, tag: str) -> dict:
        return ds.load_checkpoint(engine, self.dir, tag)

    def export(self, tag: str, frozen: dict[str, torch.Tensor], model_cfg, data: str, info: dict,
               name: str = "export") -> Path | None:
        """Consolidate the ZeRO checkpoint ``tag`` into ``run_dir/name`` (rank 0). ``frozen`` holds
        the values of frozen parameters: under bf16 DeepSpeed keeps no fp32 copy of them."""
        if self.rank != 0:
            return None
        weights = {**ds.consolidated_state_dict(self.dir, tag), **frozen}
        return write_export(self.run_dir / name, weights, model_cfg, data,
                            {"run_dir": str(self.run_dir), "checkpoint": tag, "git": git_commit(), **info})

    def best_so_far(self, metric: str, step: int) -> float | None:
        """The best value of ``metric`` that ``export-best/`` holds, if it was chosen by that metric
        no later than ``step`` (a resumed run continues the same selection)."""
        info = self.run_dir / BEST_EXPORT / "export.json"
        if metric and info.exists():
            best = json.loads(info.read_text()).get("best", {})
            if best.get("metric") == metric and best.get("step", 0) <= step:
                return float(best["value"])
        return None

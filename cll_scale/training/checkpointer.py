"""A run's checkpoints and exports: the commit protocol, integrity, retention, restore, export,
and the model chosen on validation.

``checkpoints/`` holds DeepSpeed checkpoints: every rank writes its ZeRO shard of ``step<N>/``,
then rank 0 lists the files with their sizes in ``step<N>/cll_meta.json`` and rewrites
``latest`` atomically, the commit point. A save interrupted at any moment leaves ``latest`` at
the previous, complete checkpoint; a resume checks the files against the list and falls back to
the newest complete checkpoint. ``export/`` and ``export-best/`` are what inference loads.
DeepSpeed is reached only through :mod:`cll_scale.training.engine`.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from cll_scale.core import faults
from cll_scale.core.errors import EXIT_FILES
from cll_scale.core.outputs import json_text, write_atomic
from cll_scale.model.export import ExportInfo, write_export
from cll_scale.training import collectives
from cll_scale.training import engine as ds
from cll_scale.training.rundir import (BEST_EXPORT, META, CheckpointConfig, checkpoint_problem, checkpoint_world_size,
                                       git_commit, has_checkpoints, latest_tag, resumable_tag, tag_for)


# May go in v0.2.0: checkpoints of before the registered states.
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


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous one is untouched."""
    exit_code = EXIT_FILES


class Checkpointer:
    """Saves and restores the engine and the registered states. A state is any object with
    ``state_dict()`` / ``load_state_dict(state)``; a per-rank state (the stream's position, the
    RNG) is gathered from every rank on save, and on a resume at another world size is given the
    first rank's state with ``strict_world=False``."""

    def __init__(self, cfg: CheckpointConfig, run_dir: Path, rank: int):
        self.cfg, self.run_dir, self.rank = cfg, run_dir, rank
        self.dir = run_dir / "checkpoints"
        self.states: dict[str, tuple[object, bool]] = {}       # name -> (state, per rank)
        self._saved: tuple[int | None, str | None] = (None, None)   # newest (step, tag) of this process

    def register(self, name: str, state, per_rank: bool = False) -> None:
        self.states[name] = (state, per_rank)

    def due(self, step: int) -> bool:
        return step % self.cfg.every == 0

    def latest(self) -> str | None:
        return latest_tag(self.dir)

    def exists(self) -> bool:
        return has_checkpoints(self.dir)

    def resumable_tag(self, world: int, log) -> tuple[str | None, bool]:
        """The newest complete checkpoint (``latest`` unless it is missing or damaged, which is
        logged), converted to a universal checkpoint when the world size changed; returns
        (tag, universal)."""
        tag, warning = resumable_tag(self.dir)
        if warning:
            log(f"warning: {warning}")
            self._set_aside_newer_than(tag, log)
        universal = bool(tag) and checkpoint_world_size(self.dir, tag) != world
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
        collectives.barrier()

    def client_state(self) -> dict:
        return {name: collectives.all_gather_object(state.state_dict()) if per_rank else state.state_dict()
                for name, (state, per_rank) in self.states.items()}

    def save(self, engine, step: int) -> str:
        """Save ``step`` with every registered state, on every rank."""
        if self._saved[0] == step:            # validation already saved this step
            return self._saved[1]
        tag = tag_for(step)
        if self.latest() == tag:              # resumed with the budget spent: never rewrite the latest
            return tag
        state = self.client_state()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            ds.save_checkpoint(engine, self.dir, tag, state)
            if self.rank == 0:
                self._commit(step, tag)
            collectives.barrier()
        except (OSError, RuntimeError) as err:   # disk full, quota, unwritable directory (torch.save
            # reports a failed write as a RuntimeError from its zip writer)
            previous = self.latest()
            raise CheckpointError(f"saving the step {step} checkpoint in {self.dir} failed ({err}); "
                                  + (f"the previous checkpoint {previous} is intact and --resume continues "
                                     f"from it" if previous else "no earlier checkpoint exists")) from None
        self._saved = (step, tag)
        return tag

    def _commit(self, step: int, tag: str) -> None:
        """Rank 0, once every rank has written ``tag``: list what it holds (so that a resume can
        tell a complete checkpoint from a damaged one; checkpoints live on a file system every
        rank shares), point ``latest`` at it, then keep the newest ``keep_last`` complete
        checkpoints (the new one among them); incomplete leftovers older than it go too."""
        files = {str(f.relative_to(self.dir / tag)): f.stat().st_size
                 for f in sorted((self.dir / tag).rglob("*")) if f.is_file() and f.name != META}
        write_atomic(self.dir / tag / META, json_text(
            {"step": step, "world_size": torch.distributed.get_world_size(), "files": files}))
        if faults.hit("crash_in_save", step):     # the files written, the commit not
            faults.crash()
        write_atomic(self.dir / "latest", tag)
        older = sorted((p.name for p in self.dir.glob("step*")
                        if p.is_dir() and not p.name.endswith("_universal") and p.name < tag), reverse=True)
        complete = [t for t in older if checkpoint_problem(self.dir, t) is None]
        kept = set(complete[:self.cfg.keep_last - 1])
        for old in older:
            if old not in kept:
                shutil.rmtree(self.dir / old, ignore_errors=True)
                shutil.rmtree(self.dir / f"{old}_universal", ignore_errors=True)

    def load(self, engine, tag: str, world: int, universal: bool) -> None:
        """Restore the engine and every registered state from ``tag``. A per-rank state comes
        back on the same rank when the world size is the one it was saved at; otherwise every
        rank gets the first rank's state with ``strict_world=False``."""
        client = upgrade_client_state(ds.load_checkpoint(engine, self.dir, tag))
        for name, (state, per_rank) in self.states.items():
            if not per_rank:
                state.load_state_dict(client[name])
            elif len(client[name]) == world and not universal:
                state.load_state_dict(client[name][self.rank])
            else:
                state.load_state_dict(client[name][0], strict_world=False)

    def export(self, tag: str, frozen: dict[str, torch.Tensor], model_cfg, data: str, manifest, info: dict,
               name: str = "export") -> Path | None:
        """Consolidate the ZeRO checkpoint ``tag`` into ``run_dir/name`` (rank 0). ``frozen`` holds
        the values of frozen parameters: under bf16 DeepSpeed keeps no fp32 copy of them."""
        if self.rank != 0:
            return None
        weights = {**ds.consolidated_state_dict(self.dir, tag), **frozen}
        return write_export(self.run_dir / name, weights, model_cfg, data,
                            {"run_dir": str(self.run_dir), "checkpoint": tag, "git": git_commit(), **info}, manifest)

    def best_so_far(self, metric: str, step: int) -> float | None:
        """The best value of ``metric`` that ``export-best/`` holds, if it was chosen by that metric
        no later than ``step`` (a resumed run continues the same selection)."""
        best_dir = self.run_dir / BEST_EXPORT
        if metric and ExportInfo.exists(best_dir):
            best = ExportInfo.load(best_dir).best
            if best.get("metric") == metric and best.get("step", 0) <= step:
                return float(best["value"])
        return None

"""What ``cll-train`` does once its flags are read: train the recipe (or resume it), or time a
dry run of it, and print the outcome as JSON on rank 0."""
from __future__ import annotations

import os

from cll_scale.core.outputs import json_text
from cll_scale.run.build import build_run
from cll_scale.run.dryrun import dry_run, format_dry_run
from cll_scale.run.recipe import TrainConfig
from cll_scale.run.trainer import Trainer
from cll_scale.training import collectives


def train_recipe(recipe: dict, resume: bool = False, dry_run_steps: int | None = None) -> int:
    """Train ``recipe``, or with ``dry_run_steps`` build it in a temporary directory and time that
    many steps; the process group ends before rank 0 prints."""
    if dry_run_steps is not None:
        figures = dry_run(recipe, dry_run_steps)
        collectives.shutdown()
        if int(os.environ.get("RANK", 0)) == 0:
            print(format_dry_run(figures, recipe.get("train", {}).get("run_dir", TrainConfig.run_dir)))
            print(json_text({"dry_run": figures}))
        return 0
    result = Trainer(build_run(recipe, resume=resume)).train()
    collectives.shutdown()
    if int(os.environ.get("RANK", 0)) == 0:
        print(json_text(result))
    return 0

"""``cll-train``: train a CLL Transformer with DeepSpeed ZeRO-2.

    cll-train --recipe recipes/multi30k_centered_fcll.yaml                     # one process
    deepspeed --num_gpus 2 -m cll_scale.train --recipe R                        # 2 ranks
    deepspeed --num_nodes N --num_gpus G --hostfile H -m cll_scale.train --recipe R
    cll-train --recipe R --resume                                               # continue
    cll-train --recipe R --dry-run                                              # build, time, exit

The recipe gives the preset and the sections ``model``, ``data`` (stream), ``optim``,
``checkpoint``, ``valid``, ``log`` and ``train``. Every setting is also a flag (``--optim.lr 5e-4``,
``--valid.every 250``; ``cll-train --help`` lists them with their defaults), and ``--set
section.key=value`` overrides any field. The run directory receives the resolved config, the
DeepSpeed config, the git commit, metrics (JSON lines and DeepSpeed's monitor), checkpoints,
the training-curve PNG and ``export/``. ``--dry-run`` builds all of it (stream, model, engine) in a
temporary run directory, times a few steps, prints what an epoch costs and leaves the run
directory untouched.
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import add_debug_argument, plain_text, positive_int
from cll_scale.core.errors import run_guarded
from cll_scale.model.config import PRESETS
from cll_scale.run.recipe import add_recipe_arguments, recipe_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-train", description=plain_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", help="YAML or JSON recipe (sections: preset, model, data, optim, checkpoint, "
                   "valid, log, train)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="the model's sizes (default: the recipe's, else small)")
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="build the run (stream, model, DeepSpeed engine), time a few steps, print parameters, "
                        "tokens per step, steps and time per epoch, and exit without writing the run directory")
    p.add_argument("--dry-run-steps", type=positive_int, default=5, metavar="N",
                   help="steps timed by --dry-run, after a few warm-up steps (default: 5)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a recipe field, e.g. --set optim.lr=5e-4 --set model.lsl_dim=512 "
                        "(the same as the setting's flag)")
    add_recipe_arguments(p)
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by the launcher
    add_debug_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.dry_run and args.resume:
        parser.error("--dry-run starts a fresh run in a temporary directory; drop --resume")

    def body() -> int:
        from cll_scale.run.command import train_recipe      # torch comes with it: --help needs none
        return train_recipe(recipe_from_args(args), args.resume, args.dry_run_steps if args.dry_run else None)
    return run_guarded("cll-train", body, args.debug)


if __name__ == "__main__":
    sys.exit(main())

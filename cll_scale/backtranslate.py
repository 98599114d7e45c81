"""``cll-bt``: back-translation fine-tuning (paper §4.3, after Zhang et al. 2020's online
back-translation).

    cll-bt --model runs/x/export --data data/shards/multi30k-centered --out runs/x-bt --bt-langs de,fr,cs
    deepspeed --num_gpus 8 -m cll_scale.backtranslate --model ... # generation and training on every rank

Every epoch: the current model translates the target side of each training pair into a random
language of ``--bt-langs`` other than the target's (the pseudo source), one epoch is trained on
the real pairs plus the pseudo pairs — which cover the zero-shot directions — and the next epoch
starts over with the updated model. Paper settings: 4 epochs, a fresh optimizer, 500 warm-up
steps, peak learning rate 3e-4. Layout of ``--out`` (re-running the command resumes it):

    settings.json      the settings of the run: a re-run must match them (or pass --restart)
    bt.json            the epochs finished
    parts/epoch-K/     finished generation chunks: an interrupted epoch does not redo them
    data/epoch-K/      a shard directory: the real shards (hard links) + the pseudo ones (bt.*)
    run/               the fine-tuning run: checkpoints, metrics, export/ (the result)
    eval/<split>/      before/after report (results.md, results.json, plots)
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import plain_text
from cll_scale.loops.settings import BTConfig, build_parser as fine_tuning_parser, command


def build_parser() -> argparse.ArgumentParser:
    return fine_tuning_parser("cll-bt", plain_text(__doc__), BTConfig)


def run(cfg: BTConfig, restart: bool) -> dict[str, str]:
    from cll_scale.loops.backtranslate import run as back_translate      # torch comes with it: --help needs none
    return back_translate(cfg, restart)


def main(argv: list[str] | None = None) -> int:
    return command("cll-bt", argv, build_parser(), BTConfig, run)


if __name__ == "__main__":
    sys.exit(main())

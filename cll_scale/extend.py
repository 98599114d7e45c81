"""``cll-extend``: teach a trained model a new language from a few parallel pairs (paper §4.4,
App. A).

    cll-extend --model runs/multi30k-en-de-fr-fcll/export-best --data data/shards/multi30k-en-de-fr --lang cs \\
               --corpus ../shared/data/multi30k --pairs en-cs,cs-en --max-pairs 5000 \\
               --out runs/multi30k-en-de-fr-fcll-plus-cs --max-steps 2000

1. SentencePiece: pieces learned on the new language are appended to the model's vocabulary
   (old ids unchanged; pieces that would change how old-language text splits are left out,
   :mod:`cll_scale.data.spm_extend`).
2. Shards: the new pairs (and every dev/test direction with the new language) are built with the
   extended vocabulary and listed in one manifest with the old shards (hard links), whose ids
   stay valid.
3. Model: embedding rows for the new pieces = mean of the old rows + small noise; the new
   language's LSL and ``t`` = the average of the existing ones (Eq. 3). Before fine-tuning the
   model scores every old-vocabulary continuation exactly as the original did.
4. Fine-tuning on new + old data with the existing languages' CLL parameters frozen (``--freeze``
   adds more), starting at the learning rate where pre-training ended (its schedule continues).
5. Before/after evaluation on the corpus's test sets.

Re-running the command resumes: finished steps are kept (``out/data``, ``out/init-export``,
the run's checkpoints). The settings are recorded in ``out/settings.json``: a re-run with other
ones is refused (``--restart`` discards the run and begins again).
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import plain_text
from cll_scale.loops.settings import ExtendConfig, build_parser as fine_tuning_parser, command


def build_parser() -> argparse.ArgumentParser:
    return fine_tuning_parser("cll-extend", plain_text(__doc__), ExtendConfig)


def run(cfg: ExtendConfig, restart: bool) -> dict[str, str]:
    from cll_scale.loops.extend import run as extend      # torch comes with it: --help needs none
    return extend(cfg, restart)


def main(argv: list[str] | None = None) -> int:
    return command("cll-extend", argv, build_parser(), ExtendConfig, run)


if __name__ == "__main__":
    sys.exit(main())

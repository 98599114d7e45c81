"""``cll-bt``: back-translation fine-tuning (paper §4.3). The command's help is the loop's description:
:mod:`cll_scale.loops.backtranslate`."""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import plain_text
from cll_scale.loops import finetune
from cll_scale.loops.backtranslate import BTConfig, run
from cll_scale.loops.backtranslate import __doc__ as DESCRIPTION


def build_parser() -> argparse.ArgumentParser:
    return finetune.build_parser("cll-bt", plain_text(DESCRIPTION), BTConfig)


def main(argv: list[str] | None = None) -> int:
    return finetune.command("cll-bt", argv, build_parser(), BTConfig, run)


if __name__ == "__main__":
    sys.exit(main())

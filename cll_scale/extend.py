"""``cll-extend``: a new language from a few parallel pairs (paper §4.4). The command's help is the loop's description:
:mod:`cll_scale.loops.extend`."""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import plain_text
from cll_scale.loops import finetune
from cll_scale.loops.extend import ExtendConfig, run
from cll_scale.loops.extend import __doc__ as DESCRIPTION


def build_parser() -> argparse.ArgumentParser:
    return finetune.build_parser("cll-extend", plain_text(DESCRIPTION), ExtendConfig)


def main(argv: list[str] | None = None) -> int:
    return finetune.command("cll-extend", argv, build_parser(), ExtendConfig, run)


if __name__ == "__main__":
    sys.exit(main())

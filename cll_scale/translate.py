"""``cll-translate``: translate text with an ``export/`` directory (no DeepSpeed), through
:class:`cll_scale.evaluation.translator.Translator`.

    cll-translate --model runs/x/export --tgt-lang de < input.en > output.de
    cll-translate --model runs/x/export --tsv < mixed.tsv > output.txt   # lines "tgt<TAB>text"
                                                                          # or "src<TAB>tgt<TAB>text"
"""
from __future__ import annotations

import argparse
import logging
import sys

from cll_scale.core.cli import (add_alias, add_config_arguments, add_debug_argument, add_device_argument,
                                add_lsl_argument, add_model_argument, config_from_args, plain_text, positive_int)
from cll_scale.core.errors import run_guarded
from cll_scale.model.decode_config import DecodeConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-translate", description=plain_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(p, "the model (its export/ directory)")
    p.add_argument("--tgt-lang", help="target language of every input line")
    p.add_argument("--src-lang", help="source language (checked against the model's languages)")
    p.add_argument("--tsv", action="store_true", help="input lines are 'tgt<TAB>text' or 'src<TAB>tgt<TAB>text'")
    p.add_argument("--input", help="input file (default: standard input)")
    p.add_argument("--output", help="output file (default: standard output)")
    add_config_arguments(p, DecodeConfig)
    p.add_argument("--beam-tokens", type=positive_int, help="source tokens × beam per batch (default: 6,000 on "
                   "the CPU, 96,000 on a GPU)")
    add_alias(p, "--max-tokens", "--beam-tokens", dest="beam_tokens", type=positive_int)
    add_lsl_argument(p, "translate with the LSLs switched off (paper Table 10 ablation)")
    add_alias(p, "--no-lsl", "--ablate-lsl", dest="ablate_lsl", action="store_true")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="leave out the target-language tag a model was trained with (paper Table 8 ablation)")
    add_device_argument(p)
    add_debug_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="cll-translate: %(levelname)s: %(message)s")

    def body() -> int:
        from cll_scale.evaluation.commands import translate_text        # torch comes with it: --help needs none
        return translate_text(args, config_from_args(DecodeConfig, args))
    return run_guarded("cll-translate", body, args.debug)


if __name__ == "__main__":
    sys.exit(main())

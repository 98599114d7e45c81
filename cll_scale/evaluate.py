"""``cll-eval``: BLEU, chrF and off-target rates per direction, for one or more exported models.

    cll-eval --model baseline=runs/b/export --model fcll=runs/f/export \\
             --data data/shards/multi30k-centered --split test_2016_flickr --out results/t2016
    cll-eval --model fcll=runs/f/export --corpus ../shared/data/multi30k --split test_2018_flickr --out r
    cll-eval --model fcll=runs/f/export --corpus opus-100-corpus --split test --ablate-lsl --out r

Per direction: sacreBLEU on detokenised text (signature printed), chrF, the off-target rate with
langdetect as in the paper (``plain``) and restricted to the model's languages (``restricted``),
code-switching, the off-target languages and the "rollback" of paper Table 10
(:mod:`cll_scale.evaluation.scoring`); with ``--lid langdetect,lingua`` also lingua's off-target rate and
code-switch share. Averages for en→xx, xx→en, supervised and zero-shot. Writes ``results.json``
(with sentences/s and where the time went: decoding, language ID, scoring), ``results.md`` (paper
Tables 2-3 layout), with two or more models ``significance.md`` and ``significance.json`` (each
model against the first per direction group: sacreBLEU's paired bootstrap for BLEU and chrF, an
exact McNemar test for off-target; :mod:`cll_scale.evaluation.significance`), ``bleu_offtarget.png``, ``t_weights.png`` (paper Fig. 6) and every hypothesis,
``hyps/<model>/<setting>/<direction>.txt`` (setting ``default``, ``lsl-off`` or ``tag-omitted``), so that outputs
can be rescored or compared without decoding again. ``--out`` is locked while cll-eval runs and replaced as a
whole when it ends, so no hypotheses of an earlier evaluation's models stay beside the new ones; a directory that
holds anything else is refused, before any model is loaded.

Each test set is decoded once per model and setting. Scoring and language identification run in
a small process pool (``--lid-workers``) while the next direction decodes.
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import (add_debug_argument, add_device_argument, add_lsl_argument, add_model_argument,
                                non_negative_int, plain_text, positive_int)
from cll_scale.core.errors import run_guarded
from cll_scale.evaluation.scoring import add_lid_arguments
from cll_scale.model.decode_config import DecodeConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-eval", description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(p, "a model to evaluate (repeatable): its name heads its rows", several=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a shard directory; its --split dev/test shards carry the raw text")
    src.add_argument("--corpus", help="a multi-way or OPUS-100 corpus directory")
    p.add_argument("--split", default="test", help="e.g. test_2016_flickr, valid, test (default: test)")
    p.add_argument("--directions", help="comma-separated subset, e.g. de-fr,fr-de (default: every direction)")
    p.add_argument("--out", required=True, help="directory for results.json / results.md / PNGs")
    p.add_argument("--beam", type=positive_int, default=DecodeConfig.beam, help=f"beam size (default: {DecodeConfig.beam})")
    p.add_argument("--max-sentences", type=non_negative_int, default=0,
                   help="evaluate only the first N of each direction (0: all) (default: 0)")
    add_lsl_argument(p, "also evaluate with the LSLs switched off (paper Tables 9-10)")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="also evaluate the models trained with language tags without the tag (paper Table 8); "
                        "refused when no model given was trained with tags")
    add_device_argument(p)
    add_lid_arguments(p)
    add_debug_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from cll_scale.evaluation.commands import evaluate_models       # torch comes with it: --help needs none
        return evaluate_models(args)
    return run_guarded("cll-eval", body, args.debug)


if __name__ == "__main__":
    sys.exit(main())

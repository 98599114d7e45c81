"""``cll-analyze``: the paper's §5 analyses of exported models (:mod:`cll_scale.analysis.attribution`).

    # Fig. 5: which component pushed each output token, per decoder layer (Captum integrated gradients)
    cll-analyze attribution --model runs/f/export --data data/shards/multi30k-triangle \\
        --split test_2016_flickr --direction fr-de --sentences 30 --out analysis/attribution-fr-de
    # Fig. 3: encoder self-attention and cross-attention of one sentence, tag kept and omitted
    cll-analyze attention --model fcll=runs/f/export --model notag=runs/n/export --omit-lang-tag \\
        --data data/shards/multi30k-centered --split test_2016_flickr --direction de-fr --out analysis/attention

Sentences come from a shard directory's dev/test split (``--data``/``--split``/``--direction``,
the first ``--sentences``) or from ``--text`` (repeatable) with ``--tgt-lang``. The target side is
the model's own translation (beam ``--beam``), or the reference with ``--reference``.

attribution writes ``analysis.json`` (the summary: per token class, the share of (token, layer)
pairs where the LSL's and the FFN's attributions have opposite signs, each component's mean
absolute attribution, the largest convergence delta), ``analysis.md``, ``sentences.json`` (every
value) and ``heatmap-<i>.png`` for the first ``--heatmaps`` sentences. attention writes
``analysis.json`` (the weights, and the share the tag receives), ``encoder.png`` and ``cross.png``.
``--out`` is locked while an analysis runs and replaced as a whole when it ends (no heat map or figure
of an earlier analysis stays beside the new one). ``--steps`` and each sentence's length are checked
against the memory they need before the work begins; the steps go through the model as many at a time as fit.
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import (add_debug_argument, add_device_argument, add_model_argument, echo_command,
                                non_negative_int, plain_text, positive_int)
from cll_scale.core.errors import run_guarded
from cll_scale.model.decode_config import DecodeConfig


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="a shard directory: its --split gives the sentences (and, for attribution, "
                                  "each language's pieces)")
    p.add_argument("--split", default="test_2016_flickr", help="a dev/test split of --data (default: test_2016_flickr)")
    p.add_argument("--direction", help="src-tgt, e.g. fr-de: a direction of --split")
    p.add_argument("--text", action="append", help="a source sentence (repeatable), instead of --direction")
    p.add_argument("--tgt-lang", help="the target language of --text")
    p.add_argument("--reference", action="store_true",
                   help="teacher-force the references of --direction instead of the model's own translations")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="leave the language tag out of the input (paper Table 8; attention: add this case)")
    p.add_argument("--beam", type=positive_int, default=DecodeConfig.beam,
                   help=f"beam of the model's own translations (default: {DecodeConfig.beam})")
    p.add_argument("--out", required=True, help="the output directory")
    add_device_argument(p)
    add_debug_argument(p)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-analyze", description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="analysis", required=True)
    a = sub.add_parser("attribution", help="layer attribution of the FFN and LSL components (paper Fig. 5)")
    add_model_argument(a, "the model (its export/ directory)")
    a.add_argument("--sentences", type=positive_int, default=20, help="the first N sentences of --direction (default: 20)")
    a.add_argument("--steps", type=positive_int, default=32, help="integration steps (Gauss-Legendre) (default: 32)")
    a.add_argument("--heatmaps", type=non_negative_int, default=3, help="heat maps for the first N sentences (default: 3)")
    add_input_arguments(a)
    b = sub.add_parser("attention", help="attention maps of one sentence (paper Fig. 3)")
    add_model_argument(b, "a model (repeatable): each is a row of the figures", several=True)
    b.add_argument("--index", type=non_negative_int, default=0, help="which sentence of --direction (default: 0, the first)")
    add_input_arguments(b)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = echo_command("cll-analyze", argv).strip("`")

    def body() -> int:
        from cll_scale.analysis.commands import analyze      # torch comes with it: --help needs none
        return analyze(args, command)
    return run_guarded("cll-analyze", body, args.debug)


if __name__ == "__main__":
    sys.exit(main())

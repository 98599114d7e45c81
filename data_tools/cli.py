"""``cll-shards``: build, inspect and verify shard directories.

    cll-shards build --corpus ../shared/data/multi30k --condition centered --out data/shards/multi30k-centered
    cll-shards build --corpus ../shared/data/multi30k --condition triangle --langs de,fr,cs --out data/shards/multi30k-triangle
    cll-shards build --format opus100 --corpus opus-100-corpus --out data/opus100
    cll-shards build --format hf --corpus Helsinki-NLP/opus-100 --pairs de-en,en-fr,de-fr --out data/opus-hf
    cll-shards inspect data/shards/multi30k-centered
    cll-shards verify data/shards/multi30k-centered
    cll-shards download multi30k --out data/raw/multi30k
    cll-shards synth --scale 0.01 --out data/raw/opus100-synth    # OPUS-100's shape, synthetic text
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import (add_alias, add_config_arguments, add_debug_argument, finite_float, non_negative_int,
                                plain_text)
from cll_scale.core.errors import run_guarded
from cll_scale.data.shards import BuildConfig
from data_tools.commands import (cmd_build, cmd_download, cmd_inspect, cmd_synth, cmd_verify,  # noqa: F401
                                 dependence_lines)

FORMATS = ("auto", "multiway", "opus100", "parquet", "hf")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cll-shards", description=plain_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_debug_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="corpus -> SentencePiece model + Arrow shards + manifest")
    b.add_argument("--corpus", help="corpus directory, or a hub dataset name with --format hf (required)")
    add_alias(b, "--input", "--corpus", dest="corpus")
    b.add_argument("--format", choices=FORMATS, default="auto", help="the corpus's layout (default: auto, from its files)")
    b.add_argument("--condition", help="multi-way: centered (default), triangle, square, cycle (one-way, any number of languages), or directions "
                   "'de-fr,fr-cs'; pair corpora: all (default) or a list of directions to train on")
    b.add_argument("--langs", help="comma-separated languages to use (order defines the triangle, square and cycle directions)")
    b.add_argument("--central", help="central language of a centered condition (default: en)")
    b.add_argument("--pairs", help="--format hf: configs to read, e.g. de-en,en-fr (default: all)")
    b.add_argument("--allow-lang", action="append", metavar="CODE", help="accept a non-ISO-639-1 code")
    add_config_arguments(b, BuildConfig)
    b.add_argument("--reuse", action="store_true",
                   help="keep an existing --out built from this corpus with these languages and directions (its "
                        "other build settings named); refuse one of another corpus or condition")
    b.set_defaults(func=cmd_build)
    i = sub.add_parser("inspect", help="print a per-direction table of a shard directory")
    i.add_argument("dir")
    i.set_defaults(func=cmd_inspect)
    v = sub.add_parser("verify", help="check every shard and the tokenizer against the manifest's sha256")
    v.add_argument("dir")
    v.set_defaults(func=cmd_verify)
    dl = sub.add_parser("download", help="fetch a public corpus (needs network access)")
    dl.add_argument("corpus", choices=("multi30k",))
    dl.add_argument("--out", required=True)
    dl.add_argument("--base-url", help="mirror to fetch {split}.{lang}.gz from (http(s):// or file://)")
    dl.add_argument("--overwrite", action="store_true")
    dl.set_defaults(func=cmd_download)
    sy = sub.add_parser("synth", help="write a synthetic corpus in the OPUS-100 layout, at OPUS-100's shape")
    sy.add_argument("--out", required=True, help="output directory (must not exist or be empty, unless --overwrite)")
    sy.add_argument("--scale", type=finite_float, required=True,
                    help="training pairs as a fraction of OPUS-100's (1.0 = 55M pairs; every language keeps >= 1)")
    sy.add_argument("--scale-eval", action="store_true",
                    help="scale dev, test and zero-shot test sets too (default: their real sizes, 2,000 pairs)")
    sy.add_argument("--langs", help="comma-separated OPUS-100 languages to pair with en (default: all 99)")
    sy.add_argument("--seed", type=non_negative_int, default=1, help="same arguments and seed: byte-identical files (default: 1)")
    sy.add_argument("--overwrite", action="store_true", help="replace a corpus that synth wrote (and nothing else)")
    sy.set_defaults(func=cmd_synth)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_guarded("cll-shards", lambda: args.func(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())

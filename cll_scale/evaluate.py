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

from cll_scale.core.cli import add_debug_argument, non_negative_int, parse_models, pick_device, plain_text, positive_int
from cll_scale.core.errors import run_guarded
from cll_scale.core.outputs import json_text, result_dir, write_atomic
from cll_scale.evaluation.scoring import add_lid_arguments
from cll_scale.model.decode_config import DecodeConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-eval", description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, metavar="NAME=EXPORT_DIR")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a shard directory; its --split dev/test shards carry the raw text")
    src.add_argument("--corpus", help="a multi-way or OPUS-100 corpus directory")
    p.add_argument("--split", default="test", help="e.g. test_2016_flickr, valid, test")
    p.add_argument("--directions", help="comma-separated subset, e.g. de-fr,fr-de")
    p.add_argument("--out", required=True, help="directory for results.json / results.md / PNGs")
    p.add_argument("--beam", type=positive_int, default=DecodeConfig.beam)
    p.add_argument("--max-sentences", type=non_negative_int, default=0,
                   help="evaluate only the first N of each direction (0: all)")
    p.add_argument("--ablate-lsl", action="store_true", help="also evaluate with the LSLs switched off (Tables 9-10)")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="also evaluate the models trained with language tags without the tag (Table 8); "
                        "refused when no model given was trained with tags")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    add_lid_arguments(p)
    add_debug_argument(p)
    return p


# What cll-eval writes into --out, which it replaces as a whole: the hypotheses of the models of
# an earlier evaluation never stay beside a new one's.
WRITES = ("results.json", "results.md", "bleu_offtarget.png", "t_weights.png", "hyps", "significance.json",
          "significance.md")


def evaluate_cli(args) -> int:
    # imported after parsing: torch comes with them, and --help or a usage error needs none of it
    from cll_scale.evaluation.evaluator import check_file_names, compare, significance
    from cll_scale.evaluation.pool import lid_pool
    from cll_scale.evaluation.report import write_report
    from cll_scale.evaluation.testsets import pairs_from_corpus, pairs_from_shards
    from cll_scale.evaluation.translator import TranslateConfig, Translator
    models = parse_models(args.model)
    check_file_names(models)
    device = pick_device(args.device)
    inputs = {"--data": args.data, "--corpus": args.corpus,
              **{f"--model {name}": path for name, path in models.items()}}
    with result_dir(args.out, "cll-eval", WRITES, inputs) as out:
        cfg = TranslateConfig(DecodeConfig(beam=args.beam))
        translators = {name: Translator.load(path, device, cfg) for name, path in models.items()}
        if args.omit_lang_tag:
            Translator.check_tags_to_omit({name: t.lang_tag for name, t in translators.items()})
        languages = sorted({x for t in translators.values() for x in t.languages})
        pairs = (pairs_from_shards(args.data, args.split) if args.data
                 else pairs_from_corpus(args.corpus, args.split, languages))
        directions = [d.strip() for d in args.directions.split(",")] if args.directions is not None else None
        with lid_pool(args.lid_workers) as pool:
            report = compare(translators, pairs, f"{args.data or args.corpus}:{args.split}", args.beam, directions,
                             args.max_sentences, args.ablate_lsl, log=lambda s: print(s, file=sys.stderr),
                             lid=args.lid, pool=pool, hyps_out=out / "hyps", omit_lang_tag=args.omit_lang_tag)
        table = write_report(report, out)
        paired = significance(report, list(models), pairs, out / "hyps")
        if paired.comparisons:
            write_atomic(out / "significance.json", json_text(paired.to_json(), indent=1, ensure_ascii=False))
            write_atomic(out / "significance.md", paired.markdown())
    print(table)
    if paired.comparisons:
        print(paired.markdown())
    print(f"BLEU signature: {report.bleu_signature}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_guarded("cll-eval", lambda: evaluate_cli(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())

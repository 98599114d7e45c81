"""What each ``cll-shards`` subcommand does once its flags are read (the command,
:mod:`data_tools.cli`, only parses them)."""
from __future__ import annotations

import sys
from pathlib import Path

from cll_scale.core.cli import config_from_args
from cll_scale.core.errors import EXIT_INPUT
from cll_scale.core.clock import StageClock
from cll_scale.data.corpora import (CorpusError, detect_format, read_hf_dataset, read_multiway, read_opus100,
                                    read_parquet_dir)
from cll_scale.data.languages import Direction, strict_dependence, targets_by_source
from cll_scale.data.manifest import Manifest
from cll_scale.data.shards import BuildConfig, build_into, kept_build, shard_output
from data_tools.synth import synthesize


def _csv(text: str | None) -> list[str] | None:
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def read_corpus(args) -> object:
    fmt = detect_format(args.corpus) if args.format == "auto" else args.format
    langs, allow = _csv(args.langs), frozenset(args.allow_lang or ())
    if fmt == "multiway":
        return read_multiway(args.corpus, args.condition or "centered", langs, args.central, allow)
    if args.central:
        raise CorpusError(f"--central applies to multi-way input; a {fmt} corpus declares its own pairs")
    if fmt == "opus100":
        return read_opus100(args.corpus, langs, args.condition, allow)
    if fmt == "parquet":
        return read_parquet_dir(args.corpus, langs, args.condition, allow)
    return read_hf_dataset(args.corpus, _csv(args.pairs), langs, args.condition, allow)


def cmd_build(args) -> int:
    if args.corpus is None:     # not argparse's required: its old spelling --input is read too
        raise ValueError("cll-shards build needs --corpus: a corpus directory, or a hub dataset name with --format hf")
    clock, cfg = StageClock(), config_from_args(BuildConfig, args)
    corpus = None
    if args.reuse:
        if cfg.overwrite:
            raise ValueError("--reuse keeps a build of this corpus, --overwrite replaces any: pass one of them")
        with clock.stage("scan"):
            corpus = read_corpus(args)
        settings = kept_build(corpus, cfg)
        if settings is not None:
            print(f"kept {args.out_dir}: the shards of this corpus and condition"
                  + (f", built with {', '.join(settings)} (--overwrite rebuilds them with this command's settings)"
                     if settings else ""), file=sys.stderr)
            return 0
    with shard_output(cfg, args.corpus, clock) as tmp:    # a refused --out costs no reading of the corpus
        if corpus is None:
            with clock.stage("scan"):            # line counts and the UTF-8 check of every input file
                corpus = read_corpus(args)
        manifest = build_into(corpus, cfg, tmp, clock)
    print(f"wrote {args.out_dir} in {clock.format()}")
    print(format_table(manifest))
    return 0


def format_table(m: Manifest) -> str:
    lines = [f"languages: {' '.join(m.languages)}    central: {m.central_language or '(none)'}    "
             f"vocab: {m.tokenizer.vocab_size}    max length: {m.max_length}",
             f"supervised: {' '.join(m.supervised)}",
             f"zero-shot:  {' '.join(m.zero_shot) or '(none)'}",
             *dependence_lines(m.supervised), ""]
    head = f"{'split':<18} {'direction':<9} {'kind':<10} {'rows':>10} {'src tok':>11} {'tgt tok':>11} " \
           f"{'empty':>6} {'long':>6} {'shards':>6}"
    lines += [head, "-" * len(head)]
    for name, split in m.splits.items():
        for d in sorted(set(split.directions()) | set(split.filtered)):
            shards = [s for s in split.shards if s.direction == d]
            f = split.filtered.get(d, {})
            kind = m.kind(d)
            lines.append(f"{name:<18} {d:<9} {kind:<10} {sum(s.rows for s in shards):>10,} "
                         f"{sum(s.src_tokens for s in shards):>11,} {sum(s.tgt_tokens for s in shards):>11,} "
                         f"{f.get('empty', 0):>6} {f.get('too_long', 0):>6} {len(shards):>6}")
    return "\n".join(lines)


def dependence_lines(supervised: list[Direction]) -> list[str]:
    """Each source language's supervised targets, and whether the condition has the paper's strict
    dependence (§4.1): then the source alone tells the model the output language, and a zero-shot
    direction tends to collapse into the one target its source was trained into."""
    targets = targets_by_source(supervised)
    lines = ["targets by source: " + "  ".join(f"{src}→{','.join(t)}" for src, t in targets.items())]
    if strict_dependence(supervised):
        lines.append("strict dependence: yes, every source language has exactly one supervised target "
                     "(paper §4.1: expect zero-shot outputs in that target)")
    else:
        several = [src for src, t in targets.items() if len(t) > 1]
        lines.append("strict dependence: no, the language tag decides the output of "
                     + ("every source language" if len(several) == len(targets) else ", ".join(several)))
    return lines


def cmd_inspect(args) -> int:
    print(format_table(Manifest.load(args.dir)))
    return 0


def cmd_verify(args) -> int:
    if (Path(args.dir) / "export.json").is_file():      # it carries a copy of the manifest, not the shards
        raise ValueError(f"{args.dir} holds an export (export.json), not a shard directory; verify the shards it was "
                         "trained on (cll-translate, cll-eval and cll-analyze check an export's own files against "
                         "export.json as they load it)")
    manifest = Manifest.load(args.dir)
    problems = manifest.check_files(args.dir, full=True)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    n = sum(len(s.shards) for s in manifest.splits.values())
    if problems:               # damaged input: the exit code of bad input (cll_scale.core.errors)
        print(f"cll-shards: error: {len(problems)} problem(s) in {args.dir}", file=sys.stderr)
        return EXIT_INPUT
    size = sum(sh.bytes for s in manifest.splits.values() for sh in s.shards)
    print(f"OK: {n} shards ({size / 1e6:.1f} MB) and the tokenizer match {args.dir}/manifest.json")
    return 0


def cmd_download(args) -> int:
    from data_tools.download import MULTI30K_URL, download_multi30k
    path = download_multi30k(args.out, args.base_url or MULTI30K_URL, args.overwrite)
    print(f"wrote {path}")
    return 0


def cmd_synth(args) -> int:
    report = synthesize(args.out, args.scale, seed=args.seed, langs=_csv(args.langs),
                        scale_eval=args.scale_eval, overwrite=args.overwrite)
    t = report["totals"]
    print(f"wrote {args.out}: {len(report['languages'])} languages, {t['train']:,} training pairs, "
          f"{t['dev']:,} dev, {t['test']:,} test, {t['zero_shot_test']:,} zero-shot test pairs")
    print(f"{t['pairs']:,} pairs ({t['bytes'] / 1e6:,.1f} MB) in {report['seconds']:.1f} s: "
          f"{report['pairs_per_s']:,.0f} pairs/s")
    return 0

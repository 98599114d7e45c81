"""What ``cll-eval`` and ``cll-translate`` do once their flags are read (the commands,
:mod:`cll_scale.evaluate` and :mod:`cll_scale.translate`, only parse them): models loaded, test sets
decoded and scored, reports and hypotheses written; text read, translated and written."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from cll_scale.core.cli import parse_models, pick_device
from cll_scale.core.outputs import (OutputError, check_apart, check_file_writable, check_stdin_apart, json_text,
                                    result_dir, write_atomic)
from cll_scale.evaluation.evaluator import check_file_names, compare, significance
from cll_scale.evaluation.pool import lid_pool
from cll_scale.evaluation.report import write_report
from cll_scale.evaluation.testsets import pairs_from_corpus, pairs_from_shards
from cll_scale.evaluation.translator import TranslateConfig, Translator
from cll_scale.model.decode_config import DecodeConfig

log = logging.getLogger("cll_scale.translate")

# What cll-eval writes into --out, which it replaces as a whole: the hypotheses of the models of
# an earlier evaluation never stay beside a new one's.
WRITES = ("results.json", "results.md", "bleu_offtarget.png", "t_weights.png", "hyps", "significance.json",
          "significance.md")


def evaluate_models(args) -> int:
    """cll-eval: every --model on every direction of --data's or --corpus's --split, the report
    and (with two models or more) the paired significance written into --out and printed."""
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


def split_lines(raw: bytes) -> list[str]:
    """One entry per input line: split on "\\n" only (str.splitlines would also split on form
    feeds, U+2028 and friends and break line alignment); undecodable bytes become U+FFFD."""
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
        log.warning("input is not valid UTF-8; undecodable bytes were replaced by U+FFFD")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


def read_tsv(lines: list[str], languages: list[str]) -> tuple[list[str], list[str]]:
    """The texts and target languages of ``--tsv`` input, each line's language columns checked
    against the model's ``languages`` here, where the line number is known: a tab inside the text
    makes a line of three columns whose "target" is a piece of the sentence."""
    texts, tgts = [], []
    for n, line in enumerate(lines, 1):
        parts = line.rstrip("\n").split("\t")
        if len(parts) not in (2, 3):
            raise ValueError(f"line {n}: expected 'tgt<TAB>text' or 'src<TAB>tgt<TAB>text', found {len(parts)} "
                             "columns")
        unknown = next((code for code in parts[:-1] if code not in languages), None)
        if unknown is not None:
            raise ValueError(f"line {n}: {unknown!r} is not a language of this model ({', '.join(languages)}); "
                             "a line is 'tgt<TAB>text' or 'src<TAB>tgt<TAB>text', and a tab inside the text "
                             "makes another column")
        tgts.append(parts[-2])
        texts.append(parts[-1])
    return texts, tgts


def check_output_path(path: str, input_path: str | None) -> Path:
    """An output file whose directory exists and can be written, that is not a directory and not
    the input (by any name, or redirected to standard input): refused before any work."""
    out = Path(path)
    if out.is_dir():
        raise OutputError(f"--output {path} is a directory; give a file name")
    if not out.parent.is_dir():
        raise OutputError(f"--output {path}: the directory {out.parent} does not exist")
    check_apart(out, {"--input": input_path}, "--output")
    if input_path is None:
        check_stdin_apart(out)
    check_file_writable(out, "--output", "nothing was translated")
    return out


def open_streams(args) -> None:
    """A closed standard input or output (``<&-``, ``>&-``) is a usage error, found before the model loads."""
    if args.input is None and sys.stdin is None:
        raise ValueError("standard input is closed; give --input FILE or redirect a file into the command")
    if args.output is None and sys.stdout is None:
        raise ValueError("standard output is closed; give --output FILE")


def translate_text(args, decode: DecodeConfig) -> int:
    """cll-translate: --input (or standard input) line by line into --output (or standard output)."""
    if not args.tsv and not args.tgt_lang:
        raise ValueError("give --tgt-lang, or --tsv with the target language on every line")
    open_streams(args)
    out = check_output_path(args.output, args.input) if args.output else None
    cfg = TranslateConfig(decode, beam_tokens=args.beam_tokens or 0)
    translator = Translator.load(args.model, pick_device(args.device), cfg)
    for code in filter(None, (args.src_lang, args.tgt_lang)):
        translator.check_language(code)
    translator.check_omit_tag(args.omit_lang_tag)            # before reading the input
    raw = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    lines = split_lines(raw)
    texts, tgts = read_tsv(lines, translator.languages) if args.tsv else (lines, [args.tgt_lang] * len(lines))
    outputs = translator.translate(texts, tgts, use_lsl=not args.ablate_lsl, omit_tag=args.omit_lang_tag)
    text = "".join(o.replace("\n", " ").replace("\r", " ") + "\n" for o in outputs)
    if out is not None:
        write_atomic(out, text)
    else:
        sys.stdout.write(text)
    return 0

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
from pathlib import Path

from cll_scale.core.cli import (add_config_arguments, add_debug_argument, config_from_args, flags_of, pick_device,
                                plain_text, positive_int)
from cll_scale.core.errors import run_guarded
from cll_scale.core.outputs import OutputError, check_apart, check_file_writable, check_stdin_apart, write_atomic
from cll_scale.model.decode_config import DecodeConfig

log = logging.getLogger("cll_scale.translate")


def split_lines(raw: bytes) -> list[str]:
    """One entry per input line: split on "\n" only (str.splitlines would also split on form
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-translate", description=plain_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an export/ directory")
    p.add_argument("--tgt-lang", help="target language of every input line")
    p.add_argument("--src-lang", help="source language (checked against the model's languages)")
    p.add_argument("--tsv", action="store_true", help="input lines are 'tgt<TAB>text' or 'src<TAB>tgt<TAB>text'")
    p.add_argument("--input", help="input file (default: standard input)")
    p.add_argument("--output", help="output file (default: standard output)")
    add_config_arguments(p, DecodeConfig)
    p.add_argument(*flags_of("--beam-tokens"), dest="beam_tokens", type=positive_int, help="source tokens × beam per batch (default: 6,000 on "
                   "the CPU, 96,000 on a GPU)")
    p.add_argument("--no-lsl", action="store_true", help="switch the LSLs off (paper Table 10 ablation)")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="leave out the target-language tag a model was trained with (paper Table 8 ablation)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    add_debug_argument(p)
    return p


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


def translate_cli(args) -> int:
    # imported after parsing: torch comes with it, and --help or a usage error needs none of it
    from cll_scale.evaluation.translator import TranslateConfig, Translator
    if not args.tsv and not args.tgt_lang:
        raise ValueError("give --tgt-lang, or --tsv with the target language on every line")
    open_streams(args)
    out = check_output_path(args.output, args.input) if args.output else None
    cfg = TranslateConfig(config_from_args(DecodeConfig, args), beam_tokens=args.beam_tokens or 0)
    translator = Translator.load(args.model, pick_device(args.device), cfg)
    for code in filter(None, (args.src_lang, args.tgt_lang)):
        translator.check_language(code)
    translator.check_omit_tag(args.omit_lang_tag)            # before reading the input
    raw = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    lines = split_lines(raw)
    texts, tgts = read_tsv(lines, translator.languages) if args.tsv else (lines, [args.tgt_lang] * len(lines))
    outputs = translator.translate(texts, tgts, use_lsl=not args.no_lsl, omit_tag=args.omit_lang_tag)
    text = "".join(o.replace("\n", " ").replace("\r", " ") + "\n" for o in outputs)
    if out is not None:
        write_atomic(out, text)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="cll-translate: %(levelname)s: %(message)s")
    return run_guarded("cll-translate", lambda: translate_cli(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())

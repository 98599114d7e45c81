"""``cll-export``: an ``export/`` directory in another format, for users of other tools.

    cll-export --model runs/x/export --hf runs/x/hf

--hf writes a transformers directory: AutoModelForSeq2SeqLM.from_pretrained(DIR, trust_remote_code=True)
and AutoTokenizer.from_pretrained(DIR, trust_remote_code=True) load it (transformers 5 needed to load
it, not to write it), and its generate translates as cll-translate does. The target language is the
tokenizer's tgt_lang (tokenizer(texts, tgt_lang="de")); generate(..., use_lsl=False) switches the
LSLs off. The directory is replaced as a whole.
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import (add_config_arguments, add_debug_argument, add_model_argument, config_from_args,
                                plain_text)
from cll_scale.core.errors import run_guarded
from cll_scale.core.outputs import result_dir
from cll_scale.model.decode_config import DecodeConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-export", description=plain_text(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(p, "the model (its export/ directory)")
    p.add_argument("--hf", required=True, metavar="DIR", help="write a transformers directory here")
    # the search the directory's generate uses unless told otherwise
    add_config_arguments(p, DecodeConfig)
    add_debug_argument(p)
    return p


def export_cli(args) -> int:
    # imported after parsing: torch comes with it, and --help or a usage error needs none of it
    from cll_scale.model.export import ExportError, ExportInfo
    from cll_scale.model.hf_export import FILES, write_hf_export
    if not ExportInfo.exists(args.model):
        raise ExportError(f"--model {args.model}: not a cll-scale export (no export.json)")
    decode = config_from_args(DecodeConfig, args)
    with result_dir(args.hf, "cll-export", FILES, {"--model": args.model}, "--hf") as tmp:
        write_hf_export(args.model, tmp, decode)
    print(f"cll-export: wrote {args.hf}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_guarded("cll-export", lambda: export_cli(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())

"""What cll-bt's and cll-extend's command lines are made of: their settings (the fine-tuning
configs, one flag per setting) and the ``main`` both share. Apart from the loops themselves
(:mod:`cll_scale.loops.backtranslate`, :mod:`cll_scale.loops.extend`, which import torch), so that
``--help`` answers at once."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from cll_scale.core.cli import (MODEL_METAVAR, add_config_arguments, add_debug_argument, config_from_args,
                                export_dir, non_negative_int, print_tables)
from cll_scale.core.errors import run_guarded
from cll_scale.core.settings import REQUIRED, setting
from cll_scale.model.decode_config import DecodeConfig


@dataclass(kw_only=True)
class FineTuneSettings:
    """What cll-bt's and cll-extend's configs share: the training microbatch, the engine, and the
    before/after evaluation. The help texts are their flags (cll_scale.core.cli.add_config_arguments)."""

    batch_tokens: int = setting(4096, "padded tokens per training microbatch (data.batch_tokens)")
    ds_config: str = setting("auto", "DeepSpeed engine settings (ds_configs/*.json or auto)")
    eval_splits: list[str] = setting([], "comma-separated test splits of the before/after evaluation (default: "
                                     "every test split)")
    eval_max_sentences: int = setting(0, "evaluate only the first N of each direction (0: all)")
    eval_beam: int = setting(DecodeConfig.beam, "beam of the before/after evaluation")
    seed: int = setting(1, "seed of everything the command draws (sampling, noise, data order, training)",
                        type=non_negative_int)


@dataclass
class BTConfig(FineTuneSettings):
    # The help texts are cll-bt's flags (cll_scale.core.cli.add_config_arguments).
    model: str = setting(REQUIRED, "export to start from", type=export_dir, metavar=MODEL_METAVAR)
    data: str = setting(REQUIRED, "the shard directory the model was trained on (real pairs, valid and test sets)")
    out: str = setting(REQUIRED, "run directory (re-run the command to resume)")
    bt_langs: list[str] = setting([], "comma-separated pseudo-source languages (default: all); the paper uses the "
                                  "languages of the zero-shot test")
    epochs: int = setting(4, "back-translation epochs")
    beam: int = setting(1, "beam for generating pseudo sources (1: greedy, as online back-translation does)")
    max_rows: int = setting(0, "pairs per direction and epoch (0: every training pair)")
    chunk_rows: int = 2048              # unit of resumable generation work
    lr: float = setting(3e-4, "peak learning rate of each epoch's fine-tuning")
    warmup_steps: int = setting(500, "learning-rate warm-up steps")

    def __post_init__(self):
        for name in ("epochs", "beam", "chunk_rows", "batch_tokens", "eval_beam"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, not {getattr(self, name)}")
        for name in ("max_rows", "warmup_steps", "eval_max_sentences"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, not {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, not {self.lr}")


@dataclass
class ExtendConfig(FineTuneSettings):
    # The help texts are cll-extend's flags (cll_scale.core.cli.add_config_arguments).
    model: str = setting(REQUIRED, "export of the pre-trained model", type=export_dir, metavar=MODEL_METAVAR)
    data: str = setting(REQUIRED, "the shard directory it was trained on (old data, mixed into fine-tuning)")
    lang: str = setting(REQUIRED, "code of the new language")
    corpus: str = setting(REQUIRED, "multi-way directory with the new language's text (and dev/test sets)")
    pairs: list[str] = setting(REQUIRED, "supervised directions with the new language, e.g. en-cs,cs-en")
    out: str = setting(REQUIRED, "run directory (re-run the command to resume)")
    max_pairs: int = setting(5000, "training lines taken from the corpus")
    vocab_size: int = setting(2000, "pieces learned on the new language (before de-duplication)")
    keep_rows: int = 5000           # old-language sentences per direction that must split as before
    noise: float = 0.01             # std of the noise on new embedding rows, relative to the old rows'
    freeze: list[str] = setting([], "extra parameter globs to freeze, e.g. 'encoder.*,embed.weight'")
    max_steps: int = setting(2000, "fine-tuning steps")
    lr: float = setting(0.0, "constant peak learning rate (0: continue pre-training's schedule where it ended)")

    def __post_init__(self):
        for name in ("max_pairs", "vocab_size", "max_steps", "batch_tokens", "eval_beam"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, not {getattr(self, name)}")
        if self.eval_max_sentences < 0 or self.lr < 0:
            raise ValueError("--eval-max-sentences and --lr must be >= 0")


def build_parser(prog: str, description: str, config_cls) -> argparse.ArgumentParser:
    """A fine-tuning command's flags: one per field of its config, ``--restart``, ``--debug``, and
    the ``--local_rank`` that the ``deepspeed`` launcher passes."""
    p = argparse.ArgumentParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p, config_cls)
    p.add_argument("--restart", action="store_true", help="discard a previous run in --out and begin again")
    add_debug_argument(p)
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def command(prog: str, argv: list[str] | None, parser: argparse.ArgumentParser, config_cls, run) -> int:
    """The ``main`` of a fine-tuning command: build its config from ``argv``, run it (``--restart``),
    print the before/after tables on rank 0, and end any failure in one line (:func:`cll_scale.core.errors.run_guarded`)."""
    args = parser.parse_args(argv)

    def body() -> int:
        tables = run(config_from_args(config_cls, args), args.restart)
        if tables:       # rank 0
            print_tables(prog, argv, tables)
        return 0
    return run_guarded(prog, body, args.debug)

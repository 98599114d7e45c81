"""``cll-repro``'s command line: flags to a typed :class:`~cll_scale.repro.study.Study`."""
from __future__ import annotations

import argparse
import os

from cll_scale.core.cli import (add_alias, add_debug_argument, add_lsl_argument, non_negative_float,
                               non_negative_int, plain_text, positive_int, seed_list)
from cll_scale.core.errors import run_guarded
from cll_scale.core.resources import PACKAGE, shipped
from cll_scale.evaluation.scoring import add_lid_arguments
from cll_scale.model.decode_config import DecodeConfig
from cll_scale.repro import __doc__ as DOC
from cll_scale.repro.plan import CONDITIONS, SETTINGS
from cll_scale.training.precision import PRECISIONS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-repro", description=plain_text(DOC), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--condition", choices=CONDITIONS, required=True, help="the directions trained (paper §4.1)")
    p.add_argument("--variants", default="baseline,fcll",
                   help="comma-separated variants with a recipe: baseline, fcll, sd (the FFN residual of the "
                        "middle encoder layer removed, as the authors' code), sd_attn (its self-attention "
                        "residual removed, as Liu et al. 2021) (default: baseline,fcll)")
    p.add_argument("--settings", choices=SETTINGS, default="small",
                   help="small: the CPU-sized recipes; paper: the recipes that follow the authors' code; "
                        "paper_small: the authors' settings at the small size, the closest a CPU trains; "
                        "diagnostics: small models that each answer one question about the training rules; "
                        "quickstart: the diagnostics' triangle made to learn in fewer minutes (make quickstart) "
                        "(default: small)")
    p.add_argument("--seeds", type=seed_list,
                   help="e.g. 1,2,3: train every variant once per seed and report mean ± std over them")
    p.add_argument("--steps-per-model", type=non_negative_int, default=0,
                   help="step budget: every variant sees exactly the same batches (preferred)")
    p.add_argument("--minutes-per-model", type=non_negative_float, default=0.0,
                   help="time budget (default 90 when no step budget is given)")
    p.add_argument("--corpus", default=os.environ.get("MULTI30K", str(PACKAGE.parent.parent / "shared" / "data" / "multi30k")),
                   help="the Multi30k directory (default: $MULTI30K, else ../shared/data/multi30k)")
    add_alias(p, "--multi30k", "--corpus", dest="corpus")
    p.add_argument("--shards-root", default="runs/repro/shards", help="where the shards go (default: runs/repro/shards)")
    p.add_argument("--runs-root", default="runs/repro/runs", help="where the runs go (default: runs/repro/runs)")
    p.add_argument("--recipes", default=str(shipped("recipes")), help="the recipes' directory (default: the shipped ones)")
    p.add_argument("--out", default="runs/repro/results",
                   help="where the report goes (the project's own reports: --out docs/results) "
                        "(default: runs/repro/results)")
    p.add_argument("--splits", default="test_2016_flickr,test_2018_flickr",
                   help="comma-separated test splits (default: test_2016_flickr,test_2018_flickr)")
    p.add_argument("--beam", type=positive_int, default=DecodeConfig.beam, help=f"beam size (default: {DecodeConfig.beam})")
    p.add_argument("--max-sentences", type=non_negative_int, default=0,
                   help="evaluate only the first N per direction (0: all) (default: 0)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="recipe override for every model")
    p.add_argument("--parallel", type=positive_int, default=1,
                   help="models trained at once (a GPU holds several small ones), in the training order (default: 1)")
    p.add_argument("--eval-only", action="store_true", help="evaluate the existing exports, train nothing")
    p.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="what the models still to train train in (auto: each recipe's train.ds_config, whose auto "
                        "is bf16 on a GPU and on a CPU with avx512_bf16 or AMX, else fp32); bf16 continues a bf16 "
                        "study on any CPU (at about 0.9x fp32's speed without those instructions) (default: auto)")
    p.add_argument("--allow-mixed-precision", action="store_true",
                   help="train the models still missing even where this machine trains them in another "
                        "precision than the study's trained ones (refused by default)")
    add_lsl_argument(p, "also evaluate CLL models with their LSLs switched off (paper Tables 9-10)")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="also evaluate the models trained with language tags without the tag (paper Table 8)")
    p.add_argument("--cll-layers", metavar="SETS",
                   help="train each CLL variant once per set of decoder layers with CLL (numbered from 0, as "
                        "model.cll_layers: e.g. 0-2,1-2,2), or 'sweep': paper Fig. 4's sets (layers removed from the "
                        "bottom, then the top, down to one); the report <condition>-cll-layers.md has BLEU against them")
    add_lid_arguments(p)
    add_debug_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        from cll_scale.repro.study import reproduce, study_of     # torch comes with it: --help needs none
        return reproduce(study_of(args, argv))
    return run_guarded("cll-repro", body, args.debug)

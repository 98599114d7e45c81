"""``cll-demo``: Baseline and CLL models side by side on zero-shot directions (Gradio), and a
"Why this language?" view: per output token, how much the LSLs and the FFN raised or lowered it
(integrated gradients, paper Fig. 5).

    cll-demo --model baseline=runs/quickstart/runs/multi30k-triangle-quickstart-baseline/export-best \\
             --model fcll=runs/quickstart/runs/multi30k-triangle-quickstart-fcll/export-best \\
             --examples ../shared/data/multi30k --results runs/quickstart/results/triangle-quickstart

The page opens on the first zero-shot example already translated by every model, each output
with its detected language (green on target, red off target), and under it the model's zero-shot
off-target rate as measured by ``--results``: a ``cll-repro`` report directory (its cached
evaluations name the export they scored, so a model is matched by its export) or a ``cll-eval``
``--out`` directory or ``results.json`` (its entries are matched by the ``--model`` name);
"not measured" where none of them has the model.

Binds 127.0.0.1 unless ``--host`` says otherwise, never creates a share link, queues requests
with a concurrency limit, caps the input length with a visible message, and sets the
environment so that neither gradio nor its client contacts an outside host.
"""
from __future__ import annotations

import argparse
import sys

from cll_scale.core.cli import add_debug_argument, add_device_argument, add_model_argument, plain_text, positive_int
from cll_scale.core.errors import run_guarded

MAX_CHARS = 1000        # the longest input the page accepts, by default


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-demo", description=plain_text(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_argument(p, "a model to show (repeatable): its name heads its column", several=True)
    p.add_argument("--examples", help="multi-way test directory for example sentences (e.g. Multi30k); "
                                      "the page opens on the first one, translated")
    p.add_argument("--results", action="append", default=[], metavar="PATH",
                   help="where the models' zero-shot off-target rates were measured: a cll-repro report "
                        "directory (models found by their export) or a cll-eval --out directory or "
                        "results.json (found by their --model name); repeatable")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (0.0.0.0: every interface) (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=7860, help="TCP port, 1-65535 (default: 7860)")
    p.add_argument("--concurrency", type=positive_int, default=2,
                   help="requests translated at once; others queue (default: 2)")
    p.add_argument("--max-chars", type=positive_int, default=MAX_CHARS,
                   help=f"longest input accepted (default: {MAX_CHARS})")
    add_device_argument(p)
    add_debug_argument(p)
    return p


def port_number(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: a TCP port is 1-65535")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def serve() -> int:
        from demo.app import launch     # gradio and the models' code: not for --help
        launch(args)
        return 0
    return run_guarded("cll-demo", serve, args.debug)


if __name__ == "__main__":
    sys.exit(main())

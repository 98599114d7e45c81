"""Why validation and test disagree on zero-shot off-target, measured on one model.

Validation (cll-train's ``valid.decode_sentences``) decodes greedily the first N sentences of each
direction of the validation split and identifies languages among the model's own (restricted);
the reports decode every sentence of a test set with beam 4 and read langdetect as the paper does
(plain). This script evaluates one export on the zero-shot directions under both protocols and
the steps between them, so the gap splits into its parts, each the change of one thing:

    A  validation protocol: valid, greedy, first N, restricted LID
    B  ... plain LID                         (B - A: the language ID)
    C  ... every sentence                    (C - B: the sample)
    D  ... beam 4                            (D - C: the decoding)
    E  test protocol: the test split         (E - D: the split)

and, the other way round, the decoding measured on the test split as well (test greedy against
test beam 4). Every number comes from cll-eval's own results (cll_scale.evaluate), so the
definitions are the reports'.

    python scripts/protocol_gap.py --model runs/x/export-best --corpus ../shared/data/multi30k \\
        --out docs/results/protocol/x [--name NAME] [--sample 100] [--test test_2016_flickr] [--lid-workers 1]

The five evaluations go under --out (each kept: a rerun reads them again instead of decoding).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cll_scale import evaluate
from cll_scale.core.cli import add_alias
from cll_scale.data.manifest import Manifest
from cll_scale.evaluation.report import EvalReport

# (name, split, beam, first N: None for --sample, 0 for all): the five evaluations the chain reads
RUNS = (("valid-greedy-sample", "valid", 1, None), ("valid-greedy", "valid", 1, 0),
        ("valid-beam4", "valid", 4, 0), ("test-greedy", "test", 1, 0), ("test-beam4", "test", 4, 0))


def evaluate_once(model: Path, corpus: str, split: str, beam: int, sentences: int, directions: list[str],
                  out: Path, lid_workers: int) -> EvalReport:
    """One cll-eval run (kept when it was already made with these settings: its results.json)."""
    if not (out / "results.json").is_file():
        argv = ["--model", f"m={model}", "--corpus", corpus, "--split", split, "--beam", str(beam),
                "--max-sentences", str(sentences), "--directions", ",".join(directions), "--out", str(out),
                "--lid-workers", str(lid_workers)]
        if evaluate.main(argv) != 0:
            raise SystemExit(f"protocol_gap: cll-eval failed on {split}, beam {beam}")
    return EvalReport.load(out / "results.json")


def zero_shot_mean(report: EvalReport, metric: str) -> float:
    rows = [getattr(r, metric) for r in report.models["m"].directions]
    return sum(rows) / len(rows)


def chain(reports: dict[str, EvalReport]) -> list[tuple[str, str, float]]:
    """(step, what changed, zero-shot off-target %) from the validation protocol to the test's."""
    return [("A", "validation protocol: valid, greedy, first N, restricted LID",
             zero_shot_mean(reports["valid-greedy-sample"], "off_target_restricted")),
            ("B", "the language ID: plain langdetect", zero_shot_mean(reports["valid-greedy-sample"], "off_target")),
            ("C", "the sample: every sentence", zero_shot_mean(reports["valid-greedy"], "off_target")),
            ("D", "the decoding: beam 4", zero_shot_mean(reports["valid-beam4"], "off_target")),
            ("E", "the split: the test set (the test protocol)", zero_shot_mean(reports["test-beam4"], "off_target"))]


def markdown(name: str, test: str, sample: int, steps: list[tuple[str, str, float]],
             reports: dict[str, EvalReport]) -> str:
    gap = steps[-1][2] - steps[0][2]
    lines = [f"# Validation against test protocol: {name}", "",
             f"Zero-shot directions: {', '.join(r.direction for r in reports['test-beam4'].models['m'].directions)}; "
             f"validation decodes the first {sample} sentences of each, the test set `{test}` every sentence. "
             "Zero-shot off-target (mean over the directions), each step changing one thing:", "",
             "| step | what changes | zero-shot off-target | change | share of the gap |", "|---|---|---:|---:|---:|"]
    for (key, what, value), prev in zip(steps, [None] + steps[:-1]):
        change = "" if prev is None else f"{value - prev[2]:+.1f}"
        share = "" if prev is None or not gap else f"{(value - prev[2]) / gap:.0%}"
        lines.append(f"| {key} | {what} | {value:.1f}% | {change} | {share} |")
    greedy, beam = (zero_shot_mean(reports[k], "off_target") for k in ("test-greedy", "test-beam4"))
    lines += ["", f"The decoding measured on the test set as well: greedy {greedy:.1f}%, beam 4 {beam:.1f}% "
              f"({beam - greedy:+.1f}; on validation {steps[3][2] - steps[2][2]:+.1f}).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="an export directory")
    p.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"),
                   help="the Multi30k directory (default: ../shared/data/multi30k)")
    add_alias(p, "--multi30k", "--corpus", dest="corpus")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--name", help="what the report calls the model (default: the export's path)")
    p.add_argument("--sample", type=int, default=100, help="validation's decode_sentences (default 100)")
    p.add_argument("--test", default="test_2016_flickr")
    p.add_argument("--lid-workers", type=int, default=1)
    args = p.parse_args(argv)
    manifest = Manifest.load(args.model)
    zero_shot = [str(d) for d in manifest.zero_shot]
    if not zero_shot:
        p.error(f"{args.model} was trained with no zero-shot direction: nothing to compare")
    reports = {}
    for name, split, beam, first in RUNS:
        sentences = args.sample if first is None else first
        reports[name] = evaluate_once(args.model, args.corpus, args.test if split == "test" else split, beam,
                                      sentences, zero_shot, args.out / name, args.lid_workers)
    steps = chain(reports)
    (args.out / "protocol.json").write_text(json.dumps(
        {"model": args.name or str(args.model), "test": args.test, "sample": args.sample,
         "steps": [{"step": k, "what": w, "zero_shot_off_target": v} for k, w, v in steps]}, indent=1) + "\n")
    text = markdown(args.name or f"`{args.model}`", args.test, args.sample, steps, reports)
    (args.out / "protocol.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

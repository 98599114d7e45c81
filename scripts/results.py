"""Every experiment behind ``docs/results/``, in order, resumable: re-run the same command after
an interruption and each stage continues where it stopped (finished models are skipped).

    .venv/bin/python scripts/results.py                          # all stages
    .venv/bin/python scripts/results.py --stages triangle,centered
    .venv/bin/python scripts/results.py --root /big/disk/cll     # where shards, runs and reports go
    .venv/bin/python scripts/results.py --out docs/results       # the project's own reports

The reports go to ``<root>/reports`` unless ``--out`` names another folder: a short trial run
never writes over the committed ``docs/results`` by accident (as ``cll-repro --out``).

Stages (the budgets are the CPU ones we could afford; on a GPU raise them with the flags):

* ``triangle`` / ``centered`` — ``cll-repro``: Baseline and FCLL on Multi30k (paper §4.1), the
  same number of steps, seed and data order; writes ``<out>/<condition>.md``.
* ``backtranslation`` — ``cll-bt`` on the centered Baseline and FCLL models (paper §4.3); the
  before/after evaluations the runs write are merged into one table of the four models:
  ``<out>/backtranslation.md``.
* ``extension`` — Baseline, SD and FCLL pre-trained on en/de/fr (centered), each extended with cs
  from ``--ext-pairs`` en↔cs pairs by ``cll-extend`` (paper §4.4), tables merged the same way:
  ``<out>/extension.md``.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.evaluation.report import EvalReport, markdown  # noqa: E402
from cll_scale.evaluation.scoring import averages  # noqa: E402
from cll_scale.core.cli import add_alias  # noqa: E402
from cll_scale.core.outputs import write_atomic  # noqa: E402
from cll_scale.training.rundir import chosen_export  # noqa: E402
from cll_scale.core.hardware import hardware  # noqa: E402
from cll_scale.repro.plan import Budget  # noqa: E402
from cll_scale.repro.report import plot_links  # noqa: E402
from cll_scale.repro.scheduler import train  # noqa: E402
from cll_scale.run.build import frozen_names  # noqa: E402
from cll_scale.core.jsonfiles import read_json_object  # noqa: E402
from cll_scale.training.rundir import RunDir  # noqa: E402

PY = sys.executable


def sh(cmd: list[str]) -> None:
    print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def repro_command(args, condition: str) -> list[str]:
    return [PY, "-m", "cll_scale.repro", "--condition", condition, "--variants", args.variants,
            "--steps-per-model", str(args.steps), "--corpus", args.corpus, "--shards-root", str(args.root / "shards"),
            "--runs-root", str(args.root / "runs"), "--out", str(args.out), "--ablate-lsl"]


def evaluation(out: Path, split: str) -> EvalReport | None:
    """The report a cll-bt / cll-extend run wrote about itself (before and after); None if none yet."""
    path = out / "eval" / split / "results.json"
    return EvalReport.load(path) if path.exists() else None


def merged_table(parts: dict[str, EvalReport], rename: dict[str, str], out: Path, summary=None) -> list[str]:
    """One table from the runs' own evaluations: every model is decoded once, by the command that
    made it, on the same test set with the same beam. Its JSON and plots go to ``out``, a folder
    beside the markdown file that links them; ``summary(merged)``, when given, comes first."""
    report = None
    for variant, part in parts.items():
        report = report or replace(part, models={})
        if part.beam != report.beam:
            raise SystemExit(f"{variant}: evaluated with beam {part.beam}, the others with {report.beam}")
        for name, entry in part.models.items():
            report.models[f"{variant}{rename.get(name, ' ' + name)}"] = entry
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "results.json", json.dumps(report.to_json(), indent=1, ensure_ascii=False))
    return [*([summary(report)] if summary else []), markdown(report), *plot_links(report, out)]


def extension_summary(report: EvalReport, lang: str) -> str:
    """Paper §4.4 asks two things of an extension: does the new language work, supervised and
    zero-shot, and do the old directions keep their quality? The generic summary cannot say: its
    averages mix old and new directions for the extended models and not for the originals."""
    head = ["old supervised BLEU", "old zero-shot BLEU", "old zero-shot off-target", f"supervised with {lang} BLEU",
            f"zero-shot with {lang} BLEU", f"zero-shot with {lang} off-target"]
    lines = ["| model | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for name, entry in report.models.items():
        rows = entry.directions
        cells = []
        for new in (False, True):
            groups = averages([r for r in rows if (lang in r.direction.split("-")) == new], None)
            sup, zero = groups.get("supervised"), groups.get("zero-shot")
            cells += [f"{sup['bleu']:.2f}" if sup else "–", f"{zero['bleu']:.2f}" if zero else "–",
                      f"{zero['off_target']:.2f}%" if zero else "–"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def frozen_check(out: Path) -> str:
    """Paper §4.4 keeps the old languages' CLL parameters fixed: measured on the finished run, not
    assumed — the frozen tensors of the fine-tuned export against the grown model it started from."""
    from safetensors.torch import load_file
    start = load_file(out / "init-export" / "model.safetensors")
    tuned = load_file(chosen_export(out / "run") / "model.safetensors")
    patterns = RunDir(out / "run").config()["train"]["freeze"]
    frozen = frozen_names(list(start), patterns)
    if not frozen:
        return "nothing frozen (no LSLs)"
    same = sum(start[n].equal(tuned[n]) for n in frozen)
    moved = sum(not start[n].equal(tuned[n]) for n in start if n not in frozen)
    return f"{same} of {len(frozen)} frozen tensors bit-identical, {moved} of {len(start) - len(frozen)} others changed"


def backtranslation(args) -> None:
    shards = args.root / "shards" / "multi30k-centered"
    after = f"after {args.bt_epochs} BT epochs"
    parts = {}
    for variant in ("baseline", "fcll"):
        start = chosen_export(args.root / "runs" / f"multi30k-centered-{variant}")
        if not (start / "export.json").exists():
            sys.exit(f"backtranslation: run the 'centered' stage first ({start} missing)")
        out = args.root / "bt" / variant
        parts[variant] = evaluation(out, args.split)
        if parts[variant] is None or after not in parts[variant].models:   # finished runs are not re-evaluated
            sh([PY, "-m", "cll_scale.backtranslate", "--model", str(start), "--data", str(shards), "--out", str(out),
                "--bt-langs", "de,fr,cs", "--epochs", str(args.bt_epochs), "--max-rows", str(args.bt_rows),
                "--eval-splits", args.split])
            parts[variant] = evaluation(out, args.split)
    tables = merged_table(parts, {"before": "", after: " + BT"}, args.out / "backtranslation")
    write(args.out / "backtranslation.md", "Back-translation fine-tuning (paper §4.3) on Multi30k",
          [f"Starting points: the centered Baseline and FCLL models of `centered.md`. Each fine-tuned "
           f"{args.bt_epochs} back-translation epoch(s) (paper: 4): every epoch translates {args.bt_rows:,} "
           "target sentences per training direction into a random other language of de/fr/cs (greedy), "
           "then trains one epoch on real + pseudo pairs; fresh optimizer, 500 warm-up steps, peak LR 3e-4.",
           *tables])


def extension(args) -> None:
    shards = args.root / "shards" / "multi30k-en-de-fr"
    sh([PY, "-m", "data_tools", "build", "--reuse", "--corpus", args.corpus, "--condition", "centered",
        "--langs", "en,de,fr", "--out", str(shards)])
    budget = Budget(steps=args.ext_pretrain_steps)
    parts = {}
    for variant in ("baseline", "sd", "fcll"):
        run = args.root / "runs" / f"multi30k-en-de-fr-{variant}"
        train(ROOT / "recipes" / f"multi30k_centered_{variant}.yaml", run, shards, budget, [])
        out = args.root / "extend" / variant
        parts[variant] = evaluation(out, args.split)
        if not parts[variant]:
            sh([PY, "-m", "cll_scale.extend", "--model", str(chosen_export(run)), "--data", str(shards), "--lang", "cs",
                "--corpus", args.corpus, "--pairs", "en-cs,cs-en", "--max-pairs", str(args.ext_pairs),
                "--out", str(out), "--max-steps", str(args.ext_steps), "--eval-splits", args.split])
            parts[variant] = evaluation(out, args.split)
    tables = merged_table(parts, {"original": "", "+cs": " + cs"}, args.out / "extension",
                          lambda merged: extension_summary(merged, "cs"))
    # every variant grows the same vocabulary (same SentencePiece model, same cs text)
    vocab = read_json_object(args.root / "extend" / next(iter(parts)) / "spm_extension.json")
    checks = "; ".join(f"{v}: {frozen_check(args.root / 'extend' / v)}" for v in parts)
    write(args.out / "extension.md", "New-language extension (paper §4.4) on Multi30k",
          [f"Pre-training: en/de/fr centered, `small` preset, {args.ext_pretrain_steps:,} steps per model. "
           f"Extension: cs from the first {args.ext_pairs:,} en↔cs training pairs (en-cs and cs-en supervised; "
           f"de/fr↔cs zero-shot), {args.ext_steps:,} fine-tuning steps on new + old data, the old languages' "
           "LSLs and t frozen, continuing pre-training's learning-rate schedule. The original models appear "
           "for the old directions only. The first table averages the old directions (en/de/fr) apart from "
           "those with cs; off-target is the paper's (plain langdetect).",
           f"Vocabulary {vocab['old_size']:,} → {vocab['new_size']:,}: {vocab['added']:,} cs pieces and the cs tag "
           f"appended ({len(vocab['dropped'])} candidate pieces left out because they would change how old-language "
           f"text splits). Frozen parameters after fine-tuning — {checks}.",
           *tables])


def write(path: Path, title: str, parts: list[str]) -> None:
    command = "python scripts/results.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    text = [f"# {title}", f"Command: `{command}`", f"Hardware: {hardware()}.", *parts]
    write_atomic(path, "\n\n".join(text) + "\n")
    print(f"wrote {path}", file=sys.stderr)


STAGES = ("triangle", "centered", "backtranslation", "extension")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--root", type=Path, default=ROOT / "runs" / "results")
    p.add_argument("--out", type=Path,
                   help="where the reports go (default: <root>/reports; the project's own reports: --out docs/results)")
    p.add_argument("--corpus", default=str(ROOT.parent / "shared" / "data" / "multi30k"), help="the Multi30k directory")
    add_alias(p, "--multi30k", "--corpus", dest="corpus")
    p.add_argument("--variants", default="baseline,fcll", help="for the triangle and centered stages")
    p.add_argument("--steps", type=int, default=4200, help="training steps per model (triangle, centered)")
    p.add_argument("--split", default="test_2016_flickr", help="test set of the BT and extension tables")
    p.add_argument("--bt-epochs", type=int, default=2)
    p.add_argument("--bt-rows", type=int, default=3000)
    p.add_argument("--ext-pretrain-steps", type=int, default=2000)
    p.add_argument("--ext-pairs", type=int, default=5000)
    p.add_argument("--ext-steps", type=int, default=1000)
    args = p.parse_args(argv)
    # cll-repro runs from the project root: both are made absolute from here
    args.root = args.root.resolve()
    args.out = (args.out or args.root / "reports").resolve()
    unknown = [name for name in args.stages.split(",") if name not in STAGES]
    if unknown:                       # before the first stage runs, not after it
        p.error(f"unknown stage {unknown[0]!r}; stages: {', '.join(STAGES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stages = {"triangle": lambda: sh(repro_command(args, "triangle")),
              "centered": lambda: sh(repro_command(args, "centered")),
              "backtranslation": lambda: backtranslation(args), "extension": lambda: extension(args)}
    for name in args.stages.split(","):
        print(f"== {name}", file=sys.stderr, flush=True)
        stages[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How far do langdetect and lingua agree on a model's outputs? Reads the hypotheses files that
``cll-eval`` and ``cll-repro`` write (``hyps/<model>/<setting>/<src>-<tgt>.txt``), decodes
nothing, and reports per model and setting: the share of outputs both identifiers label alike
(langdetect restricted to the languages, and plain), each one's off-target rate, and a few
sentences they disagree on, so a reader can judge which to trust on short captions.

    .venv/bin/python scripts/lid_agreement.py --hyps runs/repro/results/triangle/hyps/test_2016_flickr \\
        --langs de,fr,cs --out docs/results/lid_agreement_triangle_2016.md
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cll_scale.core.cli import csv_list  # noqa: E402
from cll_scale.evaluation.langid import Lingua, detect  # noqa: E402
from cll_scale.data.languages import Direction  # noqa: E402
from cll_scale.core.outputs import write_atomic  # noqa: E402


def agreement(files: list[Path], languages: list[str], examples: int = 3) -> dict:
    """Both identifiers over every line of ``files`` (one direction each, named ``src-tgt.txt``)."""
    lingua = Lingua(languages)
    counts: Counter = Counter()
    disagree: list[dict] = []
    for path in files:
        tgt = Direction.parse(path.stem).tgt
        hyps = [h for h in path.read_text(encoding="utf-8").split("\n")[:-1]]
        ling = lingua.detect_many(hyps)
        for hyp, second in zip(hyps, ling):
            restricted, plain = detect(hyp, languages), detect(hyp)
            counts["n"] += 1
            counts["agree_restricted"] += restricted == second
            counts["agree_plain"] += plain == second
            counts["off_langdetect_restricted"] += restricted != tgt
            counts["off_langdetect_plain"] += plain != tgt
            counts["off_lingua"] += second != tgt
            if restricted != second:
                counts["disagree"] += 1
                # Mixed output: lingua finds runs of two or more languages in the line.
                counts["disagree_mixed"] += len({lang for lang, _ in lingua.spans(hyp)}) > 1
                if len(disagree) < examples and hyp.strip():
                    disagree.append({"direction": path.stem, "hyp": hyp, "langdetect": restricted, "lingua": second})
    n = max(counts["n"], 1)
    return {"sentences": counts["n"], **{k: 100.0 * v / n for k, v in counts.items() if k not in ("n", "disagree", "disagree_mixed")},
            "disagree_mixed": 100.0 * counts["disagree_mixed"] / max(1, counts["disagree"]),
            "disagreements": disagree}


def report(root: Path, languages: list[str], examples: int) -> str:
    """One row per ``<model>/<setting>`` under ``root``, then the disagreeing sentences."""
    rows, samples = [], []
    for setting_dir in sorted(p for p in root.glob("*/*") if p.is_dir()):
        files = sorted(setting_dir.glob("*.txt"))
        if not files:
            continue
        r = agreement(files, languages, examples)
        name = f"{setting_dir.parent.name} ({setting_dir.name})"
        rows.append(f"| {name} | {r['sentences']:,} | {r['agree_restricted']:.1f}% | {r['agree_plain']:.1f}% "
                    f"| {r['off_langdetect_plain']:.1f}% | {r['off_langdetect_restricted']:.1f}% "
                    f"| {r['off_lingua']:.1f}% | {r['disagree_mixed']:.1f}% |")
        samples += [f"| {name} | {d['direction']} | {d['hyp'].replace('|', '/')} | {d['langdetect']} "
                    f"| {d['lingua']} |" for d in r["disagreements"]]
    if not rows:
        raise SystemExit(f"{root}: no hypotheses files (<model>/<setting>/<src>-<tgt>.txt)")
    lines = [f"Hypotheses: `{root}`; languages {', '.join(languages)} (both identifiers restricted to them, "
             "langdetect also plain).", "",
             "| model (setting) | outputs | agree, langdetect restricted | agree, langdetect plain "
             "| off-target langdetect plain | off-target langdetect restricted | off-target lingua "
             "| disagreements lingua splits into 2+ languages |",
             "|---|---:|---:|---:|---:|---:|---:|---:|", *rows, "",
             "| model (setting) | direction | output | langdetect (restricted) | lingua |", "|---|---|---|---|---|",
             *samples]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hyps", required=True, help="a hyps/ directory: <model>/<setting>/<src>-<tgt>.txt")
    p.add_argument("--langs", required=True, type=csv_list, help="the models' languages, e.g. en,de,fr,cs")
    p.add_argument("--examples", type=int, default=3, help="disagreeing sentences shown per model and setting")
    p.add_argument("--out", help="also write the markdown here")
    args = p.parse_args(argv)
    text = report(Path(args.hyps), args.langs, args.examples)
    if args.out:
        write_atomic(Path(args.out), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

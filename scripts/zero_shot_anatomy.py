"""Where in a zero-shot output does the language go wrong? A diagnostic behind docs/results.

A whole-sentence language detector gives one label per output; an undertrained or collapsing
model often *starts* in the requested language (the tag and, for CLL, the LSL steer the first
tokens) and then continues in the language it was trained to produce from that source. This
script labels the first and the last third of every zero-shot output separately (language ID
restricted to the model's languages) and reports, per direction:

* ``target → target`` — on target throughout, and the BLEU of just these outputs (is the right
  language also a translation?);
* ``target → other`` — starts on target, switches;
* ``other → target`` — starts elsewhere, ends on target;
* ``other → other`` — off target throughout.

    .venv/bin/python scripts/zero_shot_anatomy.py --model baseline=runs/b/export \\
        --model fcll=runs/f/export --data data/shards/multi30k-triangle --max-sentences 300
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import sacrebleu
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cll_scale.model.decode_config import DecodeConfig  # noqa: E402
from cll_scale.core.cli import parse_models  # noqa: E402
from cll_scale.evaluation.testsets import pairs_from_shards  # noqa: E402
from cll_scale.evaluation.langid import detect  # noqa: E402
from cll_scale.evaluation.translator import TranslateConfig, Translator  # noqa: E402

KINDS = ("target → target", "target → other", "other → target", "other → other")


def anatomy(hyps: list[str], refs: list[str], tgt: str, languages: list[str]) -> dict:
    counts, kept = Counter(), []
    for hyp, ref in zip(hyps, refs):
        words = hyp.split()
        k = max(1, len(words) // 3)
        head = detect(" ".join(words[:k]), languages) == tgt
        tail = detect(" ".join(words[-k:]), languages) == tgt
        counts[KINDS[(not head) * 2 + (not tail)]] += 1
        if head and tail:
            kept.append((hyp, ref))
    bleu = sacrebleu.corpus_bleu([h for h, _ in kept], [[r for _, r in kept]]).score if kept else float("nan")
    return {"n": len(hyps), **{k: counts[k] for k in KINDS}, "bleu_on_target": bleu}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="NAME=EXPORT_DIR (repeatable)")
    p.add_argument("--data", required=True, help="shard directory whose manifest names the zero-shot directions")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--max-sentences", type=int, default=300)
    p.add_argument("--beam", type=int, default=DecodeConfig.beam)
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pairs = pairs_from_shards(args.data, args.split)
    print(f"Zero-shot outputs of `{args.split}` (first {args.max_sentences} per direction, beam {args.beam}), "
          "first vs last third of each output, language ID restricted to the model's languages.\n")
    print("| model | direction | " + " | ".join(KINDS) + " | BLEU of target → target |")
    print("|---|---|" + "---:|" * (len(KINDS) + 1))
    for name, export in parse_models(args.model).items():
        tr = Translator.load(export, device, TranslateConfig(DecodeConfig(beam=args.beam)))
        for direction in sorted(d for d in tr.manifest.zero_shot if d in pairs):
            srcs, refs = (x[:args.max_sentences] for x in pairs[direction])
            tgt = direction.split("-")[1]
            row = anatomy(tr.translate(srcs, tgt), refs, tgt, tr.manifest.languages)
            print(f"| {name} | {direction} | " + " | ".join(f"{row[k] / row['n']:.0%}" for k in KINDS)
                  + f" | {row['bleu_on_target']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

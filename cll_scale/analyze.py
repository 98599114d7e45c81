"""``cll-analyze``: the paper's §5 analyses of exported models (:mod:`cll_scale.analysis`).

    # Fig. 5: which component pushed each output token, per decoder layer (Captum integrated gradients)
    cll-analyze attribution --model runs/f/export --data data/shards/multi30k-triangle \\
        --split test_2016_flickr --direction fr-de --sentences 30 --out analysis/attribution-fr-de
    # Fig. 3: encoder self-attention and cross-attention of one sentence, tag kept and omitted
    cll-analyze attention --model fcll=runs/f/export --model notag=runs/n/export --omit-lang-tag \\
        --data data/shards/multi30k-centered --split test_2016_flickr --direction de-fr --out analysis/attention

Sentences come from a shard directory's dev/test split (``--data``/``--split``/``--direction``,
the first ``--sentences``) or from ``--text`` (repeatable) with ``--tgt-lang``. The target side is
the model's own translation (beam ``--beam``), or the reference with ``--reference``.

attribution writes ``analysis.json`` (the summary: per token class, the share of (token, layer)
pairs where the LSL's and the FFN's attributions have opposite signs, each component's mean
absolute attribution, the largest convergence delta), ``analysis.md``, ``sentences.json`` (every
value) and ``heatmap-<i>.png`` for the first ``--heatmaps`` sentences. attention writes
``analysis.json`` (the weights, and the share the tag receives), ``encoder.png`` and ``cross.png``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cll_scale.analysis import (COMPONENTS, attention_maps, attribute, language_pieces, prepare, summarize,
                                tag_share)
from cll_scale.cli import add_debug_argument, echo_command, parse_models, pick_device, positive_int, run
from cll_scale.decoding import DecodeConfig
from cll_scale.evaluate import pairs_from_shards
from cll_scale.languages import Direction
from cll_scale.outputs import OutputError, check_apart, check_owner, json_text, write_atomic
from cll_scale.translate import TranslateConfig, Translator

PROG = "cll-analyze"


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="a shard directory: its --split gives the sentences (and, for attribution, "
                                  "each language's pieces)")
    p.add_argument("--split", default="test_2016_flickr", help="a dev/test split of --data")
    p.add_argument("--direction", help="src-tgt, e.g. fr-de: a direction of --split")
    p.add_argument("--text", action="append", help="a source sentence (repeatable), instead of --direction")
    p.add_argument("--tgt-lang", help="the target language of --text")
    p.add_argument("--reference", action="store_true",
                   help="teacher-force the references of --direction instead of the model's own translations")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="leave the language tag out of the input (paper Table 8; attention: add this case)")
    p.add_argument("--beam", type=positive_int, default=DecodeConfig.beam, help="beam of the model's own translations")
    p.add_argument("--out", required=True, help="the output directory")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    add_debug_argument(p)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="analysis", required=True)
    a = sub.add_parser("attribution", help="layer attribution of the FFN and LSL components (paper Fig. 5)")
    a.add_argument("--model", required=True, help="an export/ directory")
    a.add_argument("--sentences", type=positive_int, default=20, help="the first N sentences of --direction")
    a.add_argument("--steps", type=positive_int, default=32, help="integration steps (Gauss-Legendre)")
    a.add_argument("--heatmaps", type=int, default=3, help="heat maps for the first N sentences")
    add_input_arguments(a)
    b = sub.add_parser("attention", help="attention maps of one sentence (paper Fig. 3)")
    b.add_argument("--model", action="append", required=True, metavar="[NAME=]EXPORT_DIR",
                   help="repeatable: each model is a row of the figures")
    b.add_argument("--index", type=int, default=0, help="which sentence of --direction (0: the first)")
    add_input_arguments(b)
    return p


def sentences(args, limit: int) -> list[tuple[str, str, str | None]]:
    """(source, target language, reference or None), from --text or --data/--direction."""
    if args.text:
        if not args.tgt_lang:
            raise ValueError("--text needs --tgt-lang")
        if args.reference:
            raise ValueError("--reference needs --direction (a --text has no reference)")
        return [(t, args.tgt_lang, None) for t in args.text[:limit]]
    if not (args.data and args.direction):
        raise ValueError("give --data and --direction (or --text with --tgt-lang)")
    pairs = pairs_from_shards(args.data, args.split)
    if args.direction not in pairs:
        raise ValueError(f"{args.data}: split {args.split} has no direction {args.direction} "
                         f"(it has {', '.join(sorted(pairs))})")
    srcs, refs = pairs[args.direction]
    tgt = Direction.parse(args.direction).tgt
    return [(s, tgt, r if args.reference else None) for s, r in zip(srcs[:limit], refs[:limit])]


def open_out(args, models: dict[str, str]) -> Path:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} is a file; give a directory")
    check_owner(out, PROG)
    check_apart(out, {"--data": args.data, **{f"--model {n}": p for n, p in models.items()}})
    return out


def load(path: str, args) -> Translator:
    return Translator.load(path, pick_device(args.device), TranslateConfig(DecodeConfig(beam=args.beam), dtype="fp32"))


def summary_markdown(summary: dict, command: str) -> str:
    lines = [f"`{command}`", "",
             f"{summary['sentences']} sentences; largest convergence delta {summary['max_abs_delta']:.2e} "
             f"(all deltas {100 * summary['relative_delta']:.2f}% of all effects, in absolute value)", "",
             "| tokens | count | (token, layer) pairs with an LSL | LSL and FFN of opposite sign | "
             + " | ".join(f"mean abs {c}" for c in COMPONENTS) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(COMPONENTS)]
    for name, row in summary["classes"].items():
        share = row["opposite_sign_share"]
        cells = [f"{row[f'mean_abs_{c}']:.3f}" if row[f"mean_abs_{c}"] is not None else "–" for c in COMPONENTS]
        lines.append(f"| {name} | {row['tokens']} | {row['pairs_with_lsl']} | "
                     f"{'–' if share is None else f'{100 * share:.1f}%'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def attribution_cli(args, command: str) -> int:
    from cll_scale.plots import plot_attribution
    out = open_out(args, {"model": args.model})
    todo = sentences(args, args.sentences)
    translator = load(args.model, args)
    if not translator.model.cfg.cll_layers:
        print(f"{PROG}: {args.model} has no CLL layer: only the FFN's components are attributed", file=sys.stderr)
    texts: dict[str, list[str]] = {}
    if args.data:
        for direction, (srcs, refs) in pairs_from_shards(args.data, args.split).items():
            src, tgt = Direction.parse(direction)
            texts.setdefault(src, []).extend(srcs)
            texts.setdefault(tgt, []).extend(refs)
    pieces = language_pieces(translator, {lang: sorted(set(t)) for lang, t in texts.items()})
    results = []
    for i, (src, tgt, ref) in enumerate(todo):
        ex = prepare(translator, src, tgt, ref, args.omit_lang_tag)
        results.append(attribute(translator.model, ex, args.steps))
        print(f"[{PROG}] {i + 1}/{len(todo)}: max |delta| {results[-1].max_abs_delta():.2e}  {ex.tgt_text[:60]}",
              file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.to_json() for r in results]
    for i, row in enumerate(rows[:max(args.heatmaps, 0)]):
        plot_attribution(row, out / f"heatmap-{i}.png")
    summary = {"command": command, "model": args.model, "steps": args.steps, **summarize(results, pieces),
               "classes_defined": "symbol: punctuation, digits or symbols only, and </s>; shared: a word piece "
                                  "that another language's text of the split uses too; specific: the rest"}
    write_atomic(out / "sentences.json", json_text(rows, indent=1, ensure_ascii=False))
    table = summary_markdown(summary, command)
    write_atomic(out / "analysis.md", table)
    write_atomic(out / "analysis.json", json_text(summary, indent=1, ensure_ascii=False))
    print(table)
    return 0


def attention_cli(args, command: str) -> int:
    from cll_scale.plots import plot_attention
    models = parse_models(args.model)
    out = open_out(args, models)
    if args.index < 0:
        raise ValueError(f"--index must be >= 0, not {args.index}")
    todo = sentences(args, args.index + 1)
    if len(todo) <= args.index:
        raise ValueError(f"--index {args.index}: the direction has {len(todo)} sentences")
    src, tgt, ref = todo[args.index]
    cases: dict[str, dict] = {}
    for name, path in models.items():
        translator = load(path, args)
        settings = [(name, False)] + ([(f"{name} (tag omitted)", True)] if args.omit_lang_tag and translator.lang_tag
                                      else [])
        for case, omit in settings:
            ex = prepare(translator, src, tgt, ref, omit)
            maps = attention_maps(translator.model, ex)
            cases[case] = {"src_pieces": ex.src_pieces, "tgt_pieces": ex.tgt_pieces, "tgt_text": ex.tgt_text,
                           "lang_tag": ex.lang_tag,
                           # the mean over heads: the figures; per head in the JSON
                           **{kind: [w.mean(0).tolist() for w in per_layer] for kind, per_layer in maps.items()},
                           "heads": {kind: [w.tolist() for w in per_layer] for kind, per_layer in maps.items()},
                           "tag_share": [tag_share(w) for w in maps["encoder"]] if ex.lang_tag else None}
    out.mkdir(parents=True, exist_ok=True)
    for kind in ("encoder", "cross"):
        plot_attention(cases, kind, out / f"{kind}.png")
    write_atomic(out / "analysis.json", json_text({"command": command, "src_text": src, "tgt_lang": tgt,
                                                   "cases": cases}, ensure_ascii=False))
    for case, c in cases.items():
        share = "no tag" if c["tag_share"] is None else \
            "tag share per encoder layer " + ", ".join(f"{100 * x:.1f}%" for x in c["tag_share"])
        print(f"{case}: {share}; output: {c['tgt_text']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = echo_command(PROG, argv).strip("`")
    body = attribution_cli if args.analysis == "attribution" else attention_cli
    torch.set_grad_enabled(True)
    return run(PROG, lambda: body(args, command), args.debug)


if __name__ == "__main__":
    sys.exit(main())

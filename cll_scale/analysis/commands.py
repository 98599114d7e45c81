"""What ``cll-analyze`` does once its flags are read (the command, :mod:`cll_scale.analyze`, only
parses them): the sentences chosen, checked against the memory they need, the models loaded, and
the attribution or attention analysis written into ``--out``."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from cll_scale.analysis.attribution import (COMPONENTS, MEMORY_SHARE, MemoryBudget, attention_maps, attribute,
                                            language_pieces, longest_target, max_steps, prepare, quadrature_bytes,
                                            size_text, step_bytes, summarize, tag_share)
from cll_scale.core.cli import parse_models, pick_device
from cll_scale.core.outputs import json_text, result_dir, write_atomic
from cll_scale.data.languages import Direction
from cll_scale.data.manifest import Manifest
from cll_scale.evaluation.plots import plot_attention, plot_attribution
from cll_scale.evaluation.testsets import pairs_from_shards
from cll_scale.evaluation.translator import TranslateConfig, Translator
from cll_scale.model.decode_config import DecodeConfig

PROG = "cll-analyze"
# What either analysis writes into --out; one replaces the other's directory as a whole.
WRITES = ("analysis.json", "analysis.md", "sentences.json", "heatmap-*.png", "encoder.png", "cross.png")


def check_sentence_flags(args) -> None:
    """Before any work: the sentences come from --data's --direction or from --text with
    --tgt-lang, never both, and no flag given is left unused."""
    if args.text:
        if args.direction:
            raise ValueError(f"--direction {args.direction} and --text both choose the sentences; give --data with "
                             f"--direction, or --text with --tgt-lang")
        if not args.tgt_lang:
            raise ValueError("--text needs --tgt-lang")
        if args.reference:
            raise ValueError("--reference needs --direction (a --text has no reference)")
        return
    if not (args.data and args.direction):
        raise ValueError("give --data and --direction (or --text with --tgt-lang)")
    tgt = Direction.parse(args.direction).tgt
    if args.tgt_lang and args.tgt_lang != tgt:
        raise ValueError(f"--tgt-lang {args.tgt_lang} disagrees with --direction {args.direction}, whose target is "
                         f"{tgt}; --tgt-lang goes with --text")


def data_manifest(args) -> Manifest | None:
    """The --data manifest, read once by the command and handed to every reader of the shards."""
    return Manifest.load(args.data) if args.data else None


def sentences(args, limit: int, manifest: Manifest | None) -> list[tuple[str, str, str | None]]:
    """(source, target language, reference or None), from --text or --data/--direction (the flags
    checked by :func:`check_sentence_flags`; ``manifest``: --data's)."""
    if args.text:
        return [(t, args.tgt_lang, None) for t in args.text[:limit]]
    pairs = pairs_from_shards(args.data, args.split, manifest)
    if args.direction not in pairs:
        raise ValueError(f"{args.data}: split {args.split} has no direction {args.direction} "
                         f"(it has {', '.join(sorted(pairs))})")
    srcs, refs = pairs[args.direction]
    tgt = Direction.parse(args.direction).tgt
    return [(s, tgt, r if args.reference else None) for s, r in zip(srcs[:limit], refs[:limit])]


def index_range(args, n: int) -> str:
    """What ``--index`` may be when the sentences number ``n``, in words."""
    where = "--text gives" if args.text else f"the direction {args.direction} of split {args.split} has"
    if n == 0:
        return f"{where} no sentence"
    return f"{where} {n} sentence{'s' if n > 1 else ''}; --index must be " + ("0" if n == 1 else f"0 to {n - 1}")


def open_out(args, models: dict[str, str]):
    """--out, owned as every result directory is (:func:`cll_scale.core.outputs.result_dir`): checked,
    locked and proven writable before any work, replaced as a whole at the end."""
    return result_dir(args.out, PROG, WRITES, {"--data": args.data, **{f"--model {n}": p for n, p in models.items()}})


def check_steps(steps: int, budget: MemoryBudget) -> None:
    """--steps against the memory of its quadrature (:func:`cll_scale.analysis.attribution.quadrature_bytes`),
    before anything is loaded."""
    if quadrature_bytes(steps) > budget.host:
        raise ValueError(f"--steps {steps} needs {size_text(quadrature_bytes(steps))} for the integration's "
                         f"quadrature alone, more than the {size_text(budget.host)} {PROG} allows itself "
                         f"({MEMORY_SHARE:.0%} of the memory available); --steps at most {max_steps(budget.host)} "
                         f"fits")


def check_lengths(translator: Translator, examples: list, args, budget: MemoryBudget) -> None:
    """Each sentence's target against the memory of one integration step
    (:func:`cll_scale.analysis.attribution.step_bytes`), before the first attribution: the steps are taken
    as many at a time as fit, but one step of a long sentence may not fit at all."""
    cfg = translator.model.cfg
    for i, ex in enumerate(examples):
        s, t = ex.src_tokens.shape[1], ex.target.shape[1]
        need = step_bytes(cfg, s, t)
        if need <= budget.device:
            continue
        which = f"--text {i + 1}" if args.text else f"sentence {i + 1} of --direction {args.direction}"
        target = "the reference" if args.reference else "the model's translation"
        raise ValueError(f"{which}: {target} has {t} tokens, and one integration step of them needs {size_text(need)}, "
                         f"more than the {size_text(budget.device)} {PROG} allows itself ({MEMORY_SHARE:.0%} of the "
                         f"memory available); the longest target that fits is {longest_target(cfg, s, budget.device)} "
                         f"tokens: give a shorter sentence" + (f", or stop before it (--sentences {i})" if i else ""))


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
    check_sentence_flags(args)
    device = pick_device(args.device)
    budget = MemoryBudget.now(device)
    check_steps(args.steps, budget)
    manifest = data_manifest(args)
    with open_out(args, {"model": args.model}) as out:
        return attribute_into(out, args, command, budget, manifest)


def attribute_into(out: Path, args, command: str, budget: MemoryBudget, manifest: Manifest | None) -> int:
    todo = sentences(args, args.sentences, manifest)
    translator = load(args.model, args)
    if not translator.model.cfg.cll_layers:
        print(f"{PROG}: {args.model} has no CLL layer: only the FFN's components are attributed", file=sys.stderr)
    texts: dict[str, list[str]] = {}
    if args.data:
        for direction, (srcs, refs) in pairs_from_shards(args.data, args.split, manifest).items():
            src, tgt = Direction.parse(direction)
            texts.setdefault(src, []).extend(srcs)
            texts.setdefault(tgt, []).extend(refs)
    pieces = language_pieces(translator, {lang: sorted(set(t)) for lang, t in texts.items()})
    examples = [prepare(translator, src, tgt, ref, args.omit_lang_tag) for src, tgt, ref in todo]
    check_lengths(translator, examples, args, budget)
    results = []
    for i, ex in enumerate(examples):
        results.append(attribute(translator.model, ex, args.steps, budget=budget))
        print(f"[{PROG}] {i + 1}/{len(todo)}: max |delta| {results[-1].max_abs_delta():.2e}  {ex.tgt_text[:60]}",
              file=sys.stderr)
    rows = [r.to_json() for r in results]
    for i, row in enumerate(rows[:args.heatmaps]):
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
    check_sentence_flags(args)
    models = parse_models(args.model)
    manifest = data_manifest(args)
    with open_out(args, models) as out:
        return attention_into(out, args, command, models, manifest)


def attention_into(out: Path, args, command: str, models: dict[str, str], manifest: Manifest | None) -> int:
    todo = sentences(args, args.index + 1, manifest)
    if len(todo) <= args.index:
        raise ValueError(f"--index {args.index}: {index_range(args, len(todo))}")
    src, tgt, ref = todo[args.index]
    translators = {name: load(path, args) for name, path in models.items()}
    if args.omit_lang_tag:
        Translator.check_tags_to_omit({name: tr.lang_tag for name, tr in translators.items()})
    cases: dict[str, dict] = {}
    for name, translator in translators.items():
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
    for kind in ("encoder", "cross"):
        plot_attention(cases, kind, out / f"{kind}.png")
    write_atomic(out / "analysis.json", json_text({"command": command, "src_text": src, "tgt_lang": tgt,
                                                   "cases": cases}, ensure_ascii=False))
    for case, c in cases.items():
        share = "no tag" if c["tag_share"] is None else \
            "tag share per encoder layer " + ", ".join(f"{100 * x:.1f}%" for x in c["tag_share"])
        print(f"{case}: {share}; output: {c['tgt_text']}")
    return 0


def analyze(args, command: str) -> int:
    """The analysis ``args.analysis`` names (attribution or attention), gradients on."""
    torch.set_grad_enabled(True)
    return (attribution_cli if args.analysis == "attribution" else attention_cli)(args, command)

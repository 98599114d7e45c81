"""``cll-eval``: BLEU, chrF and off-target rates per direction, for one or more exported models.

    cll-eval --model baseline=runs/b/export --model fcll=runs/f/export \\
             --data data/shards/multi30k-centered --split test_2016_flickr --out results/t2016
    cll-eval --model fcll=runs/f/export --corpus ../shared/data/multi30k --split test_2018_flickr --out r
    cll-eval --model fcll=runs/f/export --corpus opus-100-corpus --split test --ablate-lsl --out r

Per direction: sacreBLEU on detokenised text (signature printed), chrF, the off-target rate with
langdetect as in the paper (``plain``) and restricted to the model's languages (``restricted``),
the share of outputs whose first half is in another language (code-switching), which languages
off-target outputs are in, and the share in the language the source was *supervised* to translate
into (the "rollback" of paper Table 10). Averages for en→xx, xx→en, supervised and zero-shot.
Writes ``results.json``, ``results.md`` (paper Tables 2-3 layout), ``bleu_offtarget.png`` and
``t_weights.png`` (paper Fig. 6).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import sacrebleu

from cll_scale.cli import add_debug_argument, non_negative_int, parse_models, pick_device, positive_int, run
from cll_scale.decoding import DecodeConfig
from cll_scale.langid import detect
from cll_scale.manifest import Manifest
from cll_scale.outputs import OutputError, write_atomic
from cll_scale.translate import TranslateConfig, Translator


@dataclass
class DirectionResult:
    direction: str
    kind: str                     # supervised / zero-shot / unseen (by the model's training data)
    n: int
    bleu: float
    chrf: float
    off_target: float             # % not in the target language, plain langdetect (the paper's)
    off_target_restricted: float  # % with the decision restricted to the model's languages
    code_switch: float            # % on-target as a whole whose first half is in another language
    rollback: float               # % in a language this source is supervised to translate into
    off_languages: dict[str, int] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)


def _pct(k: int, n: int) -> float:
    return 100.0 * k / n if n else 0.0


def score_direction(direction: str, kind: str, hyps: list[str], refs: list[str], srcs: list[str],
                    languages: list[str], supervised: list[str], tokenize: str = "13a"
                    ) -> tuple[DirectionResult, str]:
    src, tgt = direction.split("-")
    bleu_metric = sacrebleu.BLEU(tokenize="zh" if tgt == "zh" else tokenize)
    bleu = bleu_metric.corpus_score(hyps, [refs])
    chrf = sacrebleu.CHRF().corpus_score(hyps, [refs])
    plain = [detect(h) for h in hyps]
    restricted = [detect(h, languages) for h in hyps]
    first_half = [detect(" ".join(h.split()[: max(1, len(h.split()) // 2)]), languages) for h in hyps]
    # Table 10's rollback: the output is in a language this source was trained to translate into.
    rollback_targets = {d.split("-")[1] for d in supervised if d.split("-")[0] == src} - {tgt}
    n = len(hyps)
    off = Counter(x or "none" for x in restricted if x != tgt)
    res = DirectionResult(
        direction, kind, n, bleu.score, chrf.score,
        off_target=_pct(sum(x != tgt for x in plain), n),
        off_target_restricted=_pct(sum(x != tgt for x in restricted), n),
        # Judged on-target as a whole, but the first half is in another language.
        code_switch=_pct(sum(w == tgt and f is not None and f != tgt for w, f in zip(restricted, first_half)), n),
        rollback=_pct(sum(x in rollback_targets for x in restricted), n),
        off_languages=dict(off.most_common()),
        samples=[{"src": s, "hyp": h, "ref": r, "lang": d} for s, h, r, d in list(zip(srcs, hyps, refs, restricted))[:3]])
    return res, str(bleu_metric.get_signature())   # the signature exists only after scoring


# -- test data ---------------------------------------------------------------------------------

def pairs_from_shards(shard_dir: str | Path, split: str) -> dict[str, tuple[list[str], list[str]]]:
    m = Manifest.load(shard_dir)
    if split not in m.splits:
        raise ValueError(f"{shard_dir}: no split {split!r} (has {', '.join(m.splits)})")
    out: dict[str, tuple[list[str], list[str]]] = {}
    for shard in m.splits[split].shards:
        table = pa.ipc.open_file(pa.OSFile(str(Path(shard_dir) / shard.file))).read_all()
        if "src_text" not in table.column_names:
            raise ValueError(f"{shard.file}: a training shard has no raw text; evaluate a dev/test split")
        srcs, refs = out.setdefault(shard.direction, ([], []))
        srcs += table.column("src_text").to_pylist()
        refs += table.column("tgt_text").to_pylist()
    return out


def pairs_from_corpus(path: str, split: str, languages: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Raw test text straight from a corpus (multi-way ``{split}.{lang}`` or OPUS-100 layout)."""
    from data_tools.sources import canonical_split, detect_format, read_multiway, read_opus100, split_names
    fmt = detect_format(path)
    if fmt == "multiway":
        # valid / val / dev name one split: take whichever the corpus has files for.
        split = next((n for n in split_names(split) if any((Path(path) / f"{n}.{x}").exists() for x in languages)),
                     split)
        langs = [x for x in languages if (Path(path) / f"{split}.{x}").exists()]
        if not langs:
            have = sorted({f.name.rsplit(".", 1)[0] for f in Path(path).iterdir() if f.is_file() and "." in f.name})
            raise ValueError(f"{path}: no split {split!r} for languages {', '.join(languages)} (no file "
                             f"{split}.<lang>); splits there: {', '.join(have) or 'none'}")
        every = ",".join(f"{a}-{b}" for a in langs for b in langs if a != b)
        corpus = read_multiway(path, every, langs=langs)
    elif fmt == "opus100":
        corpus = read_opus100(path, langs=languages)
    else:
        raise ValueError(f"{path}: evaluate {fmt} data through its shards (--data)")
    out: dict[str, tuple[list[str], list[str]]] = {}
    for s in corpus.splits:
        if s.name not in (split, canonical_split(split)):
            continue
        texts = {x: [] for x in s.langs}
        for _, chunk in s.read_chunks(8192):
            for x, lines in chunk.items():
                texts[x] += lines
        for d in s.directions:
            keep = [i for i, (a, b) in enumerate(zip(texts[d.src], texts[d.tgt])) if a and b]
            out[str(d)] = ([texts[d.src][i] for i in keep], [texts[d.tgt][i] for i in keep])
    if not out:
        raise ValueError(f"{path}: no split {split!r} for languages {', '.join(languages)}")
    return out


# -- evaluation ----------------------------------------------------------------------------------

def evaluate_model(translator: Translator, pairs: dict[str, tuple[list[str], list[str]]],
                   directions: list[str] | None = None, use_lsl: bool = True, max_sentences: int = 0,
                   log=print) -> dict:
    """Score every direction of ``pairs`` (or of ``directions``) that the model can translate; the
    others are listed under ``skipped`` with the reason, and logged, never dropped in silence."""
    if max_sentences < 0:
        raise ValueError(f"max_sentences must be >= 0 (0: all), not {max_sentences}")
    m = translator.manifest
    results, signature, skipped = [], None, {}
    for direction in sorted(pairs):
        if directions and direction not in directions:
            continue
        src_lang, tgt_lang = direction.split("-")
        missing = [x for x in (src_lang, tgt_lang) if x not in m.languages]
        if missing:
            skipped[direction] = f"the model has no {' and no '.join(missing)}"
            log(f"  {direction:<6} skipped: {skipped[direction]}")
            continue
        srcs, refs = pairs[direction]
        if max_sentences:
            srcs, refs = srcs[:max_sentences], refs[:max_sentences]
        hyps = translator.translate(srcs, tgt_lang, use_lsl=use_lsl)
        kind = "supervised" if direction in m.supervised else "zero-shot" if direction in m.zero_shot else "unseen"
        res, signature = score_direction(direction, kind, hyps, refs, srcs, m.languages, m.supervised)
        results.append(res)
        log(f"  {direction:<6} {kind:<10} BLEU {res.bleu:5.2f}  chrF {res.chrf:5.2f}  off-target "
            f"{res.off_target:5.1f}% (restricted {res.off_target_restricted:5.1f}%)")
    return {"directions": [asdict(r) for r in results], "averages": averages(results, m.central_language),
            "skipped": skipped, "bleu_signature": signature, "use_lsl": use_lsl,
            "t_weights": translator.model.t_weights(),
            "cll_layers": sorted(i + 1 for i in translator.model.cfg.cll_layers)}   # 1-based, as in the paper


def averages(results: list[DirectionResult], central: str | None) -> dict[str, dict[str, float]]:
    groups: dict[str, list[DirectionResult]] = {"supervised": [], "zero-shot": []}
    for r in results:
        if r.kind in groups:
            groups[r.kind].append(r)
        if central and r.kind == "supervised":
            key = f"{central}→xx" if r.direction.startswith(central + "-") else f"xx→{central}"
            groups.setdefault(key, []).append(r)
    out = {}
    for name, rows in groups.items():
        if rows:
            out[name] = {k: sum(getattr(r, k) for r in rows) / len(rows)
                         for k in ("bleu", "chrf", "off_target", "off_target_restricted", "code_switch", "rollback")}
    return out


def markdown(report: dict) -> str:
    """Summary in the layout of the paper's Tables 2-3, then every direction."""
    models = report["models"]
    key = "common_averages" if "common_directions" in report else "averages"
    cols = []
    for r in models.values():
        cols += [c for c in ("en→xx", "xx→en", "supervised", "zero-shot") if c in r[key] and c not in cols]
    for r in models.values():
        cols += [c for c in r[key] if c not in cols]
    lines = [f"Test set: `{report['test_set']}`; beam {report['beam']}; {report['bleu_signature']}", ""]
    if key == "common_averages":
        lines += [f"The models were scored on different directions; the averages below cover only the "
                  f"{len(report['common_directions'])} every model was scored on: "
                  f"{', '.join(report['common_directions'])}.", ""]
    lines += ["| model | " + " | ".join(f"{c} BLEU" for c in cols) + " | zero-shot off-target (paper / restricted) | zero-shot code-switch |",
              "|---|" + "---:|" * (len(cols) + 2)]
    for name, r in models.items():
        a = r[key]
        z = a.get("zero-shot", {})
        off = f"{z['off_target']:.2f}% / {z['off_target_restricted']:.2f}%" if z else "–"
        cs = f"{z['code_switch']:.2f}%" if z else "–"
        lines.append(f"| {name} | " + " | ".join(f"{a[c]['bleu']:.2f}" if c in a else "–" for c in cols)
                     + f" | {off} | {cs} |")
    lines += ["", "| model | direction | kind | BLEU | chrF | off-target (paper) | off-target (restricted) "
              "| code-switch | in supervised target | off-target languages |", "|---|---|---|" + "---:|" * 6 + "---|"]
    for name, r in models.items():
        for d in r["directions"]:
            langs = ", ".join(f"{k} {v}" for k, v in d["off_languages"].items()) or "–"
            lines.append(f"| {name} | {d['direction']} | {d['kind']} | {d['bleu']:.2f} | {d['chrf']:.2f} | "
                         f"{d['off_target']:.1f}% | {d['off_target_restricted']:.1f}% | {d['code_switch']:.1f}% | "
                         f"{d['rollback']:.1f}% | {langs} |")
    skipped = [f"{name}: {d} ({why})" for name, r in models.items() for d, why in r.get("skipped", {}).items()]
    if skipped:
        lines += ["", "Not scored: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def select_directions(pairs: dict, directions: list[str] | None, where: str) -> list[str] | None:
    """``--directions`` checked against what the test set has: an unknown one or an empty
    selection is an error, not an empty report."""
    if directions is None:
        if not pairs:
            raise ValueError(f"{where}: no direction to evaluate")
        return None
    directions = [d for d in directions if d]
    unknown = [d for d in directions if d not in pairs]
    if unknown or not directions:
        raise ValueError(f"{where}: no direction {', '.join(unknown) or '(empty list)'} "
                         f"(it has {', '.join(sorted(pairs)) or 'none'})")
    return directions


def compare(translators: dict[str, Translator], pairs: dict[str, tuple[list[str], list[str]]], test_set: str,
            beam: int, directions: list[str] | None = None, max_sentences: int = 0, ablate_lsl: bool = False,
            log=print) -> dict:
    """Evaluate several models on the same pairs: the report behind every table of the project.
    When the models were not all scored on the same directions, each model's ``common_averages``
    averages only the directions every model was scored on (``common_directions``), so that the
    summary compares like with like."""
    directions = select_directions(pairs, directions, test_set)
    report = {"test_set": test_set, "beam": beam, "models": {}}
    central = {}                     # report entry -> the central language of its model
    for name, tr in translators.items():
        log(f"{name}:")
        report["models"][name] = evaluate_model(tr, pairs, directions, True, max_sentences, log=log)
        central[name] = tr.manifest.central_language
        if ablate_lsl and tr.model.cfg.cll_layers:
            log(f"{name} without LSL:")
            report["models"][f"{name} (LSL off)"] = evaluate_model(tr, pairs, directions, False, max_sentences,
                                                                    log=log)
            central[f"{name} (LSL off)"] = tr.manifest.central_language
    scored = [{d["direction"] for d in r["directions"]} for r in report["models"].values()]
    if not any(scored):
        raise ValueError(f"{test_set}: no model could be scored on any direction "
                         f"(skipped: {next(iter(report['models'].values()))['skipped']})")
    common = set.intersection(*scored)
    if any(s != common for s in scored):
        report["common_directions"] = sorted(common)
        for name, r in report["models"].items():
            rows = [DirectionResult(**d) for d in r["directions"] if d["direction"] in common]
            r["common_averages"] = averages(rows, central[name])
        log(f"the models were scored on different directions: the summary averages only the "
            f"{len(common)} they share ({', '.join(sorted(common)) or 'none'})")
    report["bleu_signature"] = next((r["bleu_signature"] for r in report["models"].values()
                                     if r["bleu_signature"]), "")
    return report


def write_report(report: dict, out: str | Path) -> str:
    """results.json, results.md and the two plots into ``out``; returns the markdown."""
    from cll_scale.plots import plot_bleu_offtarget, plot_t_weights
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "results.json", json.dumps(report, indent=1, ensure_ascii=False))
    table = markdown(report)
    write_atomic(out / "results.md", table)
    plot_bleu_offtarget(report, out / "bleu_offtarget.png")
    plot_t_weights(report, out / "t_weights.png")
    return table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, metavar="NAME=EXPORT_DIR")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="a shard directory; its --split dev/test shards carry the raw text")
    src.add_argument("--corpus", help="a multi-way or OPUS-100 corpus directory")
    p.add_argument("--split", default="test", help="e.g. test_2016_flickr, valid, test")
    p.add_argument("--directions", help="comma-separated subset, e.g. de-fr,fr-de")
    p.add_argument("--out", required=True, help="directory for results.json / results.md / PNGs")
    p.add_argument("--beam", type=positive_int, default=4)
    p.add_argument("--max-sentences", type=non_negative_int, default=0,
                   help="evaluate only the first N of each direction (0: all)")
    p.add_argument("--ablate-lsl", action="store_true", help="also evaluate with the LSLs switched off (Tables 9-10)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    add_debug_argument(p)
    return p


def evaluate_cli(args) -> int:
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise OutputError(f"--out {args.out} is a file; give a directory for results.json, results.md and the plots")
    models = parse_models(args.model)
    device = pick_device(args.device)
    cfg = TranslateConfig(DecodeConfig(beam=args.beam))
    translators = {name: Translator.load(path, device, cfg) for name, path in models.items()}
    languages = sorted({x for t in translators.values() for x in t.languages})
    pairs = pairs_from_shards(args.data, args.split) if args.data else pairs_from_corpus(args.corpus, args.split, languages)
    directions = [d.strip() for d in args.directions.split(",")] if args.directions is not None else None
    report = compare(translators, pairs, f"{args.data or args.corpus}:{args.split}", args.beam, directions,
                     args.max_sentences, args.ablate_lsl, log=lambda s: print(s, file=sys.stderr))
    print(write_report(report, args.out))
    print(f"BLEU signature: {report['bleu_signature']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run("cll-eval", lambda: evaluate_cli(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())

"""``cll-eval``: BLEU, chrF and off-target rates per direction, for one or more exported models.

    cll-eval --model baseline=runs/b/export --model fcll=runs/f/export \\
             --data data/shards/multi30k-centered --split test_2016_flickr --out results/t2016
    cll-eval --model fcll=runs/f/export --corpus ../shared/data/multi30k --split test_2018_flickr --out r
    cll-eval --model fcll=runs/f/export --corpus opus-100-corpus --split test --ablate-lsl --out r

Per direction: sacreBLEU on detokenised text (signature printed), chrF, the off-target rate with
langdetect as in the paper (``plain``) and restricted to the model's languages (``restricted``),
code-switching, the off-target languages and the "rollback" of paper Table 10
(:mod:`cll_scale.evaluation.scoring`); with ``--lid langdetect,lingua`` also lingua's off-target rate and
code-switch share. Averages for en→xx, xx→en, supervised and zero-shot. Writes ``results.json``
(with sentences/s and where the time went: decoding, language ID, scoring), ``results.md`` (paper
Tables 2-3 layout), ``bleu_offtarget.png``, ``t_weights.png`` (paper Fig. 6) and every hypothesis,
``hyps/<model>/<setting>/<direction>.txt`` (setting ``default``, ``lsl-off`` or ``tag-omitted``), so that outputs
can be rescored or compared without decoding again. ``--out`` is locked while cll-eval runs and replaced as a
whole when it ends, so no hypotheses of an earlier evaluation's models stay beside the new ones; a directory that
holds anything else is refused, before any model is loaded.

Each test set is decoded once per model and setting. Scoring and language identification run in
a small process pool (``--lid-workers``) while the next direction decodes.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from cll_scale.core.cli import (add_debug_argument, add_lid_arguments, non_negative_int, parse_models, pick_device,
                           positive_int, run)
from cll_scale.model.decoding import DecodeConfig
from cll_scale.data.languages import Direction
from cll_scale.data.manifest import Manifest
from cll_scale.core.outputs import json_text, result_dir, write_atomic
from cll_scale.evaluation.scoring import DirectionResult, ScoreJob, averages, score_job
from cll_scale.translate import TranslateConfig, Translator


# -- test data ---------------------------------------------------------------------------------

def pairs_from_shards(shard_dir: str | Path, split: str) -> dict[str, tuple[list[str], list[str]]]:
    m = Manifest.load(shard_dir)
    if split not in m.splits:
        raise ValueError(f"{shard_dir}: no split {split!r} (has {', '.join(m.splits)})")
    out: dict[str, tuple[list[str], list[str]]] = {}
    for direction in m.splits[split].directions():
        table = m.read_direction(shard_dir, split, direction)
        if "src_text" not in table.column_names:
            raise ValueError(f"{shard_dir}: split {split!r} is a training split without raw text; evaluate a "
                             f"dev/test split")
        out[direction] = (table.column("src_text").to_pylist(), table.column("tgt_text").to_pylist())
    return out


def pairs_from_corpus(path: str, split: str, languages: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Raw test text straight from a corpus (multi-way ``{split}.{lang}`` or OPUS-100 layout)."""
    from cll_scale.data.corpora import canonical_split, detect_format, read_multiway, read_opus100, split_names
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

def _worker_init() -> None:
    """Ctrl-C reaches every process of the terminal's group: the command stops the pool and says
    "interrupted" once, so a worker ignores SIGINT instead of printing its own traceback. The worker
    was started with SIGINT blocked (``_ScoringPool.submit``), so a Ctrl-C during its start-up waits
    pending until here, where ignoring it discards it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _ScoringPool(ProcessPoolExecutor):
    """A spawned worker spends seconds starting Python and importing torch before its initializer
    runs; a Ctrl-C then would kill it with a traceback of its own. ``submit`` starts the workers, so
    it runs with SIGINT blocked (the mask is per thread, so any thread may call it): the child
    inherits the mask through fork and exec, and the calling thread's own Ctrl-C is delivered as
    soon as the mask is restored, so nothing is lost."""

    def submit(self, fn, /, *args, **kwargs):
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return super().submit(fn, *args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def lid_pool(workers: int | None = None) -> Iterator[Executor | None]:
    """The process pool that scores while the next direction decodes (None: score inline), one
    per command: a spawned worker imports the command's main module (torch with it), so it is
    started once, on the first job, and serves every model and test set. Workers are started fresh
    ("spawn"), not forked: a fork copies the parent's thread pools (torch's, lingua's) without their
    threads, and a child that touches one hangs."""
    workers = max(1, min(16, (os.cpu_count() or 2) - 1)) if workers is None else workers
    if workers <= 0:
        yield None
        return
    pool = _ScoringPool(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


def file_name(name: str) -> str:
    """A model name as a file or directory name (hypotheses, cached evaluations)."""
    return re.sub(r"[^\w.+-]+", "_", name).strip("_") or "model"


def check_file_names(names: Iterable[str]) -> None:
    """Two model names that become one folder (``m ü`` and ``m_ü``) would write one model's
    hypotheses over the other's: refused, naming both."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(file_name(name), name)
        if other != name:
            raise ValueError(f"--model names {other!r} and {name!r} both become the folder "
                             f"{file_name(name)!r}; give them names that differ in letters or digits")


# The entries beside a model as trained: its LSLs switched off (paper Tables 9-10), its
# language tag omitted at test time (Table 8).
LSL_OFF, TAG_OMITTED = " (LSL off)", " (tag omitted)"


@dataclass
class Evaluation:
    """What :func:`score_model` measured: one result per direction scored, why the others were
    skipped, and how it scored them. ``mean`` is what a caller reads (the validator);
    :func:`evaluate_model` turns it into the JSON report."""
    results: list[DirectionResult]
    skipped: dict[str, str]
    signature: str | None
    timing: dict[str, float]
    use_lsl: bool
    lid: tuple[str, ...]
    omit_tag: bool

    def mean(self, kind: str, metric: str) -> float | None:
        """The mean of ``metric`` (a :class:`DirectionResult` field) over the directions of
        ``kind`` (supervised, zero-shot); None when there are none or a value is missing."""
        values = [getattr(r, metric) for r in self.results if r.kind == kind]
        return sum(values) / len(values) if values and None not in values else None


def evaluate_model(translator: Translator, pairs: dict[str, tuple[list[str], list[str]]], *args, **kwargs) -> dict:
    """:func:`score_model` (same arguments) as the JSON report cll-eval writes."""
    ev = score_model(translator, pairs, *args, **kwargs)
    return {"directions": [asdict(r) for r in ev.results],
            "averages": averages(ev.results, translator.manifest.central_language),
            "skipped": ev.skipped, "bleu_signature": ev.signature, "use_lsl": ev.use_lsl,
            "lang_tag": translator.lang_tag and not ev.omit_tag, "lid": list(ev.lid),
            "timing": ev.timing, "t_weights": translator.model.t_weights(),
            "cll_layers": sorted(i + 1 for i in translator.model.cfg.cll_layers)}   # 1-based, as in the paper


def score_model(translator: Translator, pairs: dict[str, tuple[list[str], list[str]]],
                directions: list[str] | None = None, use_lsl: bool = True, max_sentences: int = 0,
                log=print, lid: tuple[str, ...] = ("langdetect",), pool: Executor | None = None,
                hyps_dir: Path | None = None, name: str = "", omit_tag: bool = False) -> Evaluation:
    """Score every direction of ``pairs`` (or of ``directions``) that the model can translate; the
    others are listed under ``skipped`` with the reason, and logged, never dropped in silence.
    Each direction's scoring goes to ``pool`` (inline without one) while the next one decodes;
    ``hyps_dir`` gets one file of hypotheses per direction."""
    if max_sentences < 0:
        raise ValueError(f"max_sentences must be >= 0 (0: all), not {max_sentences}")
    m = translator.manifest
    start = time.perf_counter()
    jobs, skipped, decode_s, sentences = [], {}, 0.0, 0
    for direction in sorted(pairs):
        if directions and direction not in directions:
            continue
        src_lang, tgt_lang = Direction.parse(direction)
        missing = [x for x in (src_lang, tgt_lang) if x not in m.languages]
        if missing:
            skipped[direction] = f"the model has no {' and no '.join(missing)}"
            log(f"  {direction:<6} skipped: {skipped[direction]}")
            continue
        srcs, refs = pairs[direction]
        if max_sentences:
            srcs, refs = srcs[:max_sentences], refs[:max_sentences]
        t0 = time.perf_counter()
        with tqdm(total=len(srcs), desc=f"{name} {direction}".strip(), unit="sent", leave=False,
                  disable=None, file=sys.stderr) as bar:
            hyps = translator.translate(srcs, tgt_lang, use_lsl=use_lsl, progress=bar.update, omit_tag=omit_tag)
        decode_s += time.perf_counter() - t0
        sentences += len(srcs)
        if hyps_dir is not None:
            write_atomic(hyps_dir / f"{direction}.txt", "".join(h.replace("\n", " ") + "\n" for h in hyps))
        job = ScoreJob(direction, m.kind(direction), hyps, refs, srcs, m.languages, m.supervised, lid=tuple(lid))
        jobs.append(pool.submit(score_job, job) if pool else score_job(job))
    results, signature, lid_s, scoring_s = [], None, 0.0, 0.0
    for job in jobs:
        row, signature, seconds = job.result() if pool else job
        res = DirectionResult(**row)
        results.append(res)
        lid_s, scoring_s = lid_s + seconds["lid_s"], scoring_s + seconds["scoring_s"]
        extra = f", lingua {res.lingua_off_target:5.1f}%" if res.lingua_off_target is not None else ""
        log(f"  {res.direction:<6} {res.kind:<10} BLEU {res.bleu:5.2f}  chrF {res.chrf:5.2f}  off-target "
            f"{res.off_target:5.1f}% (restricted {res.off_target_restricted:5.1f}%{extra})")
    wall = time.perf_counter() - start
    # lid_s and scoring_s are worker time: with a pool they overlap decoding, so the wall time is
    # less than the sum.
    timing = {"sentences": sentences, "wall_s": wall, "decode_s": decode_s, "lid_s": lid_s, "scoring_s": scoring_s,
              "sentences_per_s": sentences / wall if wall else 0.0,
              "decode_sentences_per_s": sentences / decode_s if decode_s else 0.0}
    return Evaluation(results, skipped, signature, timing, use_lsl, tuple(lid), omit_tag)


def markdown(report: dict) -> str:
    """Summary in the layout of the paper's Tables 2-3, then every direction; lingua's columns
    when it was asked for, and each model's decoding speed."""
    models = report["models"]
    key = "common_averages" if "common_directions" in report else "averages"
    lingua = "lingua" in report.get("lid", [])
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
    extra = " zero-shot off-target (lingua) | zero-shot code-switch (lingua) |" if lingua else ""
    lines += ["| model | " + " | ".join(f"{c} BLEU" for c in cols)
              + " | zero-shot off-target (paper / restricted) | zero-shot code-switch |" + extra,
              "|---|" + "---:|" * (len(cols) + 2 + 2 * lingua)]

    def pct(d: dict, k: str) -> str:
        return f"{d[k]:.2f}%" if d.get(k) is not None else "–"
    for name, r in models.items():
        a = r[key]
        z = a.get("zero-shot", {})
        off = f"{z['off_target']:.2f}% / {z['off_target_restricted']:.2f}%" if z else "–"
        lines.append(f"| {name} | " + " | ".join(f"{a[c]['bleu']:.2f}" if c in a else "–" for c in cols)
                     + f" | {off} | {pct(z, 'code_switch')} |"
                     + (f" {pct(z, 'lingua_off_target')} | {pct(z, 'lingua_code_switch')} |" if lingua else ""))
    lines += ["", "| model | direction | kind | BLEU | chrF | off-target (paper) | off-target (restricted) "
              "| code-switch | in supervised target |" + (" off-target (lingua) |" if lingua else "")
              + " off-target languages |", "|---|---|---|" + "---:|" * (6 + lingua) + "---|"]
    for name, r in models.items():
        for d in r["directions"]:
            langs = ", ".join(f"{k} {v}" for k, v in d["off_languages"].items()) or "–"
            lines.append(f"| {name} | {d['direction']} | {d['kind']} | {d['bleu']:.2f} | {d['chrf']:.2f} | "
                         f"{d['off_target']:.1f}% | {d['off_target_restricted']:.1f}% | {d['code_switch']:.1f}% | "
                         f"{d['rollback']:.1f}% |" + (f" {pct(d, 'lingua_off_target')} |" if lingua else "")
                         + f" {langs} |")
    skipped = [f"{name}: {d} ({why})" for name, r in models.items() for d, why in r.get("skipped", {}).items()]
    if skipped:
        lines += ["", "Not scored: " + "; ".join(skipped) + "."]
    timed = [(name, r["timing"]) for name, r in models.items() if r.get("timing")]
    if timed:
        lines += ["", "Time per model: " + "; ".join(
            f"{name} {t['sentences']:,} sentences in {t['wall_s']:.1f} s ({t['sentences_per_s']:.1f}/s; decoding "
            f"{t['decode_s']:.1f} s, language ID {t['lid_s']:.1f} s and scoring {t['scoring_s']:.1f} s of worker time)"
            for name, t in timed) + "."]
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
            log=print, lid: tuple[str, ...] = ("langdetect",), pool: Executor | None = None,
            hyps_out: str | Path | None = None, omit_lang_tag: bool = False) -> dict:
    """Evaluate several models on the same pairs: the report behind every table of the project.
    Scoring goes to ``pool`` (:func:`lid_pool`; inline without one); ``hyps_out`` gets
    ``<model>/<setting>/<direction>.txt``. See :func:`summarize` for the cross-model part."""
    directions = select_directions(pairs, directions, test_set)
    check_file_names(translators)
    entries: dict[str, dict] = {}
    for name, tr in translators.items():
        entries.update(evaluate_entries(tr, name, pairs, directions, max_sentences, ablate_lsl, log, lid, pool,
                                        hyps_out, omit_lang_tag))
    return summarize(entries, test_set, beam, lid, log)


def evaluate_entries(translator: Translator, name: str, pairs: dict[str, tuple[list[str], list[str]]],
                     directions: list[str] | None, max_sentences: int = 0, ablate_lsl: bool = False, log=print,
                     lid: tuple[str, ...] = ("langdetect",), pool: Executor | None = None,
                     hyps_out: str | Path | None = None, omit_lang_tag: bool = False) -> dict[str, dict]:
    """One model's report entries: ``name``; ``name (LSL off)`` with ``ablate_lsl`` where the
    model has LSLs (paper Tables 9-10); ``name (tag omitted)`` with ``omit_lang_tag`` where the
    model was trained with language tags (Table 8). Each entry records its model's central
    language (for :func:`summarize`)."""
    settings = [(name, True, False, "default")]
    if ablate_lsl and translator.model.cfg.cll_layers:
        settings.append((name + LSL_OFF, False, False, "lsl-off"))
    if omit_lang_tag and translator.lang_tag:
        settings.append((name + TAG_OMITTED, True, True, "tag-omitted"))
    elif omit_lang_tag:
        log(f"{name}: trained without language tags, so no 'tag omitted' entry")
    entries = {}
    for entry, use_lsl, omit_tag, setting in settings:
        log(f"{entry}:")
        hyps_dir = Path(hyps_out) / file_name(name) / setting if hyps_out else None
        entries[entry] = evaluate_model(translator, pairs, directions, use_lsl, max_sentences, log=log,
                                        lid=lid, pool=pool, hyps_dir=hyps_dir, name=entry, omit_tag=omit_tag)
        entries[entry]["central_language"] = translator.manifest.central_language
    return entries


def summarize(entries: dict[str, dict], test_set: str, beam: int, lid: tuple[str, ...] = ("langdetect",),
              log=print) -> dict:
    """The report of several models' entries. When the models were not all scored on the same
    directions, each model's ``common_averages`` averages only the directions every model was
    scored on (``common_directions``), so that the summary compares like with like."""
    report = {"test_set": test_set, "beam": beam, "lid": list(lid), "models": dict(entries)}
    if not entries:
        raise ValueError(f"{test_set}: no model to report")
    scored = [{d["direction"] for d in r["directions"]} for r in entries.values()]
    if not any(scored):
        raise ValueError(f"{test_set}: no model could be scored on any direction "
                         f"(skipped: {next(iter(entries.values()))['skipped']})")
    common = set.intersection(*scored)
    if any(s != common for s in scored):
        report["common_directions"] = sorted(common)
        for r in entries.values():
            rows = [DirectionResult(**d) for d in r["directions"] if d["direction"] in common]
            r["common_averages"] = averages(rows, r["central_language"])
        log(f"the models were scored on different directions: the summary averages only the "
            f"{len(common)} they share ({', '.join(sorted(common)) or 'none'})")
    report["bleu_signature"] = next((r["bleu_signature"] for r in entries.values() if r["bleu_signature"]), "")
    return report


def write_report(report: dict, out: str | Path) -> str:
    """results.json, results.md and the two plots into ``out``; returns the markdown."""
    from cll_scale.evaluation.plots import plot_bleu_offtarget, plot_t_weights
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "results.json", json_text(report, indent=1, ensure_ascii=False))
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
    p.add_argument("--beam", type=positive_int, default=DecodeConfig.beam)
    p.add_argument("--max-sentences", type=non_negative_int, default=0,
                   help="evaluate only the first N of each direction (0: all)")
    p.add_argument("--ablate-lsl", action="store_true", help="also evaluate with the LSLs switched off (Tables 9-10)")
    p.add_argument("--omit-lang-tag", action="store_true",
                   help="also evaluate the models trained with language tags without the tag (Table 8); "
                        "refused when no model given was trained with tags")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (CUDA when present)")
    add_lid_arguments(p)
    add_debug_argument(p)
    return p


# What cll-eval writes into --out, which it replaces as a whole: the hypotheses of the models of
# an earlier evaluation never stay beside a new one's.
WRITES = ("results.json", "results.md", "bleu_offtarget.png", "t_weights.png", "hyps")


def evaluate_cli(args) -> int:
    models = parse_models(args.model)
    check_file_names(models)
    device = pick_device(args.device)
    inputs = {"--data": args.data, "--corpus": args.corpus,
              **{f"--model {name}": path for name, path in models.items()}}
    with result_dir(args.out, "cll-eval", WRITES, inputs) as out:
        cfg = TranslateConfig(DecodeConfig(beam=args.beam))
        translators = {name: Translator.load(path, device, cfg) for name, path in models.items()}
        if args.omit_lang_tag:
            Translator.check_tags_to_omit({name: t.lang_tag for name, t in translators.items()})
        languages = sorted({x for t in translators.values() for x in t.languages})
        pairs = (pairs_from_shards(args.data, args.split) if args.data
                 else pairs_from_corpus(args.corpus, args.split, languages))
        directions = [d.strip() for d in args.directions.split(",")] if args.directions is not None else None
        with lid_pool(args.lid_workers) as pool:
            report = compare(translators, pairs, f"{args.data or args.corpus}:{args.split}", args.beam, directions,
                             args.max_sentences, args.ablate_lsl, log=lambda s: print(s, file=sys.stderr),
                             lid=args.lid, pool=pool, hyps_out=out / "hyps", omit_lang_tag=args.omit_lang_tag)
        table = write_report(report, out)
    print(table)
    print(f"BLEU signature: {report['bleu_signature']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run("cll-eval", lambda: evaluate_cli(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())

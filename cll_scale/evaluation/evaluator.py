"""Evaluating models: each direction decoded by a :class:`Translator` and scored (BLEU, chrF,
off-target) in the scoring pool while the next decodes; one model's entries (as trained, LSL off,
tag omitted), and several models compared on the same test set."""
from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from cll_scale.core.outputs import write_atomic
from cll_scale.data.languages import Direction
from cll_scale.evaluation.report import EvalReport, ModelEntry, summarize
from cll_scale.evaluation.scoring import DirectionResult, ScoreJob, averages, score_job
from cll_scale.evaluation.significance import Significance, compare_models
from cll_scale.evaluation.translator import Translator


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


def read_hypotheses(hyps_out: str | Path, name: str, setting: str = "default") -> dict[str, list[str]]:
    """Direction -> hypotheses of ``name`` in ``setting``, as :func:`score_model` wrote them under
    ``hyps_out`` ({} when it wrote none)."""
    folder = Path(hyps_out) / file_name(name) / setting
    # one line a hypothesis, ended by "\n": read as bytes and split on "\n" alone, since a
    # hypothesis may hold "\r" or U+2028
    return {p.stem: p.read_bytes().decode("utf-8").split("\n")[:-1] for p in sorted(folder.glob("*.txt"))}


def significance(report: EvalReport, names: list[str], pairs: dict[str, tuple[list[str], list[str]]],
                 hyps_out: str | Path) -> Significance:
    """Each of ``names`` (as trained) against the first, on the hypotheses written under
    ``hyps_out`` (:mod:`cll_scale.evaluation.significance`)."""
    hyps = {name: read_hypotheses(hyps_out, name) for name in names}
    kinds = {d.direction: d.kind for name in names for d in report.models[name].directions}
    return compare_models(hyps, {d: refs for d, (_, refs) in pairs.items()}, kinds)


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


def evaluate_model(translator: Translator, pairs: dict[str, tuple[list[str], list[str]]], *args, **kwargs
                   ) -> ModelEntry:
    """:func:`score_model` (same arguments) as the model's entry of a report."""
    ev = score_model(translator, pairs, *args, **kwargs)
    central = translator.manifest.central_language
    return ModelEntry(ev.results, averages(ev.results, central), ev.skipped, ev.signature, ev.use_lsl, list(ev.lid),
                      ev.timing, translator.model.t_weights(),
                      sorted(i + 1 for i in translator.model.cfg.cll_layers),   # 1-based, as in the paper
                      lang_tag=translator.lang_tag and not ev.omit_tag, central_language=central)


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
            hyps_out: str | Path | None = None, omit_lang_tag: bool = False) -> EvalReport:
    """Evaluate several models on the same pairs: the report behind every table of the project.
    Scoring goes to ``pool`` (:func:`cll_scale.evaluation.pool.lid_pool`; inline without one); ``hyps_out`` gets
    ``<model>/<setting>/<direction>.txt``. The cross-model part:
    :func:`cll_scale.evaluation.report.summarize`."""
    directions = select_directions(pairs, directions, test_set)
    check_file_names(translators)
    entries: dict[str, ModelEntry] = {}
    for name, tr in translators.items():
        entries.update(evaluate_entries(tr, name, pairs, directions, max_sentences, ablate_lsl, log, lid, pool,
                                        hyps_out, omit_lang_tag))
    return summarize(entries, test_set, beam, lid, log)


def evaluate_entries(translator: Translator, name: str, pairs: dict[str, tuple[list[str], list[str]]],
                     directions: list[str] | None, max_sentences: int = 0, ablate_lsl: bool = False, log=print,
                     lid: tuple[str, ...] = ("langdetect",), pool: Executor | None = None,
                     hyps_out: str | Path | None = None, omit_lang_tag: bool = False) -> dict[str, ModelEntry]:
    """One model's report entries: ``name``; ``name (LSL off)`` with ``ablate_lsl`` where the
    model has LSLs (paper Tables 9-10); ``name (tag omitted)`` with ``omit_lang_tag`` where the
    model was trained with language tags (Table 8). Each entry records its model's central
    language (for :func:`cll_scale.evaluation.report.summarize`)."""
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
    return entries

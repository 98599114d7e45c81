"""Scoring one direction's outputs: sacreBLEU, chrF and language identification. No torch here,
so that :func:`score_job` can run in a small process pool beside decoding (langdetect is pure
Python at ~3 ms a call, three calls a sentence: on a GPU it, not the model, would set the pace).

Per direction: BLEU on detokenised text, chrF, the off-target rate with langdetect as in the
paper (``plain``) and restricted to the model's languages (``restricted``), the share of outputs
whose first half is in another language (code-switching), which languages off-target outputs are
in, and the share in the language the source was *supervised* to translate into (the "rollback"
of paper Table 10). With lingua also asked for: its off-target rate (restricted to the model's
languages) and the share of outputs it splits into spans of two or more languages.

For a zero-shot direction also where its outputs go (:func:`destinations`, plain langdetect):
the share in the requested target, in a language the source is trained into, in the source
language, in another of the model's languages and outside them; and BLEU and chrF on the
on-target outputs alone (:func:`on_target_scores`). Every sentence's detected language is kept
per identifier (``languages``), so that a report can be recomputed without identifying again.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import sacrebleu

from cll_scale.core.cli import csv_list, non_negative_int
from cll_scale.data.languages import Direction
from cll_scale.evaluation.langid import Lingua, detect

LIDS = ("langdetect", "lingua")


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
    lingua_off_target: float | None = None    # % not in the target language, lingua (restricted)
    lingua_code_switch: float | None = None   # % lingua splits into spans of 2+ languages
    # zero-shot directions only (None otherwise, and in evaluations written before they were measured)
    to_target: float | None = None            # % in the requested target (plain langdetect)
    to_trained: float | None = None           # % in a language the source is trained into
    to_source: float | None = None            # % in the source language
    to_other: float | None = None             # % in another of the model's languages
    to_outside: float | None = None           # % outside the model's languages (or no language found)
    on_target_bleu: float | None = None       # BLEU of the on-target outputs alone
    on_target_chrf: float | None = None
    # identifier -> every sentence's language, space-separated, "-" where none was found
    languages: dict[str, str] | None = None


METRICS = ("bleu", "chrf", "off_target", "off_target_restricted", "code_switch", "rollback",
           "lingua_off_target", "lingua_code_switch", "to_target", "to_trained", "to_source", "to_other",
           "to_outside", "on_target_bleu", "on_target_chrf")
DESTINATIONS = ("to_target", "to_trained", "to_source", "to_other", "to_outside")
# The identifier the destinations are read with: the paper's (plain langdetect), the only one that
# can name a language outside the model's.
DESTINATION_LID = "langdetect"


def trained_targets(src: str, tgt: str, supervised: list[str]) -> set[str]:
    """The languages ``src`` is trained to translate into, ``tgt`` left out (paper Table 10's rollback)."""
    return {d.tgt for d in map(Direction.parse, supervised) if d.src == src} - {tgt}


def destinations(direction: str, detected: list[str | None], languages: list[str],
                 supervised: list[str]) -> dict[str, float]:
    """Where one direction's outputs go, as % of them (:data:`DESTINATIONS`; they sum to 100):
    the requested target, a language the source is trained into, the source, another of the
    model's ``languages``, or outside them (an output with no language found counts there).
    The one reading of the split: cll-eval's and every report's."""
    src, tgt = Direction.parse(direction)
    trained = trained_targets(src, tgt, supervised)
    counts = Counter()
    for x in detected:
        counts["to_target" if x == tgt else "to_trained" if x in trained else "to_source" if x == src
               else "to_other" if x in languages else "to_outside"] += 1
    return {key: _pct(counts[key], len(detected)) for key in DESTINATIONS}


def on_target_scores(hyps: list[str], refs: list[str], detected: list[str | None], tgt: str,
                     tokenize: str = "13a") -> tuple[float | None, float | None]:
    """BLEU and chrF of the outputs detected in ``tgt`` alone, against their references (None,
    None when there is none)."""
    kept = [(h, r) for h, r, x in zip(hyps, refs, detected) if x == tgt]
    if not kept:
        return None, None
    hyp, ref = [h for h, _ in kept], [r for _, r in kept]
    bleu = sacrebleu.BLEU(tokenize="zh" if tgt == "zh" else tokenize).corpus_score(hyp, [ref])
    return bleu.score, sacrebleu.CHRF().corpus_score(hyp, [ref]).score


def pack_languages(detected: list[str | None]) -> str:
    """Every sentence's language as the evaluation JSON keeps it: one line, "-" for none."""
    return " ".join(x or "-" for x in detected)


def unpack_languages(text: str) -> list[str | None]:
    return [None if x == "-" else x for x in text.split(" ")] if text else []


def zero_shot_fields(direction: str, hyps: list[str], refs: list[str], detected: list[str | None],
                     languages: list[str], supervised: list[str], tokenize: str = "13a") -> dict:
    """A zero-shot direction's destinations and on-target scores, as :class:`DirectionResult` fields."""
    bleu, chrf = on_target_scores(hyps, refs, detected, Direction.parse(direction).tgt, tokenize)
    return {**destinations(direction, detected, languages, supervised), "on_target_bleu": bleu,
            "on_target_chrf": chrf}


def _pct(k: int, n: int) -> float:
    return 100.0 * k / n if n else 0.0


@lru_cache(maxsize=8)
def _lingua(languages: tuple[str, ...]) -> Lingua:
    return Lingua(list(languages))


def score_direction(direction: str, kind: str, hyps: list[str], refs: list[str], srcs: list[str],
                    languages: list[str], supervised: list[str], tokenize: str = "13a",
                    lid: tuple[str, ...] = ("langdetect",)) -> tuple[DirectionResult, str, dict[str, float]]:
    """-> the result, sacreBLEU's signature and the seconds spent on ``lid`` and ``scoring``."""
    unknown = [x for x in lid if x not in LIDS]
    if unknown or "langdetect" not in lid:
        raise ValueError(f"language identifiers: langdetect (always, the paper's) and optionally lingua; "
                         f"not {', '.join(unknown) or '(langdetect missing)'}")
    src, tgt = Direction.parse(direction)
    t0 = time.perf_counter()
    bleu_metric = sacrebleu.BLEU(tokenize="zh" if tgt == "zh" else tokenize)
    bleu = bleu_metric.corpus_score(hyps, [refs])
    chrf = sacrebleu.CHRF().corpus_score(hyps, [refs])
    t1 = time.perf_counter()
    plain = [detect(h) for h in hyps]
    restricted = [detect(h, languages) for h in hyps]
    first_half = [detect(" ".join(h.split()[: max(1, len(h.split()) // 2)]), languages) for h in hyps]
    lingua_off = lingua_switch = None
    detected = {DESTINATION_LID: pack_languages(plain), "langdetect-restricted": pack_languages(restricted)}
    if "lingua" in lid:
        detector = _lingua(tuple(languages))
        by_lingua = detector.detect_many(hyps)
        detected["lingua"] = pack_languages(by_lingua)
        lingua_off = _pct(sum(x != tgt for x in by_lingua), len(hyps))
        lingua_switch = _pct(sum(len({lang for lang, _ in detector.spans(h)}) > 1 for h in hyps), len(hyps))
    t2 = time.perf_counter()
    zero = zero_shot_fields(direction, hyps, refs, plain, languages, supervised, tokenize) if kind == "zero-shot" else {}
    t3 = time.perf_counter()
    # Table 10's rollback: the output is in a language this source was trained to translate into.
    rollback_targets = trained_targets(src, tgt, supervised)
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
        samples=[{"src": s, "hyp": h, "ref": r, "lang": d} for s, h, r, d in list(zip(srcs, hyps, refs, restricted))[:3]],
        lingua_off_target=lingua_off, lingua_code_switch=lingua_switch, **zero, languages=detected)
    # the signature exists only after scoring
    return res, str(bleu_metric.get_signature()), {"lid_s": t2 - t1, "scoring_s": t1 - t0 + t3 - t2}


@dataclass
class ScoreJob:
    """One direction's outputs to score (:func:`score_job`), as plain picklable values."""
    direction: str
    kind: str
    hyps: list[str]
    refs: list[str]
    srcs: list[str]
    languages: list[str]
    supervised: list[str]
    tokenize: str = "13a"
    lid: tuple[str, ...] = ("langdetect",)


def score_job(job: ScoreJob) -> tuple[dict, str, dict[str, float]]:
    """:func:`score_direction` for a process pool: plain values in and out."""
    res, signature, seconds = score_direction(job.direction, job.kind, job.hyps, job.refs, job.srcs, job.languages,
                                              job.supervised, job.tokenize, job.lid)
    return asdict(res), signature, seconds


def averages(results: list[DirectionResult], central: str | None) -> dict[str, dict[str, float]]:
    """Means per group: supervised, zero-shot and, with a central language, central→xx and xx→central."""
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
            out[name] = {k: sum(getattr(r, k) for r in rows) / len(rows) for k in METRICS
                         if all(getattr(r, k) is not None for r in rows)}
    return out


def add_lid_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lid", type=lid_list, default=("langdetect",),
                   help="language identifiers: langdetect (always: the paper's measure), lingua (also "
                        "its off-target rate and code-switch share), e.g. --lid langdetect,lingua (default: langdetect)")
    p.add_argument("--lid-workers", type=non_negative_int, default=None,
                   help="processes that score and identify languages while decoding goes on "
                        "(default: the cores but one; 0: in this process)")


def lid_list(text: str) -> tuple[str, ...]:
    """``--lid``: langdetect always comes first (the paper's measure), lingua optionally."""
    names = tuple(dict.fromkeys(csv_list(text)))
    unknown = [x for x in names if x not in LIDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(LIDS)}")
    return names if "langdetect" in names else ("langdetect", *names)

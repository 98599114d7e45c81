"""Scoring one direction's outputs: sacreBLEU, chrF and language identification. No torch here,
so that :func:`score_job` can run in a small process pool beside decoding (langdetect is pure
Python at ~3 ms a call, three calls a sentence: on a GPU it, not the model, would set the pace).

Per direction: BLEU on detokenised text, chrF, the off-target rate with langdetect as in the
paper (``plain``) and restricted to the model's languages (``restricted``), the share of outputs
whose first half is in another language (code-switching), which languages off-target outputs are
in, and the share in the language the source was *supervised* to translate into (the "rollback"
of paper Table 10). With lingua also asked for: its off-target rate (restricted to the model's
languages) and the share of outputs it splits into spans of two or more languages.
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


METRICS = ("bleu", "chrf", "off_target", "off_target_restricted", "code_switch", "rollback",
           "lingua_off_target", "lingua_code_switch")


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
    if "lingua" in lid:
        detector = _lingua(tuple(languages))
        lingua_off = _pct(sum(x != tgt for x in detector.detect_many(hyps)), len(hyps))
        lingua_switch = _pct(sum(len({lang for lang, _ in detector.spans(h)}) > 1 for h in hyps), len(hyps))
    t2 = time.perf_counter()
    # Table 10's rollback: the output is in a language this source was trained to translate into.
    rollback_targets = {d.tgt for d in map(Direction.parse, supervised) if d.src == src} - {tgt}
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
        lingua_off_target=lingua_off, lingua_code_switch=lingua_switch)
    # the signature exists only after scoring
    return res, str(bleu_metric.get_signature()), {"lid_s": t2 - t1, "scoring_s": t1 - t0}


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
                        "its off-target rate and code-switch share), e.g. --lid langdetect,lingua")
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

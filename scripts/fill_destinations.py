"""Fill in the zero-shot destinations of cached evaluations written before they were measured
(entry format 1), from the hypotheses stored beside them: nothing is decoded. Each zero-shot
direction's outputs are identified again with plain langdetect (seeded: the labels the
evaluation gave them), and the split and the on-target scores are computed by the one owner,
:func:`cll_scale.evaluation.scoring.zero_shot_fields`; the per-sentence languages are kept
under ``languages["langdetect"]``. Entries of format 2 are left as they are.

    .venv/bin/python scripts/fill_destinations.py docs/results/diagnostics-2/square-diagnostics \\
        --corpus ../shared/data/multi30k

A cached entry does not name its model's languages or supervised directions: they are read from
its scored directions (the languages they join, the directions scored as supervised), which is
the model's own when every direction of the test set was scored, as in every cll-repro study.
Each direction's BLEU over its stored hypotheses is checked against the cached one first, so a
hypothesis file that is not the one scored is refused, not filled from.

Then ``scripts/rewrite_reports.py --write`` writes the reports again from the filled caches.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.evaluation.report import ENTRY_FORMAT  # noqa: E402
from cll_scale.core.cli import add_alias  # noqa: E402
from cll_scale.core.jsonfiles import read_json_object  # noqa: E402
from cll_scale.core.outputs import json_text, write_atomic  # noqa: E402
from cll_scale.data.languages import Direction  # noqa: E402
from cll_scale.evaluation.evaluator import LSL_OFF, TAG_OMITTED  # noqa: E402
from cll_scale.evaluation.langid import detect  # noqa: E402
from cll_scale.evaluation.report import ModelEntry  # noqa: E402
from cll_scale.evaluation.scoring import DESTINATION_LID, averages, pack_languages, zero_shot_fields  # noqa: E402
from cll_scale.evaluation.testsets import pairs_from_corpus  # noqa: E402

SETTINGS = {"": "default", LSL_OFF: "lsl-off", TAG_OMITTED: "tag-omitted"}    # as evaluator.evaluate_entries


def setting_of(entry: str, model: str) -> str:
    """The hypotheses folder of one entry of ``model`` (its name as trained, LSL off, tag omitted)."""
    for suffix, setting in SETTINGS.items():
        if entry.endswith(suffix) and entry[: len(entry) - len(suffix)] and (suffix or entry == model):
            return setting
    raise ValueError(f"entry {entry!r}: not one of the settings of a cll-repro model")


def fill_entry(entry: ModelEntry, hyps: Path, pairs: dict[str, tuple[list[str], list[str]]], log=print) -> ModelEntry:
    """``entry`` with its zero-shot directions' destinations, from the hypotheses in ``hyps``."""
    languages = sorted({x for d in entry.directions for x in Direction.parse(d.direction)})
    supervised = [d.direction for d in entry.directions if d.kind == "supervised"]
    for d in entry.directions:
        if d.kind != "zero-shot":
            continue
        lines = (hyps / f"{d.direction}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        refs = pairs[d.direction][1][: len(lines)]
        bleu = sacrebleu.BLEU(tokenize="zh" if d.direction.endswith("-zh") else "13a").corpus_score(lines, [refs])
        if len(lines) != d.n or abs(bleu.score - d.bleu) > 1e-6:
            raise ValueError(f"{hyps / d.direction}.txt: {len(lines)} lines scoring BLEU {bleu.score:.4f}, but the "
                             f"cached evaluation scored {d.n} at {d.bleu:.4f}: not the hypotheses it scored")
        detected = [detect(h) for h in lines]
        for key, value in zero_shot_fields(d.direction, lines, refs, detected, languages, supervised).items():
            setattr(d, key, value)
        d.languages = {DESTINATION_LID: pack_languages(detected)}
        log(f"  {d.direction}: target {d.to_target:.1f}%, trained {d.to_trained:.1f}%, outside {d.to_outside:.1f}%")
    entry.averages = averages(entry.directions, entry.central_language)     # now with the destinations
    entry.format_version = ENTRY_FORMAT
    return entry


def fill_report_folder(folder: Path, corpus: str, log=print) -> int:
    """Every cached evaluation under ``folder/evaluated`` of format 1, filled and written back;
    returns how many entries were filled."""
    filled = 0
    for path in sorted((folder / "evaluated").glob("*/*.json")):
        split, model = path.parent.name, path.stem
        cached = read_json_object(path)
        entries = {k: ModelEntry.from_json(v) for k, v in cached["entries"].items()}
        todo = [k for k, e in entries.items() if e.format_version < ENTRY_FORMAT]
        if not todo:
            continue
        languages = sorted({x for e in entries.values() for d in e.directions for x in Direction.parse(d.direction)})
        pairs = pairs_from_corpus(corpus, split, languages)
        base = min(entries, key=len)            # the model as trained: the entry without a suffix
        for name in todo:
            log(f"{path}: {name}")
            fill_entry(entries[name], folder / "hyps" / split / model / setting_of(name, base), pairs, log)
            filled += 1
        cached["entries"] = {k: e.to_json() for k, e in entries.items()}
        write_atomic(path, json_text(cached, indent=1, ensure_ascii=False))
    return filled


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path, help="report folders holding evaluated/ and hyps/")
    p.add_argument("--corpus", default=str(ROOT.parent / "shared" / "data" / "multi30k"),
                   help="the corpus the references are read from")
    add_alias(p, "--multi30k", "--corpus", dest="corpus")
    args = p.parse_args(argv)
    for folder in args.folders:
        print(f"{folder}: {fill_report_folder(folder, args.corpus)} entries filled")
    return 0


if __name__ == "__main__":
    sys.exit(main())

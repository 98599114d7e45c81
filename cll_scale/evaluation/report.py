"""The evaluation report, typed: each model's entry (:class:`ModelEntry`: one setting of one model,
as trained, with its LSLs off or without its tag) and several entries summarised on the directions
they share (:class:`EvalReport`); written as results.json, results.md (the layout of paper Tables
2-3) and the two plots. Readers take the attributes and :meth:`ModelEntry.average`, never a path of
keys into the JSON; ``to_json``/``from_json`` keep the file's layout as it has always been."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cll_scale.core.outputs import json_text, write_atomic
from cll_scale.evaluation.plots import plot_bleu_offtarget, plot_t_weights
from cll_scale.evaluation.scoring import DESTINATIONS, DirectionResult, averages
from cll_scale.core.jsonfiles import read_json_object


# Kept. Reports and entries (cll-eval's results.json, cll-repro's cached evaluations) written before
# the skipped directions, the language identifiers, the timing and the central language were
# recorded (docs/results' oldest: 6 reports, 22 entries) read with what they were: nothing skipped,
# langdetect alone. Kept while committed reports hold them.
def upgrade_report(report: dict) -> dict:
    """An evaluation report with the language identifiers it was scored with (the oldest name none)."""
    return {"lid": ["langdetect"], **report}


def upgrade_entry(entry: dict) -> dict:
    """An evaluation entry with every key today's reader expects (fresh defaults each time: an
    entry's lists and dicts are its own)."""
    return {"skipped": {}, "lid": ["langdetect"], "timing": {}, "central_language": None,
            **upgrade_entry_version(entry)}


# Kept. Entries of format version 1 (no ``format_version``: every one written before the zero-shot
# destinations were measured) have no destinations, on-target scores or per-sentence languages:
# their directions read them as None ("not measured"), and a report shows "–" until
# scripts/fill_destinations.py identifies the languages of the stored hypotheses.
ENTRY_FORMAT = 2


def upgrade_entry_version(entry: dict) -> dict:
    """An entry with its format version (1 when it names none)."""
    return {"format_version": 1, **entry}


@dataclass
class ModelEntry:
    """One model in one setting, scored on one test set."""
    directions: list[DirectionResult]
    averages: dict[str, dict[str, float]]       # group (supervised, zero-shot, en→xx, xx→en) -> metric -> mean
    skipped: dict[str, str]                     # direction -> why it was not scored
    bleu_signature: str | None
    use_lsl: bool
    lid: list[str]
    timing: dict[str, float]
    t_weights: dict[str, list[float]]           # language -> t_l per CLL layer (paper Fig. 6)
    cll_layers: list[int]                       # counted from 1, as in the paper (a stored format: the
                                                # flags, recipes and figures count from 0)
    lang_tag: bool | None = None                # fed a language tag (None: not recorded, read as True)
    central_language: str | None = None
    common_averages: dict[str, dict[str, float]] | None = None   # over the directions every model shares
    format_version: int = ENTRY_FORMAT          # 1: written before the zero-shot destinations (upgrade above)

    def average(self, group: str, metric: str, common: bool = False) -> float | None:
        """The mean of ``metric`` over ``group``'s directions (``common``: those every model of the
        report was scored on); None when the group is empty or the metric was not measured."""
        table = self.common_averages if common and self.common_averages is not None else self.averages
        return table.get(group, {}).get(metric)

    @property
    def tagged(self) -> bool:
        """Whether the model was fed its language tag. Entries cached before ``lang_tag`` was
        recorded have None: every model was trained and evaluated with tags then."""
        return self.lang_tag is not False

    def to_json(self) -> dict:
        out = {"directions": [asdict(r) for r in self.directions], "averages": self.averages,
               "skipped": self.skipped, "bleu_signature": self.bleu_signature, "use_lsl": self.use_lsl}
        if self.lang_tag is not None:
            out["lang_tag"] = self.lang_tag
        out.update(lid=self.lid, timing=self.timing, t_weights=self.t_weights, cll_layers=self.cll_layers)
        out["central_language"] = self.central_language
        if self.common_averages is not None:
            out["common_averages"] = self.common_averages
        out["format_version"] = self.format_version
        return out

    @classmethod
    def from_json(cls, d: dict) -> "ModelEntry":
        d = upgrade_entry(d)
        return cls(**{**d, "directions": [DirectionResult(**r) for r in d["directions"]]})


@dataclass
class EvalReport:
    """Several models' entries on one test set."""
    test_set: str
    beam: int
    lid: list[str]
    models: dict[str, ModelEntry]
    common_directions: list[str] | None = None     # set when the models were scored on different directions
    bleu_signature: str = ""

    @property
    def lingua(self) -> bool:
        return "lingua" in self.lid

    def to_json(self) -> dict:
        out = {"test_set": self.test_set, "beam": self.beam, "lid": self.lid,
               "models": {name: e.to_json() for name, e in self.models.items()}}
        if self.common_directions is not None:
            out["common_directions"] = self.common_directions
        out["bleu_signature"] = self.bleu_signature
        return out

    @classmethod
    def from_json(cls, d: dict) -> "EvalReport":
        d = upgrade_report(d)
        return cls(d["test_set"], d["beam"], d["lid"],
                   {name: ModelEntry.from_json(e) for name, e in d["models"].items()},
                   d.get("common_directions"), d.get("bleu_signature", ""))

    @classmethod
    def load(cls, path: str | Path) -> "EvalReport":
        """A report as cll-eval and cll-repro write it (``results.json``, ``<split>.json``)."""
        return cls.from_json(read_json_object(path))


DESTINATION_HEAD = (" zero-shot destination: target / trained target / source / other / outside (%) "
                    "| zero-shot on-target BLEU / chrF |")


def destination_cells(value) -> str:
    """The two destination cells of a row (``value(metric)``: its figure, None when not measured):
    where the zero-shot outputs went (plain langdetect), then the scores of the on-target ones."""
    shares = [value(k) for k in DESTINATIONS]
    split = " / ".join(f"{x:.1f}" for x in shares) if None not in shares else "–"
    bleu, chrf = value("on_target_bleu"), value("on_target_chrf")
    scores = f"{bleu:.2f} / {chrf:.2f}" if bleu is not None and chrf is not None else "–"
    return f" {split} | {scores} |"


def markdown(report: EvalReport) -> str:
    """Summary in the layout of the paper's Tables 2-3, then every direction; lingua's columns
    when it was asked for, and each model's decoding speed."""
    models, common, lingua = report.models, report.common_directions is not None, report.lingua

    def table(e: ModelEntry) -> dict[str, dict[str, float]]:
        return e.common_averages if common else e.averages
    cols = []
    for e in models.values():
        cols += [c for c in ("en→xx", "xx→en", "supervised", "zero-shot") if c in table(e) and c not in cols]
    for e in models.values():
        cols += [c for c in table(e) if c not in cols]
    lines = [f"Test set: `{report.test_set}`; beam {report.beam}; {report.bleu_signature}", ""]
    if common:
        lines += [f"The models were scored on different directions; the averages below cover only the "
                  f"{len(report.common_directions)} every model was scored on: "
                  f"{', '.join(report.common_directions)}.", ""]
    extra = " zero-shot off-target (lingua) | zero-shot code-switch (lingua) |" if lingua else ""
    lines += ["| model | " + " | ".join(f"{c} BLEU" for c in cols)
              + " | zero-shot off-target (paper / restricted) | zero-shot code-switch |" + extra + DESTINATION_HEAD,
              "|---|" + "---:|" * (len(cols) + 2 + 2 * lingua + 2)]

    def pct(value: float | None) -> str:
        return f"{value:.2f}%" if value is not None else "–"
    for name, e in models.items():
        zero = "zero-shot" in table(e)
        z = lambda metric: e.average("zero-shot", metric, common)     # noqa: E731
        off = f"{z('off_target'):.2f}% / {z('off_target_restricted'):.2f}%" if zero else "–"
        lines.append(f"| {name} | " + " | ".join(f"{e.average(c, 'bleu', common):.2f}" if c in table(e) else "–"
                                                  for c in cols)
                     + f" | {off} | {pct(z('code_switch'))} |"
                     + (f" {pct(z('lingua_off_target'))} | {pct(z('lingua_code_switch'))} |" if lingua else "")
                     + destination_cells(z))
    lines += ["", "| model | direction | kind | BLEU | chrF | off-target (paper) | off-target (restricted) "
              "| code-switch | in supervised target |" + (" off-target (lingua) |" if lingua else "")
              + " off-target languages |" + DESTINATION_HEAD, "|---|---|---|" + "---:|" * (6 + lingua) + "---|"
              + "---:|" * 2]
    for name, e in models.items():
        for d in e.directions:
            langs = ", ".join(f"{k} {v}" for k, v in d.off_languages.items()) or "–"
            lines.append(f"| {name} | {d.direction} | {d.kind} | {d.bleu:.2f} | {d.chrf:.2f} | "
                         f"{d.off_target:.1f}% | {d.off_target_restricted:.1f}% | {d.code_switch:.1f}% | "
                         f"{d.rollback:.1f}% |" + (f" {pct(d.lingua_off_target)} |" if lingua else "")
                         + f" {langs} |" + destination_cells(lambda metric: getattr(d, metric)))
    skipped = [f"{name}: {d} ({why})" for name, e in models.items() for d, why in e.skipped.items()]
    if skipped:
        lines += ["", "Not scored: " + "; ".join(skipped) + "."]
    timed = [(name, e.timing) for name, e in models.items() if e.timing]
    if timed:
        lines += ["", "Time per model: " + "; ".join(
            f"{name} {t['sentences']:,} sentences in {t['wall_s']:.1f} s ({t['sentences_per_s']:.1f}/s; decoding "
            f"{t['decode_s']:.1f} s, language ID {t['lid_s']:.1f} s and scoring {t['scoring_s']:.1f} s of worker time)"
            for name, t in timed) + "."]
    return "\n".join(lines) + "\n"


def summarize(entries: dict[str, ModelEntry], test_set: str, beam: int, lid: tuple[str, ...] = ("langdetect",),
              log=print) -> EvalReport:
    """The report of several models' entries. When the models were not all scored on the same
    directions, each model's ``common_averages`` averages only the directions every model was
    scored on (``common_directions``), so that the summary compares like with like."""
    if not entries:
        raise ValueError(f"{test_set}: no model to report")
    scored = [{d.direction for d in e.directions} for e in entries.values()]
    if not any(scored):
        raise ValueError(f"{test_set}: no model could be scored on any direction "
                         f"(skipped: {next(iter(entries.values())).skipped})")
    report = EvalReport(test_set, beam, list(lid), dict(entries))
    common = set.intersection(*scored)
    if any(s != common for s in scored):
        report.common_directions = sorted(common)
        report.models = {name: replace(e, common_averages=averages([d for d in e.directions if d.direction in common],
                                                                   e.central_language))
                         for name, e in entries.items()}
        log(f"the models were scored on different directions: the summary averages only the "
            f"{len(common)} they share ({', '.join(sorted(common)) or 'none'})")
    report.bleu_signature = next((e.bleu_signature for e in entries.values() if e.bleu_signature), "")
    return report


def write_report(report: EvalReport, out: str | Path) -> str:
    """results.json, results.md and the two plots into ``out``; returns the markdown."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "results.json", json_text(report.to_json(), indent=1, ensure_ascii=False))
    table = markdown(report)
    write_atomic(out / "results.md", table)
    plot_bleu_offtarget(report, out / "bleu_offtarget.png")
    plot_t_weights(report, out / "t_weights.png")
    return table

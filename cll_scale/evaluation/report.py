"""The evaluation report: several models' entries summarised on the directions they share, as
results.json, results.md (the layout of paper Tables 2-3) and the two plots."""
from __future__ import annotations

from pathlib import Path

from cll_scale.core.outputs import json_text, write_atomic
from cll_scale.evaluation.scoring import DirectionResult, averages


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

"""The last thing `make quickstart` prints: what a person reads in a minute.

    python scripts/quickstart_summary.py --report runs/quickstart/results/triangle-quickstart \
        --runs runs/quickstart/runs --corpus ../shared/data/multi30k

Baseline and FCLL side by side: supervised BLEU, zero-shot BLEU, and the zero-shot off-target rate
(langdetect, the paper's measure) with its 95% Wilson interval over every zero-shot sentence
decoded; whether the Baseline's rate is at least twice FCLL's with intervals apart; FCLL tested
against the Baseline on the same sentences (the p-values of the paired tests cll-repro wrote, with
the sacreBLEU signatures); three zero-shot sentences the Baseline answers in another language and FCLL in the right one; what the study's
recipes reach trained longer (the committed records); and what to do next. Also draws the chart
(``quickstart.png`` beside the report: off-target per zero-shot direction, with intervals).
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.core.jsonfiles import read_json_object  # noqa: E402
from cll_scale.evaluation.report import EvalReport  # noqa: E402
from cll_scale.evaluation.significance import Significance  # noqa: E402
from cll_scale.training.metrics import read_rows  # noqa: E402

MODELS = ("baseline", "fcll")
RESULTS = ROOT / "docs" / "results"
# What larger models reach trained longer, from the committed records: (steps, report folder,
# which recipes).
LONGER = {
    "triangle": [(2100, RESULTS / "diagnostics" / "triangle-diagnostics",
                  "the diagnostics' `small` recipes: twice the width, 4,096 tokens a step, dropout 0.1, "
                  "lr 1e-3 after 800 warm-up steps"),
                 (4200, RESULTS / "study-defaults" / "triangle-seeds",
                  "the study's `small` recipes, the same settings and rules")],
    "centered": [(4200, RESULTS / "centered-seeds", "the same recipes, trained under the rules of before issue 34")],
}
FULL_STUDY = {
    "triangle": "cll-repro --condition triangle --variants baseline,fcll,sd,sd_attn --seeds 1,2,3 "
                "--steps-per-model 4200 --ablate-lsl --lid langdetect,lingua --precision bf16",
    "centered": "cll-repro --condition centered --variants baseline,fcll,sd --seeds 1,2,3 --steps-per-model 4200 "
                "--ablate-lsl --precision bf16",
}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of k successes in n trials, in percent."""
    if n == 0:
        return 0.0, 100.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * max(0.0, centre - half), 100 * min(1.0, centre + half)


def model_name(names, variant: str) -> str | None:
    return next((n for n in names if n.split()[0] == variant and "(" not in n), None)


def scores(report: EvalReport) -> dict[str, dict]:
    """Per variant: its name in the report, BLEU, and the zero-shot off-target count over every
    zero-shot sentence (each direction's rate times its sentences)."""
    out = {}
    for variant in MODELS:
        name = model_name(report.models, variant)
        if name is None:
            continue
        model = report.models[name]
        zero = [d for d in model.directions if d.kind == "zero-shot"]
        n = sum(d.n for d in zero)
        k = round(sum(d.off_target * d.n / 100 for d in zero))
        out[variant] = {"name": name, "sup_bleu": model.average("supervised", "bleu"),
                        "zs_bleu": model.average("zero-shot", "bleu"),
                        "off": 100 * k / n if n else float("nan"), "k": k, "n": n, "ci": wilson(k, n),
                        "per_direction": {d.direction: (d.off_target, d.n) for d in zero}}
    return out


def trained_steps(runs: Path | None, name: str) -> int | None:
    """The last training step of a model's run directory (or record)."""
    if runs is None:
        return None
    found = sorted(runs.glob(f"*-{name.replace(' ', '-')}"))
    rows = [r for r in read_rows(found[0] / "metrics.jsonl") if "loss" in r] if found else []
    return rows[-1]["step"] if rows else None


def table(now: dict[str, dict], runs: Path | None) -> list[str]:
    out = [f"{'':10s} {'steps':>6s} {'supervised BLEU':>16s} {'zero-shot BLEU':>15s} "
           f"{'zero-shot off-target (95% interval), of n sentences':>52s}"]
    for variant, s in now.items():
        steps = trained_steps(runs, s["name"])
        out.append(f"{variant:10s} {steps or '?':>6} {s['sup_bleu']:16.2f} {s['zs_bleu']:15.2f} "
                   f"{s['off']:19.1f}% ({s['ci'][0]:.1f}–{s['ci'][1]:.1f}%) of {s['n']:,}")
    return out


TARGETS = "the quickstart's targets: at least 2x, intervals apart, BLEU 15 or more"


# What trains both models on from where they stopped: each condition's own budget variable.
MORE = {"triangle": "More steps train both models on from where they stopped: QUICKSTART_STEPS=N make quickstart, "
                    "N above this run's.",
        "centered": "More minutes train both models on from where they stopped: QUICKSTART_CONDITION=centered "
                    "QUICKSTART_MINUTES=N make quickstart, N above this run's."}


def verdict(now: dict[str, dict], condition: str = "triangle") -> str:
    """Whether the effect shows (the Baseline's zero-shot off-target at least twice FCLL's, the
    intervals apart, both models at supervised BLEU 15); if not, which of these it misses."""
    if set(now) != set(MODELS):
        return "Only one model was evaluated: no comparison."
    b, f = now["baseline"], now["fcll"]
    apart = b["ci"][0] > f["ci"][1]
    ratio = b["off"] / f["off"] if f["off"] else float("inf")
    facts = (f"the Baseline answers zero-shot in the wrong language {ratio:.1f}x as often as FCLL, and the two 95% "
             f"intervals {'do not overlap' if apart else 'overlap'}; supervised BLEU {b['sup_bleu']:.1f} and "
             f"{f['sup_bleu']:.1f}")
    missed = []
    if ratio < 2:
        missed.append(f"the Baseline's rate is {ratio:.1f}x FCLL's, not 2x")
    if not apart:
        missed.append("the two intervals overlap")
    missed += [f"{name}'s supervised BLEU is {s['sup_bleu']:.1f}, under 15"
               for name, s in (("the Baseline", b), ("FCLL", f)) if s["sup_bleu"] < 15]
    if not missed:
        return f"The effect shows: {facts} ({TARGETS})."
    return f"The effect does not show yet: {'; '.join(missed)} ({TARGETS}; here {facts}). {MORE[condition]}"


def paired(report_dir: Path, split: str, report: EvalReport, now: dict[str, dict]) -> list[str]:
    """FCLL against the Baseline on the same sentences, as cll-repro tested them
    (``<split>_significance.json``): p-values for BLEU, chrF and off-target, and the signatures."""
    out = [f"sacreBLEU: {report.bleu_signature}"]
    path = report_dir / f"{split}_significance.json"
    if set(now) != set(MODELS):
        return out
    if not path.is_file():
        return out + [f"  (no paired tests in {path.name}: re-run the same cll-repro command to add them)"]
    tests = Significance.from_json(read_json_object(path))
    out.insert(0, "FCLL against the Baseline on the same sentences (p: paired bootstrap for BLEU and chrF, "
                  "exact McNemar for off-target):")
    for group in ("supervised", "zero-shot"):
        c = tests.find(now["fcll"]["name"], now["baseline"]["name"], group)
        if c is None:
            continue
        out.append(f"  {group:10s} BLEU {c.bleu[0]:.2f} → {c.bleu[1]:.2f} (p {c.bleu_p:.4f}), chrF {c.chrf[0]:.2f} → "
                   f"{c.chrf[1]:.2f} (p {c.chrf_p:.4f}), off-target {c.off_target[0]:.1f}% → {c.off_target[1]:.1f}% "
                   f"(p {c.off_target_p:.2g}), {c.sentences:,} sentences")
    return out + [f"Paired tests: {tests.signature}"]


def examples(report_dir: Path, split: str, corpus: Path | None, now: dict[str, dict], n: int = 3) -> list[str]:
    """Zero-shot sentences where the Baseline's output is in another language than asked and FCLL's
    in the asked one (langdetect, as the rates), one direction after another, FCLL's outputs
    nearest their references first."""
    from cll_scale.evaluation.evaluator import file_name
    from cll_scale.evaluation.langid import detect
    out = ["Zero-shot sentences the Baseline answers in another language and FCLL in the right one:"]
    if set(now) != set(MODELS):
        return out + ["  (needs both models)"]
    hyps = report_dir / "hyps" / split
    found = []
    directions = sorted(now["baseline"]["per_direction"])
    texts = {}
    for d in directions:
        src, tgt = d.split("-")
        outs = {v: (hyps / file_name(now[v]["name"]) / "default" / f"{d}.txt").read_text(encoding="utf-8").splitlines()
                for v in MODELS}
        refs = sources = None
        if corpus is not None and (corpus / f"{split}.{src}").is_file():
            sources = (corpus / f"{split}.{src}").read_text(encoding="utf-8").splitlines()
            refs = (corpus / f"{split}.{tgt}").read_text(encoding="utf-8").splitlines()
        texts[d] = (outs, sources, refs)
    # Every sentence that qualifies, the FCLL outputs nearest their reference first (sentence chrF:
    # the plainest examples of the right language, not its first broken attempt), then taken one
    # direction after another so that the examples show different ones.
    from sacrebleu.metrics import CHRF
    chrf = CHRF()
    candidates = {}
    for d in directions:
        outs, sources, refs = texts[d]
        tgt = d.split("-")[1]
        ranked = []
        for i in range(len(outs["baseline"])):
            langs = {v: detect(outs[v][i]) for v in MODELS}
            if langs["baseline"] != tgt and langs["fcll"] == tgt:
                close = chrf.sentence_score(outs["fcll"][i], [refs[i]]).score if refs and i < len(refs) else 0.0
                ranked.append((-close, i, langs))
        candidates[d] = sorted(ranked)
    while len(found) < n and any(candidates.values()):
        for d in directions:
            if candidates[d] and len(found) < n:
                _, i, langs = candidates[d].pop(0)
                found.append((d, i, *texts[d], langs))
    for d, i, outs, sources, refs, langs in found:
        out.append(f"  {d} (zero-shot), test sentence {i + 1}")
        if sources:
            out += [f"    source     {sources[i]}", f"    reference  {refs[i]}"]
        out += [f"    Baseline   {outs['baseline'][i]}   [{langs['baseline'] or 'no language'}]",
                f"    FCLL       {outs['fcll'][i]}   [{langs['fcll']}]"]
    if not found:
        out.append("  none among the sentences decoded")
    return out


def longer(condition: str, split: str) -> list[str]:
    """What the committed records reach with more training, condition by condition."""
    out = []
    for steps, folder, recipe in LONGER.get(condition, []):
        path = folder / f"{split}.json"
        if not path.is_file():
            continue
        ref = scores(EvalReport.load(path))
        line = "; ".join(f"{v} {s['off']:.1f}% zero-shot off-target, supervised BLEU {s['sup_bleu']:.1f}"
                         for v, s in ref.items())
        out.append(f"  {steps:,} steps ({recipe}; {folder.relative_to(ROOT)}): {line}")
    return (["Trained longer (the committed records, one seed):"] + out) if out else []


def chart(now: dict[str, dict], path: Path) -> Path | None:
    """Zero-shot off-target per direction and over all of them, Baseline against FCLL, with 95%
    Wilson intervals: the README's picture."""
    if set(now) != set(MODELS):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    directions = sorted(now["baseline"]["per_direction"])
    groups = directions + ["all zero-shot"]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    width = 0.38
    for j, (variant, colour) in enumerate((("baseline", "#b0413e"), ("fcll", "#2f6f9f"))):
        s = now[variant]
        values, lows, highs = [], [], []
        for d in groups:
            off, n = (s["off"], s["n"]) if d == "all zero-shot" else s["per_direction"][d]
            lo, hi = wilson(round(off * n / 100), n)
            values.append(off)
            lows.append(off - lo)
            highs.append(hi - off)
        xs = [i + (j - 0.5) * width for i in range(len(groups))]
        ax.bar(xs, values, width, yerr=[lows, highs], capsize=3, color=colour,
               label="Baseline" if variant == "baseline" else "FCLL")
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 115)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("zero-shot off-target, %")
    ax.set_title("Answers in the wrong language, zero-shot (95% intervals)")
    ax.legend(frameon=False, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def demo_command(condition: str, runs: Path | None) -> str:
    """The ``make demo`` that serves these two models: the Makefile finds them by the condition
    and the quickstart's runs folder (``runs`` is its ``runs/``), so either one left at its
    default would serve other models, or none."""
    words = ["make demo"]
    if condition != "triangle":
        words.append(f"QUICKSTART_CONDITION={condition}")
    if runs is not None and runs.name == "runs" and runs.parent.resolve() != ROOT / "runs" / "quickstart":
        words.append(f"QUICKSTART_RUNS={shlex.quote(str(runs.parent))}")
    return " ".join(words)


def summary(report_dir: Path, split: str, corpus: Path | None, runs: Path | None, condition: str) -> str:
    report = EvalReport.load(report_dir / f"{split}.json")
    now = scores(report)
    png = chart(now, report_dir / "quickstart.png")
    out = ["", f"== The quickstart: Baseline against FCLL, Multi30k {condition}, {split} ==", ""]
    out += table(now, runs) + ["", verdict(now, condition), ""]
    out += paired(report_dir, split, report, now) + [""]
    out += examples(report_dir, split, corpus, now) + [""]
    out += longer(condition, split) + [""]
    out += ["Next:",
            f"  {demo_command(condition, runs):26s} the two models side by side in the browser, a zero-shot "
            "example already translated",
            f"  {FULL_STUDY.get(condition, FULL_STUDY['triangle'])}",
            "                             the full study (3 seeds; about 1.5 hours a model here, minutes on a GPU)",
            "  On a GPU the same commands run unchanged (CUDA, bf16, NCCL); `deepspeed --num_gpus N --module "
            "cll_scale.train ...` trains on several."]
    if png:
        out.append(f"Chart: {png}")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", required=True, help="the quickstart's cll-repro report folder")
    p.add_argument("--runs", help="the quickstart's run directories (default: the report's records)")
    p.add_argument("--corpus", help="the Multi30k directory, for the example sources and references")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--condition", default="triangle", choices=sorted(LONGER))
    args = p.parse_args(argv)
    report = Path(args.report)
    print(summary(report, args.split, Path(args.corpus) if args.corpus else None,
                  Path(args.runs) if args.runs else report / "records", args.condition), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

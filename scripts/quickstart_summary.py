"""The last thing `make quickstart` prints: what a person reads in ten seconds.

    python scripts/quickstart_summary.py --report runs/quickstart/results/centered \
        --full docs/results/centered-seeds --corpus ../shared/data/multi30k

Baseline and FCLL side by side (supervised BLEU, zero-shot BLEU and off-target), a few zero-shot
outputs, what these numbers mean at the budget trained, what the same recipes reach trained in
full (from the committed study records), and the smallest budget that shows the effect on the
study's CPU, read from those records' validation curves. The long tables stay in the report."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cll_scale.metrics import read_rows  # noqa: E402

MODELS = ("baseline", "fcll")
# The effect shows when FCLL answers a zero-shot validation sentence in the wrong language this many
# points less often than the Baseline, with the supervised directions already translated.
GAP, MIN_BLEU = 10.0, 20.0


def model_name(names, variant: str) -> str | None:
    return next((n for n in names if n.split()[0] == variant and "LSL off" not in n), None)


def scores(report: dict) -> dict[str, dict]:
    out = {}
    for variant in MODELS:
        name = model_name(report["models"], variant)
        if name:
            avg = report["models"][name]["averages"]
            out[variant] = {"name": name, "sup_bleu": avg["supervised"]["bleu"], "zs_bleu": avg["zero-shot"]["bleu"],
                            "zs_off": avg["zero-shot"]["off_target"]}
    return out


def trained(records: Path, variant: str) -> tuple[int, float] | None:
    """(steps, minutes) of a variant's run or record under ``records``."""
    for run in sorted(records.glob(f"*-{variant}*")):
        rows = [r for r in read_rows(run / "metrics.jsonl") if "loss" in r]
        if rows:
            return rows[-1]["step"], rows[-1].get("elapsed_s", 0.0) / 60
    return None


def first_effect(records: Path) -> dict | None:
    """The first validation where FCLL's zero-shot off-target is GAP points below the Baseline's
    and both translate the supervised directions (validation BLEU >= MIN_BLEU), in the records."""
    curves = {}
    for variant in MODELS:
        run = next(iter(sorted(records.glob(f"*-{variant}-seed1"))), None) or next(iter(sorted(records.glob(f"*-{variant}"))), None)
        if run is None:
            return None
        rows = read_rows(run / "metrics.jsonl")
        minutes = {r["step"]: r.get("elapsed_s", 0.0) / 60 for r in rows if "loss" in r}
        hardware = json.loads((run / "record.json").read_text()).get("hardware", "") if (run / "record.json").is_file() else ""
        curves[variant] = ({r["step"]: r for r in rows if "valid_zero_shot_offtarget" in r}, minutes, hardware)
    base, fcll = curves["baseline"][0], curves["fcll"][0]
    for step in sorted(set(base) & set(fcll)):
        b, f = base[step], fcll[step]
        if b["valid_zero_shot_offtarget"] - f["valid_zero_shot_offtarget"] >= GAP and min(
                b.get("valid_bleu", 0), f.get("valid_bleu", 0)) >= MIN_BLEU:
            return {"step": step, "minutes": max(curves[v][1].get(step, 0.0) for v in MODELS),
                    "baseline_off": b["valid_zero_shot_offtarget"], "fcll_off": f["valid_zero_shot_offtarget"],
                    "bleu": min(b["valid_bleu"], f["valid_bleu"]), "hardware": curves["fcll"][2]}
    return None


def examples(report_dir: Path, split: str, corpus: Path | None, names: dict[str, str], n: int = 3) -> list[str]:
    hyps = report_dir / "hyps" / split
    from cll_scale.evaluate import file_name
    lines = []
    for path in sorted((hyps / file_name(names["baseline"]) / "default").glob("*.txt"))[:1]:
        direction = path.stem
        src, tgt = direction.split("-")
        outs = {v: (hyps / file_name(names[v]) / "default" / path.name).read_text(encoding="utf-8").splitlines()
                for v in MODELS}
        sources = refs = None
        if corpus is not None and (corpus / f"{split}.{src}").is_file():
            sources = (corpus / f"{split}.{src}").read_text(encoding="utf-8").splitlines()
            refs = (corpus / f"{split}.{tgt}").read_text(encoding="utf-8").splitlines()
        lines.append(f"Zero-shot {src}→{tgt}, the first sentences:")
        for i in range(min(n, len(outs["baseline"]))):
            if sources:
                lines += [f"  source    {sources[i]}", f"  reference {refs[i]}"]
            lines += [f"  Baseline  {outs['baseline'][i]}", f"  FCLL      {outs['fcll'][i]}", ""]
    return lines


def summary(report_dir: Path, full: Path, split: str, corpus: Path | None, runs: Path | None) -> str:
    report = json.loads((report_dir / f"{split}.json").read_text())
    now = scores(report)
    names = {v: s["name"] for v, s in now.items()}
    out = ["", "== The quickstart in ten seconds ==", "",
           f"{'':10s} {'supervised BLEU':>16s} {'zero-shot BLEU':>15s} {'zero-shot off-target':>21s}"]
    for variant, s in now.items():
        out.append(f"{variant:10s} {s['sup_bleu']:16.2f} {s['zs_bleu']:15.2f} {s['zs_off']:20.1f}%")
    steps = {v: trained(runs or report_dir / "records", v) for v in MODELS}
    done = ", ".join(f"{v} {s[0]:,} steps ({s[1]:.0f} min)" for v, s in steps.items() if s)
    effect = first_effect(full / "records")
    least = min((s[0] for s in steps.values() if s), default=0)
    out += ["", f"Trained: {done or 'unknown'}."]
    if effect and least < effect["step"]:
        out.append(f"What this means: far from convergence. The effect (FCLL answering zero-shot in the right "
                   f"language more often than the Baseline) needs about {effect['step']:,} steps of these recipes; "
                   f"below that both models still learn the supervised directions, and tables of BLEU near 0 with "
                   f"high off-target are expected.")
    elif effect:
        out.append("What this means: past the budget where the effect first shows in the study's records; "
                   "compare with the full training below.")
    full_report = full / f"{split}.json"
    if full_report.is_file():
        ref = scores(json.loads(full_report.read_text()))
        line = "; ".join(f"{v} supervised BLEU {s['sup_bleu']:.1f}, zero-shot BLEU {s['zs_bleu']:.2f}, "
                         f"off-target {s['zs_off']:.1f}%" for v, s in ref.items())
        out.append(f"Trained in full (4,200 steps, {full}): {line}.")
    out.append("")
    out += examples(report_dir, split, corpus, names) if len(names) == 2 else []
    if effect:
        out.append(f"To see the effect yourself: it first shows at step {effect['step']:,} of the study's records "
                   f"(validation: Baseline {effect['baseline_off']:.0f}% against FCLL {effect['fcll_off']:.0f}% "
                   f"zero-shot off-target, BLEU {effect['bleu']:.0f}), after {effect['minutes']:.0f} minutes a "
                   f"model ({effect['hardware'] or 'the study CPU'}; two models training at once, one core each): "
                   f"QUICKSTART_MINUTES={5 * -(-int(effect['minutes']) // 5)} make quickstart (a CPU without "
                   f"avx512_bf16 needs about three times as long), or a GPU.")
    out.append("Compare the two models in the browser: make demo")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", required=True, help="the quickstart's cll-repro report folder")
    p.add_argument("--full", default=str(ROOT / "docs" / "results" / "centered-seeds"),
                   help="the committed study of the same recipes, trained in full")
    p.add_argument("--runs", help="the quickstart's run directories (default: the report's records)")
    p.add_argument("--corpus", help="the Multi30k directory, for the example sources and references")
    p.add_argument("--split", default="test_2016_flickr")
    args = p.parse_args(argv)
    print(summary(Path(args.report), Path(args.full), args.split, Path(args.corpus) if args.corpus else None,
                  Path(args.runs) if args.runs else None), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

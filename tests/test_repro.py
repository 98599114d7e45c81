"""cll-repro end to end at the `tiny` size: shards, training of two variants over two seeds,
evaluation, the report with mean ± std over seeds — and a second run that trains nothing and
decodes nothing, while a changed decoding setting is evaluated afresh, and a lost evaluation of one
model is redone for that model only."""
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_train import ENV


@pytest.mark.integration
def test_repro_writes_the_report_and_resumes(multi30k, tmp_path):
    # A step budget, so that what each model reaches does not depend on how busy the machine is:
    # the test runs beside others
    args = [sys.executable, "-m", "cll_scale.repro", "--condition", "triangle", "--variants", "baseline,fcll",
            "--seeds", "1,2", "--parallel", "2",
            "--steps-per-model", "10", "--corpus", str(multi30k), "--shards-root", str(tmp_path / "shards"),
            "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "results"), "--splits", "test_2016_flickr",
            "--max-sentences", "4", "--beam", "1", "--set", "preset=tiny", "--set", "data.batch_tokens=1024",
            "--set", "valid.every=5", "--set", "valid.decode_sentences=3", "--precision", "fp32"]
    first = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    report = (tmp_path / "results" / "triangle-seeds.md").read_text()
    assert "| baseline seed1 |" in report and "| fcll seed2 |" in report and "## test_2016_flickr" in report
    assert "In progress" not in report
    # the report was rewritten as each model ended, naming the ones still to train
    written = [line.split(": ", 1)[1] for line in first.stderr.splitlines() if line.startswith("[cll-repro] wrote ")]
    assert [w.split(" models")[0] for w in written] == [f"{k} of 4" for k in (1, 2, 3, 4)], written
    assert all(w.count("seed") == 3 - k for k, w in enumerate(written)), written
    # seed 1 of every variant trains first; a seed sets the data order and the initialisation
    order = [line.split("--run-dir ")[1].split()[0].rsplit("/", 1)[1] for line in first.stderr.splitlines()
             if line.startswith("[cll-repro]") and "--run-dir" in line]
    assert order == [f"multi30k-triangle-{v}-seed{s}" for s in (1, 2) for v in ("baseline", "fcll")]
    for seed in (1, 2):
        recorded = json.loads((tmp_path / "runs" / f"multi30k-triangle-fcll-seed{seed}" / "config.json").read_text())
        assert recorded["train"]["seed"] == recorded["data"]["seed"] == seed
        # two at a time: each run's output went to its own log
        assert "[cll-train]" in (tmp_path / "runs" / f"multi30k-triangle-baseline-seed{seed}" / "train.log").read_text()
    # the mean ± std row of each variant is computed from its seeds' rows
    evaluated = json.loads((tmp_path / "results" / "triangle-seeds" / "test_2016_flickr.json").read_text())["models"]
    sup = [evaluated[f"fcll seed{s}"]["averages"]["supervised"]["bleu"] for s in (1, 2)]
    mean, std = sum(sup) / 2, abs(sup[0] - sup[1]) / 2 ** 0.5
    assert "| fcll | 2 |" in report and f"{mean:.2f} ± {std:.2f} |" in report
    assert "fr-de" in report and "zero-shot" in report and "Hardware:" in report
    # every model tested against the first on the same sentences, per direction group
    paired = json.loads((tmp_path / "results" / "triangle-seeds" / "test_2016_flickr_significance.json").read_text())
    tested = {(c["model"], c["group"]) for c in paired["comparisons"]}
    assert tested == {(f"{v} seed{s}", g) for v, s in (("fcll", 1), ("baseline", 2), ("fcll", 2))
                      for g in ("supervised", "zero-shot")}
    assert all(c["against"] == "baseline seed1" and 0 < c["bleu_p"] <= 1 and 0 < c["off_target_p"] <= 1
               for c in paired["comparisons"])
    assert "| fcll seed1 | baseline seed1 | zero-shot | 12 |" in report and "bs:1000" in report
    assert (tmp_path / "results" / "triangle-seeds" / "test_2016_flickr_bleu_offtarget.png").is_file()
    assert (tmp_path / "results" / "triangle-seeds" / "validation_over_training.png").is_file()
    # ... and its numbers: each model's validated steps, off-target / BLEU
    curve = [json.loads(x) for x in (tmp_path / "runs" / "multi30k-triangle-fcll-seed1" / "metrics.jsonl")
             .read_text().splitlines() if "valid_zero_shot_offtarget" in x]
    row = next(x for x in report.splitlines() if x.startswith("| fcll seed1 | ") and " / " in x)
    assert row.count(" / ") == len(curve) >= 1
    assert f"{curve[-1]['valid_zero_shot_offtarget']:.0f} / {curve[-1]['valid_bleu']:.1f}" in row
    # The quickstart's summary of such a report (misuse round 2, finding 23; issue 52)
    summary = subprocess.run([sys.executable, "scripts/quickstart_summary.py", "--report",
                              str(tmp_path / "results" / "triangle-seeds"), "--runs", str(tmp_path / "runs"),
                              "--corpus", str(multi30k), "--condition", "triangle"],
                             cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert summary.returncode == 0, summary.stderr[-3000:]
    text = summary.stdout
    avg = evaluated["fcll seed1"]["averages"]
    row = next(line for line in text.splitlines() if line.startswith("fcll "))
    assert f"{avg['supervised']['bleu']:16.2f} {avg['zero-shot']['bleu']:15.2f}" in row and row.endswith("of 12")
    assert ("The effect shows" in text or "The effect does not show yet" in text)
    zero = next(c for c in paired["comparisons"] if c["model"] == "fcll seed1" and c["group"] == "zero-shot")
    assert f"(p {zero['bleu_p']:.4f})" in text and f"(p {zero['off_target_p']:.2g})" in text
    assert "sacreBLEU: nrefs:1" in text and "Paired tests: nrefs:1" in text and "bs:1000" in text
    assert "Zero-shot sentences the Baseline answers in another language and FCLL in the right one:" in text
    assert "Trained longer (the committed records, one seed):" in text and "  4,200 steps" in text
    assert "make demo" in text and "cll-repro --condition triangle" in text and "On a GPU" in text
    assert (tmp_path / "results" / "triangle-seeds" / "quickstart.png").stat().st_size > 10_000
    second = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr.count("finished") == 4 and "cll_scale.train" not in second.stderr
    assert "reusing" in second.stderr and "evaluating on" not in second.stderr
    assert (tmp_path / "results" / "triangle-seeds.md").read_text() == report
    # A fresh machine: the run directories are gone, the records beside the report are not. The
    # same command trains and decodes nothing and writes the same report from them.
    records = tmp_path / "results" / "triangle-seeds" / "records"
    assert sorted(p.name for p in records.iterdir()) == sorted(order)
    kept = json.loads((records / "multi30k-triangle-fcll-seed2" / "record.json").read_text())
    assert kept["overrides"][:2] == ["train.seed=2", "data.seed=2"] and kept["recipe"] == "multi30k_triangle_fcll.yaml"
    # the software the run trained with, kept beside its git commit
    trained_with = json.loads((records / "multi30k-triangle-fcll-seed2" / "versions.json").read_text())
    assert {"python", "torch", "deepspeed", "sacrebleu", "langdetect", "lingua", "hardware"} <= set(trained_with)
    assert not list(records.rglob("*.pt")) and not list(records.rglob("checkpoints"))
    (tmp_path / "runs").rename(tmp_path / "runs-gone")
    fresh = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert fresh.stderr.count("using its record") == 4 and "cll_scale.train" not in fresh.stderr
    assert "evaluating on" not in fresh.stderr
    assert (tmp_path / "results" / "triangle-seeds.md").read_text() == report
    # ... and a record cannot be decoded again: other decoding settings are refused with the reason
    refused = subprocess.run(args + ["--eval-only", "--beam", "2"], cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=900)
    assert refused.returncode != 0 and "only its record is left" in refused.stderr
    assert '"beam": 1' in refused.stderr           # it says what the record was evaluated with
    (tmp_path / "runs-gone").rename(tmp_path / "runs")
    third = subprocess.run(args + ["--eval-only", "--beam", "2"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=900)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "evaluating on test_2016_flickr" in third.stderr and "reusing" not in third.stderr
    # Each model's evaluation is kept on its own: with one of them gone, only that model decodes.
    (tmp_path / "results" / "triangle-seeds" / "evaluated" / "test_2016_flickr" / "fcll_seed2.json").unlink()
    fourth = subprocess.run(args + ["--eval-only", "--beam", "2"], cwd=ROOT, env=ENV, capture_output=True,
                            text=True, timeout=900)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert [x for x in fourth.stderr.splitlines() if "evaluating on" in x] == \
        ["[cll-repro] evaluating on test_2016_flickr: fcll seed2"]
    assert fourth.stderr.count("reusing") == 3
    merged = json.loads((tmp_path / "results" / "triangle-seeds" / "test_2016_flickr.json").read_text())["models"]
    assert {f"{v} seed{s}" for v in ("baseline", "fcll") for s in (1, 2)} <= set(merged)


def test_results_script_merges_the_runs_own_evaluations(tmp_path):
    """scripts/results.py builds the back-translation and extension tables from the before/after
    reports cll-bt and cll-extend wrote (no model decoded twice); beams that differ are refused."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from results import merged_table
    from cll_scale.evaluation.report import EvalReport
    report = json.loads((ROOT / "docs" / "results" / "triangle" / "test_2016_flickr.json").read_text())
    raw = {**report, "models": {"before": report["models"]["baseline"], "after 2 BT epochs": report["models"]["fcll"]}}
    run = lambda **kw: EvalReport.from_json({**raw, **kw})                  # noqa: E731  (each its own copy)
    table, *plots = merged_table({"baseline": run(), "fcll": run()}, {"before": "", "after 2 BT epochs": " + BT"},
                                 tmp_path / "bt")
    merged = json.loads((tmp_path / "bt" / "results.json").read_text())
    assert list(merged["models"]) == ["baseline", "baseline + BT", "fcll", "fcll + BT"]
    assert merged["models"]["fcll + BT"] == run().models["after 2 BT epochs"].to_json() and "| fcll + BT |" in table
    # the markdown links the plots by a path relative to the folder that holds it and `bt/`
    assert plots == ["![BLEU and off-target](bt/bleu_offtarget.png)", "![learned t_l](bt/t_weights.png)"]
    assert all((tmp_path / "bt" / png).is_file() for png in ("bleu_offtarget.png", "t_weights.png"))
    with pytest.raises(SystemExit, match="beam"):
        merged_table({"baseline": run(), "fcll": run(beam=1)}, {}, tmp_path / "other")


def test_extension_summary_keeps_old_and_new_directions_apart():
    """Read the triangle report as if cs were the new language: de-fr (supervised) and fr-de
    (zero-shot) are old; fr-cs, cs-de supervised and cs-fr, de-cs zero-shot are new. A model
    evaluated on the old directions only gets dashes, not averages of nothing."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from results import extension_summary

    from cll_scale.evaluation.report import EvalReport
    report = json.loads((ROOT / "docs" / "results" / "triangle" / "test_2016_flickr.json").read_text())
    full = report["models"]["fcll"]
    by = {d["direction"]: d for d in full["directions"]}
    old_only = {**full, "directions": [by["de-fr"], by["fr-de"]]}
    table = extension_summary(EvalReport.from_json({**report, "models": {"original": old_only, "+cs": full}}), "cs")
    head, _, original, extended = table.strip().split("\n")
    assert head.count("|") == 8 and "zero-shot with cs off-target" in head
    mean = lambda *ds: sum(by[d]["bleu"] for d in ds) / len(ds)   # noqa: E731
    cells = [c.strip() for c in extended.split("|")[2:-1]]
    assert cells == [f"{by['de-fr']['bleu']:.2f}", f"{by['fr-de']['bleu']:.2f}", f"{by['fr-de']['off_target']:.2f}%",
                     f"{mean('fr-cs', 'cs-de'):.2f}", f"{mean('cs-fr', 'de-cs'):.2f}",
                     f"{(by['cs-fr']['off_target'] + by['de-cs']['off_target']) / 2:.2f}%"]
    assert [c.strip() for c in original.split("|")[2:-1]][3:] == ["–", "–", "–"]


@pytest.mark.whole_machine
@pytest.mark.integration
def test_sigterm_to_repro_stops_its_trainings_with_a_checkpoint(multi30k, tmp_path):
    """A job scheduler stops cll-repro with SIGTERM: the trainings it runs get it too, save their
    step and end, instead of training on alone with their run directories locked."""
    runs = tmp_path / "runs"
    args = [sys.executable, "-m", "cll_scale.repro", "--condition", "triangle", "--variants", "baseline,fcll",
            "--parallel", "2", "--minutes-per-model", "10", "--corpus", str(multi30k),
            "--shards-root", str(tmp_path / "shards"), "--runs-root", str(runs), "--out", str(tmp_path / "results"),
            "--set", "preset=tiny", "--set", "data.batch_tokens=1024", "--set", "train.ds_config=cpu_fp32.json",
            "--set", "valid.every=100000"]
    proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = [runs / f"multi30k-triangle-{v}" / "metrics.jsonl" for v in ("baseline", "fcll")]
    deadline = time.time() + 600
    while not all(m.is_file() and m.read_text().strip() for m in metrics):   # both are training
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err
    for v in ("baseline", "fcll"):
        log = (runs / f"multi30k-triangle-{v}" / "train.log").read_text()
        assert "stopped by SIGTERM at step" in log and "after saving its checkpoint" in log
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:                                 # the process ended meanwhile
            continue
        if b"cll_scale.train" in argv and any(a.startswith(str(runs).encode()) for a in argv):
            left.append(b" ".join(argv).decode(errors="replace"))
    assert not left, left                               # no training goes on alone


def test_a_record_stands_in_only_for_the_same_recipe_overrides_and_budget(tmp_path):
    """A record (a finished run without its weights) replaces a missing run directory only when the
    recipe's settings (as read: comments and moved names aside), the overrides and the budget are those it was trained with, and never a run
    directory that exists here."""
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.records import finished, training_identity, use_records, write_record
    from cll_scale.repro.report import write_report
    recipe = tmp_path / "multi30k_triangle_fcll.yaml"
    recipe.write_text("preset: tiny\n")
    budget = Budget(steps=10)
    run = tmp_path / "runs" / "multi30k-triangle-fcll-seed1"
    (run / "export").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0, "epoch": 0.1, "elapsed_s": 5.0}) + "\n")
    (run / "export" / "export.json").write_text(json.dumps({"step": 10}))
    (run / "export" / "model.pt").write_bytes(b"weights")
    assert finished(run, budget)
    identity = training_identity(recipe, ["train.seed=1"], budget)
    records = tmp_path / "results" / "records"
    write_record(run, records / run.name, identity)
    assert not (records / run.name / "export" / "model.pt").exists()
    (records / run.name / "export-best").mkdir()            # left from an earlier record of this run
    (records / run.name / "export-best" / "export.json").write_text(json.dumps({"step": 5}))
    write_record(run, records / run.name, identity)
    assert sorted(p.name for p in records.iterdir()) == [run.name]
    assert sorted(str(p.relative_to(records / run.name)) for p in (records / run.name).rglob("*.json")) == \
        ["export/export.json", "record.json"]
    here = {"fcll seed1": run}
    assert use_records(here, {"fcll seed1": identity}, records, budget) == here      # the run is here
    gone = {"fcll seed1": tmp_path / "elsewhere" / run.name}
    assert use_records(gone, {"fcll seed1": identity}, records, budget) == {"fcll seed1": records / run.name}
    other = training_identity(recipe, ["train.seed=1", "optim.lr=1e-4"], budget)
    assert use_records(gone, {"fcll seed1": other}, records, budget) == gone
    longer = Budget(steps=20)
    assert use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1"], longer)}, records, longer) == gone
    recipe.write_text("# reworded\npreset: tiny\n")      # the same settings, other bytes: the record stands
    assert use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1"], budget)}, records,
                       budget) == {"fcll seed1": records / run.name}
    recipe.write_text("preset: small\n")                  # the recipe changed since
    assert use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1"], budget)}, records,
                       budget) == gone
    # a record of before the settings' hash is known by the recipe's bytes alone
    recipe.write_text("preset: tiny\ntrain:\n  log_every: 5\n")
    legacy = {k: v for k, v in training_identity(recipe, ["train.seed=1"], budget).items()
              if k != "recipe_settings_sha256"}
    write_record(run, records / run.name, legacy)
    assert use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1"], budget)}, records,
                       budget) == {"fcll seed1": records / run.name}
    recipe.write_text("preset: tiny\nlog:\n  every: 5\n")  # the same settings, moved to their section
    assert use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1"], budget)}, records,
                       budget) == gone
    write_record(run, records / run.name, training_identity(recipe, ["train.seed=1"], budget))
    recipe.write_text("preset: tiny\ntrain:\n  log_every: 5\n")
    assert use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1"], budget)}, records,
                       budget) == {"fcll seed1": records / run.name}
    # a report written part-way through a study names what it still lacks
    report = write_report("triangle", "triangle-seeds", {"fcll seed1": records / run.name}, {}, budget, "cll-repro",
                          tmp_path / "results", {"fcll": ["fcll seed1", "fcll seed2"]}, ["fcll seed2"])
    text = report.read_text()
    assert "**In progress: 1 of 2 models.** Still to train: fcll seed2." in text and "| fcll seed1 | 10 |" in text


def test_a_study_keeps_the_training_rules_it_was_begun_with(tmp_path):
    """The study recipes of before issue 34 name neither data.mixing nor model.lsl_dropout, so their
    records mean the old rules and today's defaults are the authors'. Adding seeds today must not
    mix the two silently: refused with the --set that continues the study as trained, and that
    --set keeps the records (it restates their own rules). Recipes that name their rules (the
    diagnostics) may differ from each other."""
    from cll_scale.run.recipe import training_rules
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.records import check_one_rule, recipe_rules, recorded_rules, training_identity, use_records, \
        write_record
    assert training_rules({}, recorded=True) == {"model.lsl_dropout": "double", "data.mixing": "direction"}
    assert training_rules({}, recorded=False) == {"model.lsl_dropout": "authors", "data.mixing": "mixed"}
    recipe = tmp_path / "multi30k_triangle_fcll.yaml"
    recipe.write_text("preset: tiny\nmodel:\n  variant: fcll\n")
    budget = Budget(steps=10)
    seed1 = tmp_path / "runs" / "multi30k-triangle-fcll-seed1"
    (seed1 / "export").mkdir(parents=True)
    (seed1 / "config.json").write_text(json.dumps({"model": {"variant": "fcll"}, "data": {"seed": 1}}))
    (seed1 / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0, "epoch": 0.1, "elapsed_s": 5.0}) + "\n")
    (seed1 / "export" / "export.json").write_text(json.dumps({"step": 10}))
    assert recorded_rules(seed1) == {"model.lsl_dropout": "double", "data.mixing": "direction"}
    records = tmp_path / "results" / "records"
    write_record(seed1, records / seed1.name, training_identity(recipe, ["train.seed=1"], budget))
    runs = {"fcll seed1": seed1, "fcll seed2": tmp_path / "runs" / "multi30k-triangle-fcll-seed2"}
    old_rules = ["data.mixing=direction", "model.lsl_dropout=double"]

    def rules(*extra):
        return {name: recipe_rules(recipe, [f"train.seed={name[-1]}", *extra]) for name in runs}

    with pytest.raises(ValueError, match=r"model.lsl_dropout double: fcll seed1 \(trained\); authors: fcll seed2 "
                                         r"\(this sitting\) \| data.mixing direction: .*; mixed: .*"
                                         r"--set model.lsl_dropout=double --set data.mixing=direction"):
        check_one_rule(runs, rules(), ["fcll seed2"])
    check_one_rule(runs, rules(*old_rules), ["fcll seed2"])
    # a run begun under the old rules and resumed under today's is refused as well
    with pytest.raises(ValueError, match=r"double: fcll seed1 \(trained\); authors: fcll seed1 \(this sitting\)"):
        check_one_rule(runs, rules(), ["fcll seed1"])
    # the restating --set keeps seed 1's record; another rule does not
    gone = {"fcll seed1": tmp_path / "elsewhere" / seed1.name}
    kept = use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1", *old_rules], budget)},
                       records, budget)
    assert kept == {"fcll seed1": records / seed1.name}
    assert use_records(gone, {"fcll seed1": training_identity(recipe, ["train.seed=1", "data.mixing=mixed"], budget)},
                       records, budget) == gone
    # a recipe that names its rules may differ from the others (the diagnostics' one-direction models)
    named = tmp_path / "multi30k_triangle_fcll_onedir.yaml"
    named.write_text("preset: tiny\ndata:\n  mixing: direction\n")
    diag = {"fcll": seed1, "fcll_onedir": tmp_path / "runs" / "onedir"}
    (seed1 / "config.json").write_text(json.dumps({"model": {"lsl_dropout": "authors"}, "data": {"mixing": "mixed"}}))
    check_one_rule(diag, {"fcll": recipe_rules(recipe, []), "fcll_onedir": recipe_rules(named, [])}, ["fcll_onedir"])


def test_a_study_trains_in_one_precision_unless_told(tmp_path, capsys):
    """A study whose models were trained in bf16 (on a CPU with avx512_bf16) and whose rest this
    machine would train in fp32 is refused, with each precision's models named, and so is a run
    begun in one precision and resumed in another; --allow-mixed-precision lets it go on, and the
    report names each model's precision."""
    from cll_scale.training.precision import default_ds_config, precision
    from cll_scale.core.hardware import hardware
    from cll_scale.repro.plan import planned_precision
    from cll_scale.training.precision import trained_precision
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.records import check_one_precision
    from cll_scale.repro.report import write_report
    recipe = tmp_path / "multi30k_triangle_fcll.yaml"
    recipe.write_text("preset: tiny\ntrain:\n  ds_config: cpu_fp32.json\n")
    assert planned_precision(recipe, [])[0] == "fp32"
    assert planned_precision(recipe, []) == ("fp32", "named by the recipe")
    assert planned_precision(recipe, ["train.ds_config=cpu_bf16.json"]) == ("bf16",
                                                                         "--set train.ds_config=cpu_bf16.json")
    assert planned_precision(recipe, ["train.ds_config=cpu_bf16.json"], "fp32") == ("fp32", "--precision fp32")
    auto = tmp_path / "multi30k_triangle_baseline.yaml"
    auto.write_text("preset: tiny\n")                      # auto: what this machine's probe picks
    assert planned_precision(auto, [])[0] == precision(json.loads(default_ds_config()[0].read_text()))
    budget = Budget(steps=10)
    seed1, seed2 = tmp_path / "runs" / "fcll-seed1", tmp_path / "runs" / "fcll-seed2"
    (seed1 / "export").mkdir(parents=True)
    (seed1 / "ds_config.json").write_text(json.dumps({"bf16": {"enabled": True}}))
    (seed1 / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0, "epoch": 0.1, "elapsed_s": 5.0}) + "\n")
    (seed1 / "export" / "export.json").write_text(json.dumps({"step": 10}))
    runs = {"fcll seed1": seed1, "fcll seed2": seed2}
    assert trained_precision(seed1) == "bf16" and trained_precision(seed2) is None
    fp32 = {"fcll seed2": planned_precision(recipe, [])}
    with pytest.raises(ValueError, match=r"bf16: fcll seed1 \(trained\); fp32: fcll seed2 \(this sitting.*"
                                         r"pass --precision bf16 to train the rest in the study's precision"):
        check_one_precision(runs, fp32, allow=False)
    # what --precision asks reaches the trainings, not the models' identity or their compared settings
    from cll_scale.training.precision import ds_config_of
    from cll_scale.repro.records import recorded_differences
    from cll_scale.repro.study import Study
    asked = Study("triangle", ["fcll"], tmp_path, tmp_path, tmp_path, tmp_path, tmp_path, None, precision="bf16")
    assert planned_precision(auto, asked.engine_overrides)[0] == "bf16"
    assert asked.engine_overrides == [f"train.ds_config={ds_config_of('bf16')}"] and \
        ds_config_of("fp32") == "cpu_fp32.json" and ds_config_of("auto") == "auto"
    with pytest.raises(ValueError, match="precision must be one of auto, bf16, fp32, not 'fp16'"):
        ds_config_of("fp16")
    (seed1 / "config.json").write_text(json.dumps({"train": {"ds_config": "cpu_bf16.json", "seed": 1}}))
    assert recorded_differences(seed1, auto, ["train.ds_config=auto"]) == []
    assert recorded_differences(seed1, auto, ["train.seed=2"]) == ["train.seed=2 (trained with 1)"]
    check_one_precision(runs, fp32, allow=True)
    assert "warning: this study mixes precisions (bf16: fcll seed1 (trained); fp32: fcll seed2" in \
        capsys.readouterr().err
    check_one_precision(runs, {"fcll seed2": ("bf16", "named by the recipe")}, allow=False)
    # begun in fp32 here, it would be resumed in bf16 elsewhere
    seed2.mkdir()
    (seed2 / "ds_config.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    with pytest.raises(ValueError, match=r"fp32: fcll seed2 \(trained so far\); bf16: fcll seed2"):
        check_one_precision({"fcll seed2": seed2}, {"fcll seed2": ("bf16", "named by the recipe")}, allow=False)
    check_one_precision({"fcll seed2": seed2}, fp32, allow=False)            # resumed as it began
    text = write_report("triangle", "triangle-seeds", {"fcll seed1": seed1}, {}, budget, "cll-repro",
                        tmp_path / "results", {"fcll": ["fcll seed1"]}).read_text()
    assert f"Hardware: {hardware()}; bf16." in text


@pytest.mark.whole_machine
@pytest.mark.integration
@pytest.mark.parametrize("overlap", [True, False], ids=["gpu-overlap", "cpu-waits"])
def test_each_training_is_settled_as_it_ends_while_the_others_go_on(tmp_path, overlap):
    """train_all calls done(name) as each training ends well (cll-repro evaluates and records the
    model then, so a sitting cut short keeps the finished ones), while the longer one still runs.
    With overlap (a GPU) the freed slot has already taken the next training; without it (CPU, where
    an evaluation and a training contend for the same cores) the slot stays empty until done
    returns."""
    from cll_scale.repro.scheduler import StepFailed, train_all

    def job(name, seconds, code=0):
        mark = str(tmp_path / name)
        script = f"import pathlib, sys, time; pathlib.Path({mark!r}).touch(); time.sleep({seconds}); " \
                 f"pathlib.Path({mark + '.end'!r}).touch(); sys.exit({code})"
        return name, tmp_path / f"run-{name}", [sys.executable, "-c", script]

    calls = []

    def done(name):
        calls.append(name)
        if name != "short":
            return
        assert (tmp_path / "long").exists() and not (tmp_path / "long.end").exists()   # still running
        if overlap:
            deadline = time.time() + 10
            while not (tmp_path / "next").exists():     # the freed slot already took "next"
                assert time.time() < deadline
                time.sleep(0.05)
        else:
            time.sleep(1.0)                             # an evaluation: the slot stays free
            assert not (tmp_path / "next").exists()

    started = time.time()
    train_all([job("short", 0.2), job("long", 4), job("next", 0.2)], parallel=2, done=done, overlap=overlap)
    assert calls[0] == "short" and sorted(calls) == ["long", "next", "short"] and time.time() - started < 30
    assert (tmp_path / "next.end").exists()
    with pytest.raises(StepFailed, match="training broken"):
        train_all([job("broken", 0, code=3)], parallel=1, done=calls.append, overlap=overlap)
    assert calls[-1] != "broken"


def test_each_settings_family_finds_its_own_four_triangle_recipes():
    """`--settings small / paper / paper_small` each find the four variants of the study, and no
    other family's recipe (the prefixes nest: ``paper_small_fcll`` starts like ``paper_*``); each
    recipe resolves to what its family promises."""
    from cll_scale.run.recipe import build_configs, load_recipe
    from cll_scale.data.manifest import TokenizerInfo
    from cll_scale.repro.plan import recipe_files, settings_suffix
    tok = TokenizerInfo("spm.model", "", 8000, 0, 1, 2, 3, {})
    for settings in ("small", "paper", "paper_small"):
        found = recipe_files(ROOT / "recipes", "triangle", settings)
        assert sorted(found) == ["baseline", "fcll", "sd", "sd_attn"], (settings, found)
        for variant, path in found.items():
            cfg = build_configs(load_recipe(path), ["de", "fr", "cs"], None, tok)
            model, train, optim = cfg.model, cfg.train, cfg.optim
            assert train.run_dir.endswith(f"multi30k-triangle{settings_suffix(settings)}-{variant}"), path
            assert model.variant == {"sd_attn": "sd"}.get(variant, variant)
            assert model.residual_sublayer == {"sd": "ffn", "sd_attn": "self_attn"}.get(variant), path
            authors = (not model.pre_norm, model.init, model.dropout, model.cll_dropout, model.lsl_dim,
                       optim.lr, optim.weight_decay)
            if settings == "small":
                assert (model.d_model, model.encoder_layers) == (256, 3) and not authors[0], path
            else:     # the authors' code: post-norm, Xavier, dropout 0.3, LSL inner 2·d, their optimiser
                assert authors == (True, "xavier", 0.3, 0.3, 2 * model.d_model, 5e-4, 1e-4), path
                assert (model.d_model, model.encoder_layers) == ((512, 5) if settings == "paper" else (256, 3))


def test_the_diagnostics_recipes_name_every_rule_they_test():
    """Issue 34's diagnostics: each question's recipe names data.mixing and model.lsl_dropout, so
    it means the same whatever the defaults become, and differs from the controls only in them."""
    from cll_scale.run.recipe import build_configs, load_recipe
    from cll_scale.data.manifest import TokenizerInfo
    from cll_scale.repro.plan import SETTINGS, recipe_files
    assert "diagnostics" in SETTINGS
    tok = TokenizerInfo("spm.model", "", 8000, 0, 1, 2, 3, {})
    found = recipe_files(ROOT / "recipes", "triangle", "diagnostics")
    assert sorted(found) == ["baseline", "baseline_half", "baseline_onedir", "baseline_postnorm", "fcll",
                             "fcll_double", "fcll_half", "fcll_onedir", "fcll_postnorm", "residual"]
    for condition in ("square", "cycle", "centered", "centered-cycle"):
        # the same settings as the triangle's controls: the condition is the one difference
        other = recipe_files(ROOT / "recipes", condition, "diagnostics")
        assert sorted(other) == ["baseline", "fcll"]
        for variant, path in other.items():
            assert {**load_recipe(path), "train": {}} == {**load_recipe(found[variant]), "train": {}}, path
    resolved = {}
    for variant, path in found.items():
        raw = load_recipe(path)
        assert {"mixing"} <= set(raw["data"]) and {"lsl_dropout"} <= set(raw["model"]), path
        resolved[variant] = build_configs(raw, ["de", "fr", "cs"], None, tok)
    rules = {v: (c.model.variant, c.data.mixing, c.model.lsl_dropout, c.data.rows_fraction, c.model.residual_sublayer)
             for v, c in resolved.items()}
    assert rules["fcll_double"] == ("fcll", "direction", "double", 1.0, None)     # the study's rules
    assert rules["fcll_onedir"] == ("fcll", "direction", "authors", 1.0, None)
    assert rules["fcll"] == ("fcll", "mixed", "authors", 1.0, None)
    assert rules["residual"] == ("residual", "mixed", "authors", 1.0, "self_attn")
    assert rules["fcll_half"][3] == rules["baseline_half"][3] == 0.5
    # issue 50, question b: post-norm and nothing else changed
    for variant in ("baseline", "fcll"):
        post, pre = resolved[f"{variant}_postnorm"], resolved[variant]
        assert (post.model.pre_norm, pre.model.pre_norm) == (False, True)
        assert dataclasses.replace(post.model, pre_norm=True) == pre.model and post.data == pre.data
    assert len({(c.optim.lr, c.optim.warmup_steps, c.train.seed, c.data.seed, c.data.batch_tokens)
                for c in resolved.values()}) == 1


def test_the_quickstart_recipes_differ_in_the_variant_alone_at_the_documented_settings():
    """Issue 65: make quickstart's two recipes train the same `mini` model and schedule, differing
    in the CLL variant alone, with the settings their comments and docs/usage.md give."""
    from cll_scale.model.config import PRESETS
    from cll_scale.run.recipe import build_configs, load_recipe
    from cll_scale.data.manifest import TokenizerInfo
    from cll_scale.repro.plan import recipe_files
    tok = TokenizerInfo("spm.model", "", 8000, 0, 1, 2, 3, {})
    quick = recipe_files(ROOT / "recipes", "triangle", "quickstart")
    assert sorted(quick) == ["baseline", "fcll"]
    q = {v: build_configs(load_recipe(path), ["de", "fr", "cs"], None, tok) for v, path in quick.items()}
    b, f = q["baseline"], q["fcll"]
    assert (b.model.variant, f.model.variant) == ("baseline", "fcll")
    assert dataclasses.replace(b.model, variant="fcll") == f.model
    assert (b.data, b.optim, b.train.seed) == (f.data, f.optim, f.train.seed)
    assert {k: getattr(b.model, k) for k in PRESETS["mini"]} == PRESETS["mini"] and b.model.dropout == 0.1
    assert (b.data.batch_tokens, b.optim.lr, b.optim.warmup_steps, b.valid.decode_sentences) == (1024, 3e-3, 400, 0)
    for variant, c in q.items():
        assert c.train.run_dir.endswith(f"multi30k-triangle-quickstart-{variant}")


def test_a_rerun_with_another_set_is_refused_naming_each_difference(tmp_path):
    """A finished model is never reported under settings it was not trained with (misuse round 2,
    finding 3): the run's config.json is compared with the recipe and every --set."""
    from cll_scale.repro.records import check_trained_settings
    recipe = tmp_path / "multi30k_triangle_fcll.yaml"
    recipe.write_text("preset: tiny\nmodel:\n  lsl_dim: 16\ntrain:\n  lr: 1.0e-3\n  max_minutes: 90\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {"lsl_dim": 16}, "data": {"seed": 1},
                                                 "train": {"lr": 0.001, "max_minutes": 0.0}}))
    runs, recipes = {"fcll": run}, {"fcll": recipe}
    check_trained_settings(runs, recipes, {"fcll": []}, [])              # as trained (budgets aside)
    check_trained_settings(runs, recipes, {"fcll": []}, ["data.seed=1", "optim.lr=1e-3"])
    with pytest.raises(ValueError) as err:
        check_trained_settings(runs, recipes, {"fcll": []}, ["model.lsl_dim=8", "optim.lr=0.5"])
    assert "fcll: model.lsl_dim=8 (trained with 16), optim.lr=0.5 (trained with 0.001)" in str(err.value)
    assert "another --runs-root" in str(err.value)


def test_the_table6_row2_page_shows_what_its_script_reads_and_the_verdict_follows_the_reading(capsys):
    """docs/results/table6-row2.md's table is the one scripts/table6_row2_table.py prints from the
    committed reports, and its verdict is the rule written before training: the off-target falls
    by more than twice the seed spread and the zero-shot BLEU rises, or the row does not hold."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from table6_row2_table import main, verdict
    assert main([str(ROOT / "docs" / "results" / "table6-row2")]) == 0
    table = capsys.readouterr().out.split("\n\n")[0].strip()
    assert table.count("\n") == 9 and table in (ROOT / "docs" / "results" / "table6-row2.md").read_text()
    centered = {"mean_off": 75.3, "mean_bleu": 0.64}
    split = "test_2016_flickr"                      # the Baseline's bar there: 2 x 4.7 points
    assert verdict("baseline", split, centered, {"mean_off": 65.8, "mean_bleu": 0.7}).endswith("holds in direction")
    assert verdict("baseline", split, centered, {"mean_off": 66.0, "mean_bleu": 2.0}).endswith("does not hold")
    assert verdict("baseline", split, centered, {"mean_off": 40.0, "mean_bleu": 0.6}).endswith("does not hold")
    assert verdict("baseline", split, centered, None).startswith("not read yet")


def test_study_table_averages_each_settings_seeds(tmp_path):
    """scripts/study_table.py puts the settings' seed reports side by side: per variant the mean ±
    sample std over its seeds, the LSL-off row after its model, the study's order whatever the
    report's, a dash where a seed lacks a figure, the validation curve from the records, the
    off-target at equal validation NLL (interpolated between validations), and a clear error for a
    report without seeds or a bad --at-nll."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from study_table import curve_table, load, main, nll_table, table
    report = json.loads((ROOT / "docs" / "results" / "triangle-seeds" / "test_2016_flickr.json").read_text())
    a, b = report["models"]["baseline seed1"], report["models"]["fcll seed1"]
    no_lingua = {**b, "averages": {g: {k: v for k, v in row.items() if not k.startswith("lingua")}
                                   for g, row in b["averages"].items()}}
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "test_2016_flickr.json").write_text(json.dumps({**report, "models": {
        "sd_attn seed1": a, "fcll seed1 (LSL off)": b, "baseline seed2": b, "baseline seed1": a,
        "fcll seed1": a, "fcll seed2": no_lingua}}))
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "test_2016_flickr.json").write_text(json.dumps({**report, "models": {"baseline seed3": b}}))
    rows = table({"small": tmp_path / "one", "paper_small": tmp_path / "two"}, "test_2016_flickr").splitlines()[2:]
    cells = [[c.strip() for c in row.split("|")[1:-1]] for row in rows]
    assert [c[:3] for c in cells] == [["`small`", "Baseline", "1,2"], ["", "FCLL", "1,2"], ["", "FCLL, LSL off", "1"],
                                      ["", "SD (self-attention residual)", "1"], ["`paper_small`", "Baseline", "3"]]
    off = [m["averages"]["zero-shot"]["off_target"] for m in (a, b)]
    mean, std = sum(off) / 2, abs(off[0] - off[1]) / 2 ** 0.5
    assert cells[0][3].startswith(f"{mean:.2f} ± {std:.2f}% / ")
    lingua = [m["averages"]["zero-shot"]["lingua_off_target"] for m in (a, b)]
    assert cells[0][3].endswith(f"{sum(lingua) / 2:.2f} ± {abs(lingua[0] - lingua[1]) / 2 ** 0.5:.2f}%")
    assert cells[1][3].endswith(" / –") and cells[1][6] == "–"      # fcll seed2 was scored without lingua
    assert cells[4][5] == f"{b['averages']['supervised']['bleu']:.2f}"
    # the validation curve: a step is averaged only where every seed of the variant validated it
    for seed, curve in ((1, {500: (4.0, 11.0), 1000: (3.0, 40.0)}), (2, {500: (3.5, 21.0)})):
        run = tmp_path / "one" / "records" / f"multi30k-triangle-sd_attn-seed{seed}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" + json.dumps(
            {"step": s, "valid_nll": n, "valid_zero_shot_offtarget": v}) + "\n" for s, (n, v) in curve.items()))
    found = load({"small": tmp_path / "one"})
    head, _, row = curve_table(found).splitlines()
    assert head.endswith("| 500 | 1,000 |") and row == "| `small` | SD (self-attention residual) | 1,2 | 16 ± 7% | – |"
    # at equal validation NLL: seed 1 crosses 3.5 halfway from step 500 to 1,000 (off-target 25.5%),
    # seed 2 is there at its first validation (21%); neither seed gets to 2.5
    head, _, row = nll_table(found, [3.5, 2.5]).splitlines()
    assert head.endswith("| NLL 3.5 | NLL 2.5 |")
    assert row == "| `small` | SD (self-attention residual) | 1,2 | 23 ± 3% (step 625) | – |"
    with pytest.raises(SystemExit):
        main([f"small={tmp_path / 'one'}", "--at-nll", "2.x"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "test_2016_flickr.json").write_text(json.dumps({**report, "models": {"baseline": a}}))
    assert main([f"x={tmp_path / 'bad'}", "--splits", "test_2016_flickr"]) == 1
    assert main([f"x={tmp_path / 'absent'}"]) == 1


def test_cll_layer_sets_follow_paper_fig4_and_keep_the_variants_encoder():
    """``--cll-layers sweep``: every layer, then the lowest removed one at a time, then the
    highest; SD's models keep its residual change, FCLL's have none, and a model without CLL is
    refused before anything is built."""
    from cll_scale.repro.plan import cll_layer_sets, layer_sweep
    assert cll_layer_sets("sweep", 3) == [(0, 1, 2), (1, 2), (2,), (0, 1), (0,)]
    assert len(cll_layer_sets("sweep", 6)) == 11 and cll_layer_sets("0-1,2", 3) == [(0, 1), (2,)]
    for bad in ("3", "2-0", "1,1", "-1", "x", ""):
        with pytest.raises(ValueError, match="--cll-layers"):
            cll_layer_sets(bad, 3)
    sd = dict(layer_sweep("sd", ROOT / "recipes" / "multi30k_triangle_sd.yaml", [], "1-2"))
    assert sd == {"sd cll1-2": ["model.variant=custom", "model.cll_layers=[1,2]", "model.residual_sublayer=ffn",
                                "model.residual_layer=1"]}
    fcll = dict(layer_sweep("fcll", ROOT / "recipes" / "multi30k_triangle_fcll.yaml", ["preset=tiny"], "sweep"))
    assert fcll == {"fcll cll0-1": ["model.variant=custom", "model.cll_layers=[0,1]"],
                    "fcll cll1": ["model.variant=custom", "model.cll_layers=[1]"],
                    "fcll cll0": ["model.variant=custom", "model.cll_layers=[0]"]}
    with pytest.raises(ValueError, match="no CLL layer"):
        layer_sweep("baseline", ROOT / "recipes" / "multi30k_triangle_baseline.yaml", [], "sweep")


@pytest.mark.integration
def test_cll_layer_sweep_trains_each_set_and_draws_bleu_against_layers(multi30k, tmp_path):
    args = [sys.executable, "-m", "cll_scale.repro", "--condition", "triangle", "--variants", "fcll",
            "--cll-layers", "sweep", "--steps-per-model", "4", "--corpus", str(multi30k),
            "--shards-root", str(tmp_path / "shards"), "--runs-root", str(tmp_path / "runs"),
            "--out", str(tmp_path / "results"), "--splits", "test_2016_flickr", "--max-sentences", "3",
            "--beam", "1", "--set", "preset=tiny", "--set", "data.batch_tokens=1024",
            "--set", "valid.every=1000", "--precision", "bf16"]
    done = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = (tmp_path / "results" / "triangle-cll-layers.md").read_text()
    evaluated = json.loads((tmp_path / "results" / "triangle-cll-layers" / "test_2016_flickr.json").read_text())
    # each model has CLL in its own layers (the results file counts from 1, as the paper), and the figure exists
    assert {n: m["cll_layers"] for n, m in evaluated["models"].items()} == \
        {"fcll cll0-1": [1, 2], "fcll cll1": [2], "fcll cll0": [1]}
    for name, layers in (("cll0-1", [0, 1]), ("cll1", [1]), ("cll0", [0])):
        config = json.loads((tmp_path / "runs" / f"multi30k-triangle-fcll-{name}" / "config.json").read_text())
        assert config["model"]["cll_layers"] == layers and config["model"]["variant"] == "custom"
        # --precision bf16 trains in bf16 on any machine (a CPU without bf16 units: matmuls in fp32)
        engine = json.loads((tmp_path / "runs" / f"multi30k-triangle-fcll-{name}" / "ds_config.json").read_text())
        assert engine["bf16"]["enabled"] and config["train"]["ds_config"].endswith("_bf16.json")
    assert "| fcll cll1 |" in report and "test_2016_flickr_cll_layers.png" in report
    assert (tmp_path / "results" / "triangle-cll-layers" / "test_2016_flickr_cll_layers.png").stat().st_size > 1000


def test_committed_reports_are_rewritten_byte_identically_from_their_records(tmp_path):
    """Every cll-repro report under docs/results that keeps records comes out of today's cll-repro
    byte for byte (markdown and per-split JSON) from its records and cached evaluations alone,
    from the command its own Command: line states: a change to cll-repro that alters a committed
    report fails here, not in the next study's diff."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from rewrite_reports import rewrite, with_records
    reports = with_records(ROOT / "docs" / "results")
    assert {p.stem for p in reports} >= {"triangle-seeds", "centered-seeds", "triangle-paper-small-seeds"}
    for i, report in enumerate(reports):
        path, differ = rewrite(report, tmp_path / str(i))
        assert path.name == report.name and not differ, (report, differ)


def test_a_file_the_committed_report_lacks_counts_as_a_difference(tmp_path):
    """A report committed before a kind of per-split JSON existed (the significance files) is
    said to differ from today's, by that file's name, instead of stopping the comparison."""
    import shutil
    sys.path.insert(0, str(ROOT / "scripts"))
    from rewrite_reports import rewrite
    committed = tmp_path / "committed"
    shutil.copytree(ROOT / "docs" / "results" / "table6-row2", committed)
    (committed / "centered-diagnostics" / "test_2016_flickr_significance.json").unlink()
    _, differ = rewrite(committed / "centered-diagnostics.md", tmp_path / "scratch")
    assert differ == ["test_2016_flickr_significance.json"]


# -- issue 51 (class D): cll-repro and its report script check what they are given first ----------

def test_what_a_study_cannot_do_is_refused_before_anything_trains(multi30k, tmp_path, capsys):
    """Issue 51 row 18: on a corpus without test_2018_flickr the study trained and evaluated
    test_2016_flickr before it said so."""
    from cll_scale.data.shards import BuildConfig, build_shards
    from cll_scale.data.corpora import read_multiway
    from cll_scale.repro.cli import main
    from tests.conftest import head_corpus
    corpus = head_corpus(multi30k, tmp_path / "corpus", lambda name: not name.startswith("test_2018"))
    shards = tmp_path / "shards" / "multi30k-triangle"
    build_shards(read_multiway(corpus, "triangle", ["de", "fr", "cs"]),
                 BuildConfig(out_dir=str(shards), vocab_size=800))
    code = main(["--condition", "triangle", "--steps-per-model", "3", "--corpus", str(corpus),
                 "--shards-root", str(tmp_path / "shards"), "--runs-root", str(tmp_path / "runs"),
                 "--out", str(tmp_path / "results"), "--set", "preset=tiny", "--precision", "fp32",
                 "--max-sentences", "2", "--beam", "1", "--lid-workers", "0"])
    err = capsys.readouterr().err
    assert code == 2 and (f"cll-repro: error: --splits test_2018_flickr: the shards {shards} have no such test split "
                          f"(they have ") in err and "baseline, fcll would be evaluated on it" in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
    # so is a beam wider than the shards' vocabulary (800), which every model shares
    code = main(["--condition", "triangle", "--steps-per-model", "3", "--corpus", str(corpus),
                 "--shards-root", str(tmp_path / "shards"), "--runs-root", str(tmp_path / "runs"),
                 "--out", str(tmp_path / "results"), "--set", "preset=tiny", "--precision", "fp32",
                 "--splits", "test_2016_flickr", "--beam", "801", "--lid-workers", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "cll-repro: error: --beam 801 exceeds this model's vocabulary (800 subwords)" in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
    # and a second study into a report another one is writing (found in the third round): refused
    # with its holder, before it trains
    from cll_scale.core.outputs import DirLock
    held = DirLock(tmp_path / "results" / "triangle", "cll-repro study").acquire()
    try:
        code = main(["--condition", "triangle", "--steps-per-model", "3", "--corpus", str(corpus),
                     "--shards-root", str(tmp_path / "shards"), "--runs-root", str(tmp_path / "runs"),
                     "--out", str(tmp_path / "results"), "--set", "preset=tiny", "--precision", "fp32",
                     "--splits", "test_2016_flickr", "--beam", "1", "--lid-workers", "0"])
    finally:
        held.release()
    err = capsys.readouterr().err
    assert code != 0 and f"{tmp_path / 'results' / 'triangle'} is in use by pid {os.getpid()}" in err, err
    assert not (tmp_path / "runs").exists()


def test_the_precision_refusal_names_the_flag_it_came_from(tmp_path):
    """Issue 51 row 21: fp32 asked by --precision after a bf16 study was said to be "named by the recipe"."""
    from cll_scale.repro.evaluations import EvalSettings
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.study import Reproduction, Study
    recipes, runs = tmp_path / "recipes", tmp_path / "runs"
    recipes.mkdir()
    (recipes / "multi30k_triangle_fcll.yaml").write_text("preset: tiny\ntrain:\n  ds_config: cpu_bf16.json\n")
    begun = runs / "multi30k-triangle-fcll-cll0"                   # trained so far in bf16
    begun.mkdir(parents=True)
    (begun / "ds_config.json").write_text(json.dumps({"bf16": {"enabled": True}}))
    (begun / "metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 1.0, "epoch": 0.1, "elapsed_s": 1.0}) + "\n")
    study = Study("triangle", ["fcll"], tmp_path, tmp_path, runs, recipes, tmp_path / "results",
                  EvalSettings(("test_2016_flickr",)), Budget(steps=10), cll_layers="0,1", precision="fp32")
    with pytest.raises(ValueError) as err:
        Reproduction(study).check()
    assert ("bf16: fcll cll0 (trained so far); fp32: fcll cll0, fcll cll1 (this sitting: --precision fp32)"
            in str(err.value)), err.value
    assert "named by the recipe" not in str(err.value)


@pytest.mark.parametrize("case", ["missing file", "no Command line", "unknown variant", "records moved away"])
def test_rewrite_reports_says_in_one_line_why_a_report_cannot_be_rewritten(tmp_path, capsys, case):
    """Issue 51 rows 22-25: each was a traceback."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from rewrite_reports import main
    report = tmp_path / "triangle-seeds.md"
    if case == "no Command line":
        report.write_text("# A report\n\nNo command here.\n")
    elif case == "unknown variant":
        report.write_text("Command: `cll-repro --condition triangle --variants bogus --steps-per-model 3`\n")
    elif case == "records moved away":           # a committed report, without its folder of records
        report.write_text((ROOT / "docs" / "results" / "triangle-seeds.md").read_text())
    expected = {"missing file": (3, f"{report}: no such report"),
                "no Command line": (2, f"{report}: no `Command: cll-repro ...` line"),
                "unknown variant": (2, f"{report}: its Command: line cannot be run today: --variants bogus: no recipe"),
                "records moved away": (2, f"{report}: none of its 12 models has a record in "
                                          f"{tmp_path / 'triangle-seeds' / 'records'} or a finished run in ")}
    code = main([str(report)])
    err = capsys.readouterr().err
    assert (code, err.count("\n")) == (expected[case][0], 1), err
    assert err.startswith(f"rewrite_reports.py: error: {expected[case][1]}") and "Traceback" not in err, err


def test_omitting_the_tag_of_a_study_without_tags_is_refused_before_it_starts(tmp_path):
    """Issue 51's note, in cll-repro as in cll-eval: --omit-lang-tag where no model trains with
    the tag would add nothing to the report."""
    from cll_scale.repro.evaluations import EvalSettings
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.study import Reproduction, Study
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for variant in ("baseline", "fcll"):
        (recipes / f"multi30k_triangle_{variant}.yaml").write_text("preset: tiny\ndata:\n  add_lang_tag: false\n")

    def study(*overrides):
        return Study("triangle", ["baseline", "fcll"], tmp_path, tmp_path, tmp_path / "runs", recipes, tmp_path / "r",
                     EvalSettings(("test_2016_flickr",), omit_lang_tag=True), Budget(steps=10),
                     overrides=list(overrides), precision="fp32")
    with pytest.raises(ValueError, match=r"--omit-lang-tag: none of the models \(baseline, fcll\) was trained with "
                                         r"language tags"):
        Reproduction(study()).check()
    Reproduction(study("data.add_lang_tag=true")).check()


def test_progress_reads_each_training_and_says_the_time_left(tmp_path):
    """Issue 52: not in a terminal (where a training's own bar is off), cll-repro says how far each
    training has come, with the time left at this sitting's rate, from its metrics.jsonl."""
    import io
    import json as json_
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.progress import Progress
    run = tmp_path / "run"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    out = io.StringIO()
    progress = Progress(Budget(steps=1000), parallel=2, stream=out, every_s=0)

    def at(step, elapsed):
        with metrics.open("a") as f:
            f.write(json_.dumps({"step": step, "loss": 5.0, "elapsed_s": elapsed}) + "\n")
        progress.show([("baseline", run)])

    progress.show([("baseline", run)])                   # no line of metrics yet
    at(100, 60.0)
    at(400, 240.0)                                       # 300 steps in 180 s: 600 to go, 6 minutes
    progress.show([("baseline", run)], ended="trained")
    lines = out.getvalue().splitlines()
    assert lines == ["[cll-repro] baseline: step 0/1,000, time left: measuring",
                     "[cll-repro] baseline: step 100/1,000, time left: measuring",
                     "[cll-repro] baseline: step 400/1,000, about 6 min left",
                     "[cll-repro] baseline: step 400/1,000, trained"]
    # a time budget needs no rate; in a terminal one training shows its own bar, and this nothing
    timed = Progress(Budget(minutes=10), parallel=1, stream=io.StringIO(), every_s=0)
    assert timed.left("fcll", 50, 120.0) == 480.0

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    assert not Progress(Budget(steps=10), parallel=1, stream=Terminal()).active


def test_progress_after_a_resume_measures_from_the_rows_the_resumed_training_writes():
    """A training resumed from its checkpoint at step 800 drops the rows it had logged after it
    (825 and 850, from a sitting that was paused for hours); cll-repro may read the stale last row
    before the training drops it. The time left is then measured from the resumed rows, not from
    the stale row (which gave "under a minute left" for an hour)."""
    import io
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.progress import Progress
    progress = Progress(Budget(steps=2100), parallel=2, stream=io.StringIO(), every_s=0)
    assert progress.left("baseline", 850, 9000.0) is None          # the stale row: no rate yet
    assert progress.left("baseline", 825, 4520.0) is None          # behind it: measured from here
    assert progress.left("baseline", 875, 4750.0) == (2100 - 875) * 230.0 / 50
    same_step = Progress(Budget(steps=2100), parallel=2, stream=io.StringIO(), every_s=0)
    same_step.left("fcll", 850, 9000.0)
    assert same_step.left("fcll", 850, 4653.0) is None              # rewritten at the same step
    assert same_step.left("fcll", 875, 4750.0) == (2100 - 875) * 97.0 / 25


@pytest.mark.integration
def test_progress_tells_a_finished_training_from_a_stopped_or_failed_one(tmp_path, capsys):
    """Issue 66: cll-repro printed "baseline: step 0/2, trained" before "training baseline failed
    (exit 2)", and after a SIGTERM "step 450/1,250, trained", then "failed (exit 143); its message
    is above", though that message was only in train.log. Each training's end is now said as it
    was, and a failure or stop repeats the training's own message from its log."""
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.scheduler import StepFailed, train_all

    def job(name, code, message, step):
        run = tmp_path / name
        script = (f"import json, pathlib, sys; pathlib.Path({str(run / 'metrics.jsonl')!r}).write_text("
                  f"json.dumps({{'step': {step}, 'loss': 5.0}}) + '\\n' + '{{\"step\": {step + 1}, \"lo'); "
                  f"print('[cll-train] step {step}'); print({message!r}); sys.exit({code})")
        return name, run, [sys.executable, "-c", script]

    cases = [("fcll", 0, "", 2, "fcll: step 2/2, trained"),
             ("stopped", 143, "cll-train: stopped by SIGTERM after saving the step 450 checkpoint; rerun with "
              "--resume to continue", 450, "stopped: step 450/2, stopped after a checkpoint, rerun to resume"),
             ("baseline", 2, "cll-train: error: unknown setting optim.lrr; did you mean optim.lr?", 0,
              "baseline: step 0/2, failed (exit 2)")]
    for name, code, message, step, progress in cases:
        if not code:
            train_all([job(name, code, message, step)], parallel=2, budget=Budget(steps=2))
            err = capsys.readouterr().err
        else:
            with pytest.raises(StepFailed) as failed:
                train_all([job(name, code, message, step)], parallel=2, budget=Budget(steps=2))
            err = capsys.readouterr().err
            assert failed.value.exit_code == code and message in str(failed.value)
            assert f"(its output: {tmp_path / name / 'train.log'})" in str(failed.value)
            assert "its message is above" not in str(failed.value)
            assert ("rerun to resume" in str(failed.value)) == (code == 143)
        assert f"[cll-repro] {progress}" in err, err           # the torn metrics line is no obstacle
        assert (", trained" in err) == (code == 0)


def test_a_misspelled_set_key_is_found_before_the_shards_are_built(multi30k, tmp_path, capsys):
    """Issue 66: cll-repro built the shards, then the first cll-train said the --set key was unknown."""
    from cll_scale.repro.cli import main
    code = main(["--condition", "triangle", "--steps-per-model", "3", "--corpus", str(multi30k),
                 "--shards-root", str(tmp_path / "shards"), "--runs-root", str(tmp_path / "runs"),
                 "--out", str(tmp_path / "results"), "--set", "preset=tiny", "--set", "optim.lrr=1e-3",
                 "--precision", "fp32"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown setting optim.lrr; did you mean optim.lr?" in err and "--set optim.lrr=1e-3" in err
    assert not (tmp_path / "shards").exists() and not (tmp_path / "runs").exists()
# -- issue 66 (class A): what a study reuses is checked against what it asks --------------------------

def test_a_shard_directory_stands_only_for_its_own_corpus_and_condition(multi30k, tmp_path, capsys):
    """Issue 66: `--condition square` reused a `multi30k-square` built as the one-way 4-cycle (the
    name's meaning before 2026-12-05) and reported its 4 supervised and 8 zero-shot directions as
    the square; `--corpus /nonexistent` reused the shards and named a corpus never read."""
    from cll_scale.data.corpora import read_multiway
    from cll_scale.data.shards import BuildConfig, build_shards
    from cll_scale.repro.cli import main
    from tests.conftest import head_corpus, run_cli
    corpus = head_corpus(multi30k, tmp_path / "corpus", lambda name: name.startswith("train."))
    build_shards(read_multiway(corpus, "cycle", ["de", "fr", "cs", "en"]),
                 BuildConfig(out_dir=str(tmp_path / "shards" / "multi30k-square"), vocab_size=800))
    common = ["--steps-per-model", "3", "--shards-root", str(tmp_path / "shards"), "--runs-root",
              str(tmp_path / "runs"), "--out", str(tmp_path / "results"), "--set", "preset=tiny", "--precision", "fp32",
              "--splits", "test_2016_flickr", "--lid-workers", "0"]
    code, _, err = run_cli(main, ["--condition", "square", "--settings", "diagnostics", "--corpus", str(corpus),
                                  *common], capsys)
    assert code == 2 and f"{tmp_path / 'shards' / 'multi30k-square'} holds shards of another build (supervised " \
        "de-fr,fr-cs,cs-en,en-de, not " in err and "it cannot stand for condition square" in err, err
    assert len(err.strip().splitlines()) == 1
    # the triangle's shards of this corpus, asked of a corpus that is not there or of another one
    build_shards(read_multiway(corpus, "triangle", ["de", "fr", "cs"]),
                 BuildConfig(out_dir=str(tmp_path / "shards" / "multi30k-triangle"), vocab_size=800))
    code, _, err = run_cli(main, ["--condition", "triangle", "--corpus", str(tmp_path / "nonexistent"), *common],
                           capsys)
    assert code == 2 and f"cll-repro: error: {tmp_path / 'nonexistent'}: not a directory" in err, err
    other = head_corpus(multi30k, tmp_path / "other", lambda name: name.startswith("train."), lines=200)
    code, _, err = run_cli(main, ["--condition", "triangle", "--corpus", str(other), *common], capsys)
    assert code == 2 and f"(the corpus {corpus}, not {other})" in err, err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()     # nothing trained


def _finished_run(run: Path, steps: int, max_steps: int) -> Path:
    """A run directory as cll-repro leaves a finished one: metrics, a current export, config.json
    with the budget its last sitting trained under."""
    (run / "export").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": steps, "loss": 1.0, "epoch": 0.1, "elapsed_s": 5.0}) + "\n")
    (run / "export" / "export.json").write_text(json.dumps({"step": steps}))
    (run / "config.json").write_text(json.dumps({"train": {"max_steps": max_steps, "max_minutes": 0.0},
                                                 "data": {"mixing": "mixed"}, "model": {"lsl_dropout": "authors"}}))
    return run


def test_a_finished_model_is_not_reported_under_a_smaller_budget(tmp_path):
    """Issue 66: `QUICKSTART_STEPS=2 make quickstart` after a 4-step run skipped the finished models,
    then reported "Budget: 2 steps" above a 4-step table and wrote `"budget": {"steps": 2}` into
    their records. Refused before anything runs; the budget they had, or a larger one, is taken."""
    from cll_scale.repro.evaluations import EvalSettings
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.study import Reproduction, Study
    recipes, runs = tmp_path / "recipes", tmp_path / "runs"
    recipes.mkdir()
    for variant in ("baseline", "fcll"):
        (recipes / f"multi30k_triangle_{variant}.yaml").write_text("preset: tiny\n")
        _finished_run(runs / f"multi30k-triangle-{variant}", 4, 4)

    def study(steps):
        return Reproduction(Study("triangle", ["baseline", "fcll"], tmp_path, tmp_path, runs, recipes,
                                  tmp_path / "results", EvalSettings(("test_2016_flickr",)), Budget(steps=steps)))
    with pytest.raises(ValueError) as err:
        study(2).check()
    assert str(err.value).startswith("the study asks 2 steps a model, but baseline was trained for 4 steps; fcll "
                                     "was trained for 4 steps: a finished model is not cut back"), err.value
    assert not (tmp_path / "results").exists()
    study(4).check()                               # its own budget: skipped as finished
    study(8).check()                               # a larger one: trained on


def test_a_record_is_recognised_under_the_old_name_of_a_setting(tmp_path, capsys):
    """Issue 66: a record made with `--set data.max_tokens=1024`, asked with `--set
    data.batch_tokens=1024` (the same setting since issue 53), was "of another recipe … training it anew"."""
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.records import training_identity, use_records, write_record
    recipe = tmp_path / "multi30k_triangle_fcll.yaml"
    recipe.write_text("preset: tiny\n")
    budget = Budget(steps=10)
    run = _finished_run(tmp_path / "runs" / "multi30k-triangle-fcll", 10, 10)
    records = tmp_path / "results" / "records"
    write_record(run, records / run.name, training_identity(recipe, ["data.max_tokens=1024"], budget))
    gone = {"fcll": tmp_path / "elsewhere" / run.name}
    for asked in (["data.batch_tokens=1024"], ["data.max_tokens=1024"]):
        identity = training_identity(recipe, asked, budget)
        assert use_records(gone, {"fcll": identity}, records, budget) == {"fcll": records / run.name}, asked
    assert "training it anew" not in capsys.readouterr().err
    other = training_identity(recipe, ["data.batch_tokens=2048"], budget)
    assert use_records(gone, {"fcll": other}, records, budget) == gone


def test_results_script_writes_its_reports_under_root_unless_out_names_docs_results(tmp_path):
    """Issue 66 (the data loss): `scripts/results.py --stages triangle --steps 1 ... --root R` rewrote
    the committed docs/results/triangle.md, its JSON and plots. Its reports go to <root>/reports
    unless --out asks for another folder. Here the back-translation stage, whose runs are there
    already (their own evaluations, from the committed table), merges them and writes its report."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import results
    committed = json.loads((ROOT / "docs" / "results" / "backtranslation" / "results.json").read_text())
    root = tmp_path / "R"
    for variant in ("baseline", "fcll"):
        export = root / "runs" / f"multi30k-centered-{variant}" / "export"
        export.mkdir(parents=True)
        (export / "export.json").write_text("{}")
        own = {**committed, "models": {"before": committed["models"][variant],
                                       "after 2 BT epochs": committed["models"][f"{variant} + BT"]}}
        (root / "bt" / variant / "eval" / "test_2016_flickr").mkdir(parents=True)
        (root / "bt" / variant / "eval" / "test_2016_flickr" / "results.json").write_text(json.dumps(own))
    docs = {p: p.read_bytes() for p in (ROOT / "docs" / "results").rglob("*") if p.is_file()}
    assert results.main(["--stages", "backtranslation", "--root", str(root)]) == 0
    assert {p: p.read_bytes() for p in (ROOT / "docs" / "results").rglob("*") if p.is_file()} == docs
    report = (root / "reports" / "backtranslation.md").read_text()
    assert "| fcll + BT |" in report and (root / "reports" / "backtranslation" / "results.json").is_file()
    # the project's own reports are asked for by name; cll-repro's stages get the same folder
    args = results.parse_args(["--root", str(root), "--out", str(tmp_path / "docs")])
    command = results.repro_command(args, "triangle")
    assert command[command.index("--out") + 1] == str(tmp_path / "docs")
    assert results.parse_args(["--root", str(root)]).out == root / "reports"


# -- issue 67: where the zero-shot outputs go, in the reports; the zero-shot gap over training ------

def test_a_reports_part_written_by_hand_is_kept_and_the_seed_table_shows_destinations(tmp_path):
    """cll-repro writes its report again over one whose tail was written by hand (after BY_HAND)
    and keeps the tail; the seed table averages the zero-shot destinations and on-target BLEU over
    seeds, and shows "–" for an entry evaluated before they were measured."""
    from cll_scale.evaluation.report import EvalReport, ModelEntry
    from cll_scale.evaluation.scoring import DirectionResult
    from cll_scale.repro.plan import Budget
    from cll_scale.repro.report import BY_HAND, seed_table, write_report
    run = tmp_path / "runs" / "fcll-seed1"
    (run / "export").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0, "epoch": 0.1, "elapsed_s": 5.0}) + "\n")
    (run / "export" / "export.json").write_text(json.dumps({"step": 10}))
    args = ("triangle", "triangle-seeds", {"fcll seed1": run}, {}, Budget(steps=10), "cll-repro", tmp_path / "results")
    path = write_report(*args)
    generated = path.read_text()
    tail = f"{BY_HAND}\n\n## A reading\n\nWritten by hand.\n"
    path.write_text(generated + "\n" + tail)
    assert write_report(*args).read_text() == generated + "\n" + tail

    def entry(trained: float | None, bleu: float | None) -> ModelEntry:
        row = DirectionResult("de-cs", "zero-shot", 10, 1.0, 20.0, 50.0, 50.0, 0.0, trained or 0.0, to_target=50.0,
                              to_trained=trained, to_source=0.0, to_other=0.0,
                              to_outside=None if trained is None else 50.0 - trained, on_target_bleu=bleu,
                              on_target_chrf=bleu)
        return ModelEntry([row], {"zero-shot": {k: getattr(row, k) for k in ("bleu", "off_target", "off_target_restricted",
                                                                             "to_trained", "to_outside", "on_target_bleu")
                                                if getattr(row, k) is not None}},
                          {}, None, True, ["langdetect"], {}, {}, [])
    report = EvalReport("test_2016_flickr", 4, ["langdetect"], {"fcll s1": entry(30.0, 3.0), "fcll s2": entry(40.0, 5.0),
                                                                 "old s1": entry(None, None)})
    table = seed_table(report, {"fcll": ["fcll s1", "fcll s2"], "old": ["old s1"]})
    assert "zero-shot in a trained target" in table
    fcll = next(x for x in table.splitlines() if x.startswith("| fcll |"))
    assert fcll.endswith(f"| 35.00 ± {statistics.stdev([30.0, 40.0]):.2f}% | 15.00 ± "
                         f"{statistics.stdev([20.0, 10.0]):.2f}% | 4.00 ± {statistics.stdev([3.0, 5.0]):.2f} |"), fcll
    assert next(x for x in table.splitlines() if x.startswith("| old |")).endswith("| – | – | – |")


def test_the_zero_shot_gap_is_drawn_from_the_diagnostics_records(tmp_path):
    """scripts/zero_shot_gap.py: one panel a diagnostics model of both rounds, from the records'
    metrics.jsonl, and the gap (zero-shot − supervised validation NLL) at each step as the rows
    give it; a folder without such records draws nothing."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from zero_shot_gap import diagnostics_metrics, gap_table
    from cll_scale.evaluation.plots import plot_zero_shot_gap
    from cll_scale.training.metrics import read_rows
    metrics = diagnostics_metrics(ROOT / "docs" / "results")
    records = sorted((ROOT / "docs" / "results").glob("diagnostics*/*/records/*/metrics.jsonl"))
    assert len(metrics) == len(records) >= 15 and "round 2: square baseline" in metrics
    png = plot_zero_shot_gap(metrics, tmp_path / "gap.png")
    assert png.stat().st_size > 10_000
    rows = read_rows(ROOT / "docs/results/diagnostics-2/square-diagnostics/records/"
                     "multi30k-square-diagnostics-baseline/metrics.jsonl")
    valid = [r for r in rows if "valid_zero_shot_nll" in r]
    line = next(x for x in gap_table(metrics) if x.startswith("| round 2: square baseline |"))
    assert line == "| round 2: square baseline | " + " | ".join(
        f"{r['valid_zero_shot_nll'] - r['valid_nll']:.2f}" for r in valid) + " |"
    assert plot_zero_shot_gap({"no zero-shot": [{"step": 10, "valid_nll": 3.0}]}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()

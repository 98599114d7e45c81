"""make quickstart's script end to end, at a tiny budget (issue 52): the stages in order, the
summary's table with its intervals, its examples section, the records trained longer and the
next commands; a rerun trains nothing."""
import os
import subprocess

import pytest

from cll_scale.training.precision import trained_precision
from tests.conftest import ROOT
from tests.test_train import ENV


@pytest.mark.slow
def test_the_quickstart_script_ends_with_its_summary(multi30k, tmp_path):
    env = {**ENV, "MULTI30K": str(multi30k), "QUICKSTART_SHARDS": str(tmp_path / "shards"),
           "QUICKSTART_RUNS": str(tmp_path / "qs"), "QUICKSTART_STEPS": "3", "QUICKSTART_SENTENCES": "4",
           "QUICKSTART_PRECISION": "fp32",
           "QUICKSTART_ARGS": "--set preset=tiny --set data.batch_tokens=1024 --beam 1"}
    env.pop("OMP_NUM_THREADS", None)          # the script picks the threads itself
    run = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    stages = [line for line in out.splitlines() if line.startswith("== [")]
    assert [s.split("]")[0] for s in stages] == ["== [1/3", "== [2/3", "== [3/3"], stages
    assert "strict dependence: yes" in out                  # the triangle, as cll-shards inspect says
    table = out[out.index("zero-shot off-target (95% interval)"):]
    rows = [line for line in table.splitlines()[1:3]]
    assert [r.split()[0] for r in rows] == ["baseline", "fcll"] and all(r.endswith("of 12") for r in rows)
    assert all(" 3 " in r for r in rows)                     # 3 steps each, a step budget
    assert "The effect shows" in out or "The effect does not show yet" in out
    assert "Zero-shot sentences the Baseline answers in another language and FCLL in the right one:" in out
    assert "Trained longer (the committed records, one seed):" in out
    assert "Next:" in out and "make demo" in out and "cll-repro --condition triangle" in out and "On a GPU" in out
    assert (tmp_path / "qs" / "results" / "triangle-quickstart" / "quickstart.png").is_file()
    # QUICKSTART_PRECISION reached both trainings (the stand-in of a CPU without bf16 units)
    runs = sorted((tmp_path / "qs" / "runs").glob("*triangle-quickstart-*"))
    assert len(runs) == 2 and all(trained_precision(r) == "fp32" for r in runs), runs
    # the DeepSpeed log stays at warnings: no INFO wall in what a person sees
    assert "[INFO]" not in run.stderr
    again = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0 and "cll_scale.train" not in again.stderr and "finished" in again.stderr
    assert os.path.getsize(tmp_path / "qs" / "report.log") > 0


def _summary_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("quickstart_summary", ROOT / "scripts" / "quickstart_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("baseline_bleu, fcll_k, missed", [
    (15.09, 123, []),                                                       # the README's run
    (14.49, 129, ["the Baseline's supervised BLEU is 14.5, under 15"]),     # a run at the bar's edge
    (16.0, 340, ["the Baseline's rate is 1.1x FCLL's, not 2x", "the two intervals overlap"]),
])
def test_the_summary_names_the_targets_a_run_misses(baseline_bleu, fcll_k, missed):
    qs = _summary_module()
    n = 450

    def model(k, bleu):
        return {"sup_bleu": bleu, "off": 100 * k / n, "ci": qs.wilson(k, n)}
    text = qs.verdict({"baseline": model(361, baseline_bleu), "fcll": model(fcll_k, 16.5)})
    if missed:    # exactly the missed targets, in the order of the targets
        assert text.startswith(f"The effect does not show yet: {'; '.join(missed)} (the quickstart's targets")
        assert "QUICKSTART_STEPS=N" in text
    else:
        assert text.startswith("The effect shows: ") and "QUICKSTART_STEPS" not in text

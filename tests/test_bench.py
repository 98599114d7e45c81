"""The benches run (issue 54): no test times anything here, but a bench that crashes or reports
nothing is caught before someone needs its figures (37c9b6c broke ``gpu_choices`` unnoticed)."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_train import ENV


def run_bench(script, *args, tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, f"bench/{script}", *args, "--json", str(out)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.integration
def test_bench_model_profiles_and_measures_the_loss_forms_at_tiny(tmp_path):
    res = run_bench("bench_model.py", "--only", "loss", "--only", "profile", "--preset", "tiny", "--shape", "8", "8",
                    "8", "--steps", "2", "--profile-steps", "1", "--profile-variants", "baseline,fcll-mixed",
                    "--threads", "1", tmp_path=tmp_path)
    assert [r["dtype"] for r in res["loss"]] == ["fp32", "bf16"]
    for row in res["loss"]:
        assert row["logits_shape"] == [64, 8000]          # 8 x 8 target tokens, the vocabulary
        for form in ("logits", "projected"):
            assert row[f"{form}_step_ms"] > 0 and row[f"{form}_faulted_mib_per_step"] >= 0
            assert row[f"{form}_peak_rss_growth_mib"] >= 0
    rows = {(r["dtype"], r["variant"]): r for r in res["profile"]}
    assert set(rows) == {(d, v) for d in ("fp32", "bf16") for v in ("baseline", "fcll-mixed")}
    for dtype in ("fp32", "bf16"):
        base, mixed = rows[dtype, "baseline"], rows[dtype, "fcll-mixed"]
        # the LSLs of every language in the batch: more kernels than the Baseline, with either choices
        assert mixed["ops_per_step"]["kernels"] > base["ops_per_step"]["kernels"] > 0
        assert mixed["ops_per_step_gpu_choices"]["kernels"] > base["ops_per_step_gpu_choices"]["kernels"] > 0
        assert base["top_self_time"] and "extra_ms_top_ops" in mixed and "extra_ms_top_ops" not in base


@pytest.mark.integration
def test_bench_train_profiles_what_the_trainer_adds_at_tiny(m30k_centered, tmp_path):
    res = run_bench("bench_train.py", "--data", str(m30k_centered), "--only", "trainer", "--profile", "--preset",
                    "tiny", "--batch-tokens", "512", "--blocks", "1", "--block-steps", "2", "--warmup", "0",
                    "--threads", "1", tmp_path=tmp_path)
    (row,) = res["trainer"]
    assert row["trainer_over_plain"] > 0 and row["profile_reps"] == 3
    assert row["trainer_minor_faults_per_step"] >= 0 and row["plain_minor_faults_per_step"] >= 0
    # ZeRO-2's flat partitions against fused AdamW's read of each parameter's step counter
    assert row["trainer_ops_per_step"]["host_reads"] < row["plain_ops_per_step"]["host_reads"]
    assert row["trainer_ops_per_step"]["kernels"] > 0 and len(row["trainer_extra_top_ops"]) == 10


def test_a_bench_given_a_wrong_corpus_or_device_ends_in_one_line(tmp_path, capsys):
    """Issue 66: `bench_stream.py --corpus /nonexistent` and `bench_decode.py --device cuda` on a
    machine without CUDA ended in tracebacks; they end as every command does, before any work."""
    import pytest
    import torch
    from bench import bench_decode, bench_model, bench_stream, bench_train
    code = bench_stream.main(["--corpus", str(tmp_path / "nonexistent"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err == f"bench_stream: error: {tmp_path / 'nonexistent'}: not a directory\n"
    assert not (tmp_path / "out").exists()
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is no mistake here")
    for bench in (bench_decode, bench_model, bench_train):       # every bench with a --device
        code = bench.main(["--device", "cuda", "--preset", "tiny"])
        err = capsys.readouterr().err
        name = bench.__name__.split(".")[-1]
        assert code == 4 and err.startswith(f"{name}: error: --device cuda: no CUDA device is available here"), err
        assert len(err.splitlines()) == 1

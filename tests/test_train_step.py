"""The lean training step: no device value read on the host between log steps, a bad step
skipped on every rank without a host sync, and out-of-memory in a batch survived."""
import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.test_train import DEEPSPEED, ENV, cll_train, common, finish, free_port, losses, probe

HOST_SIDE = "tolist @ cll_scale/training/collectives.py:host_all_reduce"   # CPU tensors over gloo, by design


def sync_counts(shards, run, config, tmp_path, log_every=5, steps=12):
    report = tmp_path / f"syncs-{config}.json"
    args = common(shards, run, steps, "--ds-config", config, "--set", f"log.every={log_every}",
                  "--set", "checkpoint.every=1000", "--set", "train.grad_accum=2")
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "sync_probe.py"), *args, "--report", str(report)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(report.read_text())
    # one manifest read for the whole run: the stream, validation and the export are handed it
    assert len(data["manifest_loads"]) == 1, data["manifest_loads"]
    return {int(k): v for k, v in data["counts"].items()}


@pytest.mark.integration
def test_steady_state_steps_read_no_device_value(m30k_centered, tmp_path):
    """Between log steps the loop's only host read is the per-step agreement over the host-side
    group (stop signal, budget); the log step adds the metrics window and the gradient norm. The
    counter wraps .item(), .tolist(), bool/float/int(tensor), .cpu(), .numpy(), torch.equal,
    nonzero and every synchronize, in our code and in DeepSpeed's."""
    for config in ("cpu_bf16.json", "cpu_fp32.json"):
        counts = sync_counts(m30k_centered, tmp_path / config, config, tmp_path)
        assert sorted(counts) == list(range(1, 13)), counts
        for step in range(1, 12):          # step 12 also validates and checkpoints at the end
            reads = dict(counts[step])
            assert reads.pop(HOST_SIDE) == 1, (config, step, counts[step])
            if step % 5 == 0:
                assert sum(reads.values()) <= 2, (config, step, reads)     # the log step's reads
                assert all("cll_scale/training/metrics.py" in k or "cll_scale/run/trainer.py:_log_train" in k for k in reads), reads
            else:
                assert reads == {}, (config, step, reads)


def checkpoint_weights(run, step):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    return get_fp32_state_dict_from_zero_checkpoint(str(run / "checkpoints"), tag=f"step{step:08d}")


def same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.whole_machine
@pytest.mark.integration
def test_out_of_memory_on_one_rank_skips_the_step_on_both(m30k_centered, tmp_path):
    """Out of memory in the forward pass on rank 1 only: both ranks skip that step (weights bit-equal
    before and after it, and equal between the ranks at the end), the log names the batch's shape,
    and training goes on."""
    run, report = tmp_path / "run", tmp_path / "report.json"
    env = dict(ENV, CLL_FAULT="oom@3", CLL_FAULT_RANK="1")
    out = finish(probe([DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port())], m30k_centered, run, report,
                       5, "--set", "checkpoint.every=1", "--set", "checkpoint.keep_last=10", env=env))
    assert "rank 1, step 3: out of memory on a" in out and " rows x " in out
    assert "step 3: non-finite loss or gradients, or out of memory" in out
    ranks = json.loads(report.read_text())
    assert ranks[0]["param_sha"] == ranks[1]["param_sha"] and all(r["step"] == 5 for r in ranks)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["skipped"] for r in rows] == [0, 0, 1, 0, 0]
    w2, w3, w4 = (checkpoint_weights(run, s) for s in (2, 3, 4))
    assert same(w2, w3) and not same(w3, w4)


def test_out_of_memory_in_a_row_ends_the_run_with_one_line(m30k_centered, tmp_path, monkeypatch):
    from cll_scale.core import faults
    monkeypatch.setenv("CLL_FAULT", "oom@3x10")
    monkeypatch.setattr(faults, "_fired", set())          # a step's fault fires once per process
    res = cll_train(*common(m30k_centered, tmp_path / "run", 20, "--set", "train.max_skips_in_a_row=3"), check=False)
    assert res.returncode == 5, res.stderr[-3000:]          # training diverged (cll_scale.core.errors)
    assert "cll-train: error: 3 steps in a row skipped" in res.stderr and "up to step 5" in res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("out of memory on a") == 3


def test_compiled_training_matches_eager_and_exports_the_same_names(m30k_centered, tmp_path):
    """train.compile traces each block once, with dynamic shapes: token-budget batches of every
    shape train through the same graphs. `aot_eager` runs the traced forward and backward graphs
    without code generation, so the losses must equal eager ones (same dropout draws); the export
    keeps the eager parameter names."""
    runs = {}
    for name, extra in (("eager", []), ("compiled", ["--set", "train.compile=aot_eager"])):
        runs[name] = tmp_path / name
        cll_train(*common(m30k_centered, runs[name], 6, *extra))
    eager, compiled = losses(runs["eager"]), losses(runs["compiled"])
    assert sorted(eager) == sorted(compiled) == list(range(1, 7))
    assert all(abs(eager[s] - compiled[s]) <= 1e-4 * abs(eager[s]) for s in eager), (eager, compiled)
    from safetensors.torch import load_file
    names = [sorted(load_file(str(runs[n] / "export" / "model.safetensors"))) for n in runs]
    assert names[0] == names[1] and not any("_orig_mod" in k for k in names[1])
    bad = cll_train(*common(m30k_centered, tmp_path / "bad", 2, "--set", "train.compile=inductr"), check=False)
    assert bad.returncode == 2 and "not a torch.compile backend" in bad.stderr and "inductor" in bad.stderr

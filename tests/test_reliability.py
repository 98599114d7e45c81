"""Faults that cost real runs: a killed run, a crash in the middle of a checkpoint save, damaged
shards, non-finite losses and hostile text. Each test can fail; see docs/reliability.md."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import ROOT
from tests.test_train import DEEPSPEED, ENV, cll_train, common, free_port, losses


def last_losses(run_dir) -> dict[int, float]:
    """Per step, the loss logged last (a resumed run logs the replayed steps again)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            out[row["step"]] = row["loss"]
    return out


def test_non_finite_loss_is_skipped_and_weights_stay_finite(m30k_centered, tmp_path, monkeypatch):
    """A non-finite loss at step 3: the step is skipped on the device (no host sync), so the weights
    after it are bit-identical to those before it; the log says so and training goes on."""
    from cll_scale.core import faults
    from tests.test_train_step import checkpoint_weights, same
    run = tmp_path / "nan"
    monkeypatch.setenv("CLL_FAULT", "nan@3")
    monkeypatch.setattr(faults, "_fired", set())          # a step's fault fires once per process
    res = cll_train(*common(m30k_centered, run, 6, "--set", "checkpoint.every=1", "--set", "checkpoint.keep_last=10"))
    assert "step 3: non-finite loss or gradients" in res.stderr and "skipped on every rank" in res.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["step"] for r in rows] == list(range(1, 7)) and [r["skipped"] for r in rows] == [0, 0, 1, 0, 0, 0]
    assert rows[2]["loss"] is None           # the window held only the skipped step: no loss to report
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows if r["step"] != 3)
    w2, w3, w4 = (checkpoint_weights(run, s) for s in (2, 3, 4))
    assert same(w2, w3) and not same(w3, w4)
    from safetensors.torch import load_file
    weights = load_file(str(run / "export" / "model.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_damaged_shard_stops_training_and_names_the_file(m30k_centered, tmp_path):
    import shutil
    shards = tmp_path / "shards"
    shutil.copytree(m30k_centered, shards)
    shard = shards / "train" / "en-cs.00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x20
    shard.write_bytes(bytes(data))
    res = cll_train(*common(shards, tmp_path / "run", 3), check=False)
    assert res.returncode == 2 and "train/en-cs.00000.arrow: sha256 differs" in res.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
    shard.write_bytes(bytes(data[:-4096]))                   # truncated
    res = cll_train(*common(shards, tmp_path / "run", 3), check=False)
    assert res.returncode == 2 and "en-cs.00000.arrow" in res.stderr and "truncated" in res.stderr
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"].pop()               # manifest no longer matches the data
    (shards / "manifest.json").write_text(json.dumps(manifest))
    shard.unlink()
    res = cll_train(*common(shards, tmp_path / "run", 3), check=False)
    assert res.returncode == 2 and "en-cs.00000.arrow: shard missing" in res.stderr


@pytest.mark.whole_machine
@pytest.mark.integration
def test_damaged_shard_hashed_by_the_second_rank_stops_the_whole_launch(m30k_centered, tmp_path):
    """The two processes of a node share the hashing (shard k goes to local rank k % 2): a damage in
    a shard only rank 1 hashes must still stop both before the engine is built."""
    import shutil
    shards = tmp_path / "shards"
    shutil.copytree(m30k_centered, shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    shard = shards / manifest["splits"]["train"]["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    res = subprocess.run([DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port()), "--module",
                          "cll_scale.train", *common(shards, tmp_path / "run", 3)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and f"{shard.relative_to(shards)}: sha256 differs" in out
    assert out.count("sha256 differs") == 1        # one rank hashed it, not both
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.whole_machine
@pytest.mark.integration
def test_kill_9_between_checkpoints_then_exact_resume(m30k_centered, tmp_path):
    """Two ranks, fp32, SIGKILL to the whole launch between checkpoints; the relaunch with
    --resume reproduces the uninterrupted run's losses, data stream included."""
    def launch(run, steps, *extra):
        args = common(m30k_centered, run, steps, "--set", "checkpoint.every=6", "--set", "checkpoint.export=false", *extra)
        return subprocess.Popen([DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port()),
                                 "--module", "cll_scale.train", *args], cwd=ROOT, env=ENV, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    reference = launch(tmp_path / "ref", 16)
    assert reference.wait(timeout=600) == 0
    run = tmp_path / "killed"
    proc = launch(run, 16)
    deadline = time.time() + 600
    while time.time() < deadline:
        time.sleep(0.2)
        steps = last_losses(run) if (run / "metrics.jsonl").exists() else {}
        if steps and max(steps) >= 9:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (run / "checkpoints" / "latest").read_text() == "step00000006"
    assert launch(run, 16, "--resume").wait(timeout=600) == 0
    a, b = last_losses(tmp_path / "ref"), last_losses(run)
    assert sorted(b) == list(range(1, 17))
    for step in range(7, 17):
        assert abs(a[step] - b[step]) <= 1e-6, (step, a[step], b[step])


HOSTILE = ["", "   \t ", "x" * 10_000, "Ein Hund 🐕🎉 läuft 👍🏽", "control \x00\x07\x1b[31m chars\u200b",
           "שלום עולם مرحبا بالعالم", "Mixed 中文 русский ελληνικά text", "<2fr> <2de> Ein Hund", "\u202e reversed",
           "Zwei Männer\r\n", "\ufeffBOM"]


def test_hostile_text_into_translator_and_cli(tiny_export, cmd):
    from cll_scale.evaluation.translator import Translator
    tr = Translator.load(tiny_export)
    out = tr.translate(HOSTILE, "de")
    assert len(out) == len(HOSTILE) and out[0] == "" and out[1] == ""
    assert all(isinstance(x, str) and "\n" not in x for x in out)
    # A typed tag is text, not a control symbol: it does not pick the target language.
    tag_id = tr.manifest.tokenizer.lang_tag_ids["fr"]
    assert tag_id not in tr.sp.encode(HOSTILE[7])
    lines = "\n".join(h.replace("\n", " ").replace("\r", " ") for h in HOSTILE) + "\n"
    res = cmd("cll_scale.translate", "--model", tiny_export, "--tgt-lang", "en", "--beam", "1",
              stdin=lines.encode("utf-8", "surrogatepass"))
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split("\n")) == len(lines.split("\n"))
    bad = cmd("cll_scale.translate", "--model", tiny_export, "--tgt-lang", "en", stdin=b"caf\xe9 latin-1\n")
    assert bad.returncode == 0 and len(bad.stdout.splitlines()) == 1


def _file_size_limit(limit_bytes):
    """A child process whose files cannot grow past ``limit_bytes``: writes fail with EFBIG,
    as on a full disk (SIGXFSZ ignored so the write returns the error instead of killing)."""
    import resource

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return apply


@pytest.mark.integration
def test_full_disk_during_shard_build_keeps_the_old_output(small_multiway, tmp_path):
    out = tmp_path / "shards"
    cmd = [sys.executable, "-m", "data_tools", "build", "--corpus", str(small_multiway), "--out", str(out),
           "--vocab-size", "1200"]
    assert subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True).returncode == 0
    before = (out / "manifest.json").read_bytes()
    res = subprocess.run([*cmd[:-2], "--vocab-size", "1000", "--overwrite"], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, preexec_fn=_file_size_limit(20_000))
    assert res.returncode == 3 and "cll-shards: error:" in res.stderr and "File too large" in res.stderr
    assert (out / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards", "small"]       # no temp dir left


@pytest.mark.integration
def test_a_full_disk_at_start_names_the_file_it_could_not_write(m30k_centered, tmp_path):
    """Issue 66: a run that could not write its first file said "[Errno 27] File too large" (on a
    real disk, "No space left on device") and nothing of where; a failed write now names its file."""
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "cll_scale.train", *common(m30k_centered, run, 2)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=600, preexec_fn=_file_size_limit(100))
    assert res.returncode == 3, res.stderr[-2000:]
    assert f"cll-train: error: {run / 'config.json'}: File too large" in res.stderr, res.stderr[-2000:]


@pytest.mark.integration
def test_full_disk_during_checkpoint_save_keeps_the_previous_one(m30k_centered, tmp_path):
    run = tmp_path / "run"
    cll_train(*common(m30k_centered, run, 4, "--set", "checkpoint.export=false"))
    res = subprocess.run([sys.executable, "-m", "cll_scale.train",
                          *common(m30k_centered, run, 8, "--set", "checkpoint.export=false"), "--resume"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600,
                         preexec_fn=_file_size_limit(1_000_000))
    assert res.returncode == 3, res.stderr[-2000:]      # the file system refused (cll_scale.core.errors)
    assert "saving the step 8 checkpoint" in res.stderr and "step00000004 is intact" in res.stderr
    assert (run / "checkpoints" / "latest").read_text() == "step00000004"
    res = cll_train(*common(m30k_centered, run, 8, "--set", "checkpoint.export=false"), "--resume")
    assert "step00000004 at step 4" in res.stderr and (run / "checkpoints" / "latest").read_text() == "step00000008"


@pytest.mark.whole_machine
@pytest.mark.integration
def test_sigterm_checkpoints_the_current_step_then_exact_resume(m30k_centered, tmp_path):
    """SIGTERM to every process of a 2-rank `deepspeed` launch, as SLURM sends at a job's time limit
    or on preemption: both ranks stop at the same step with a checkpoint of that step, although
    none was due, and --resume continues exactly."""
    def launch(run, steps, *extra):
        args = common(m30k_centered, run, steps, "--set", "checkpoint.every=1000", "--set", "checkpoint.export=false")
        return subprocess.Popen([DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port()), "--module",
                                 "cll_scale.train", *args, *extra], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    run = tmp_path / "stopped"
    proc = launch(run, 1000)
    deadline = time.time() + 600
    while time.time() < deadline and max(last_losses(run) if (run / "metrics.jsonl").exists() else [0]) < 5:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    stopped = max(last_losses(run))
    assert f"stopped by SIGTERM at step {stopped}, after saving its checkpoint" in out, out[-3000:]
    assert (run / "checkpoints" / "latest").read_text() == f"step{stopped:08d}"
    resumed = launch(run, stopped + 4, "--resume")
    assert resumed.wait(timeout=600) == 0 and f"at step {stopped}" in resumed.stdout.read()
    reference = launch(tmp_path / "ref", stopped + 4)
    assert reference.wait(timeout=600) == 0
    a, b = last_losses(tmp_path / "ref"), last_losses(run)
    assert sorted(b) == list(range(1, stopped + 5))
    for step in range(1, stopped + 5):
        assert abs(a[step] - b[step]) <= 1e-6, (step, a[step], b[step])

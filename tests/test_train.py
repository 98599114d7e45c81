"""cll-train end to end: the three launches (one process, `deepspeed --num_gpus 2`, a simulated
two-node launch), loss going down, exact fp32 resume, universal resume at another world size,
and an export that loads without DeepSpeed."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cll_scale.training.collectives import free_port
from tests.conftest import ROOT, built_once, command

DEEPSPEED = str(Path(sys.executable).with_name("deepspeed"))
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def common(shards, run_dir, steps, *extra):
    """The settings of the suite's short cll-train runs. Validation reads the first batch of each
    direction (a run also validates at its end: the whole Multi30k split, 12 directions, took half
    of a 1-step run's 10 s); the whole split is validated by the `tiny_export` fixture's run."""
    return ["--data", str(shards), "--preset", "tiny", "--run-dir", str(run_dir), "--max-steps", str(steps),
            "--ds-config", "cpu_fp32.json", "--set", "log.every=1", "--set", "valid.every=1000",
            "--set", "valid.max_batches=1", "--set", "data.batch_tokens=1024", "--set", "optim.lr=3e-3",
            "--set", "optim.warmup_steps=10", *extra]


def cll_train(*argv, check=True):
    """cll-train in this process (a launch of its own is the integration tests')."""
    res = command("cll_scale.train", *argv)
    if check and res.returncode:
        raise AssertionError(f"cll-train failed ({res.returncode}):\n{res.stderr[-4000:]}")
    return res


def rows_of(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rows_of(run_dir) if "loss" in r}


def train_steps(run_dir) -> list[int]:
    """The steps of the training lines in the order written (a step logged twice shows twice)."""
    return [r["step"] for r in rows_of(run_dir) if "loss" in r]


GOLDEN = ROOT / "tests" / "golden" / "train_tiny_fp32_losses.json"


@pytest.fixture(scope="module")
def full_run(m30k_centered, tmp_path_factory) -> Path:
    """40 uninterrupted steps of `tiny` in fp32 (checkpoints at 20 and 40), started in a directory
    that holds the records of an earlier attempt which left no checkpoint. The tests below read
    it; the ones that change a run work on a copy."""
    def train(full):
        full.mkdir()
        stale = {"step": 30, "loss": 9.9, "nll": 9.9, "ppl": 2e4, "lr": 1e-3, "tokens_per_s": 1.0, "epoch": 0.1,
                 "grad_norm": 1.0, "skipped": 0, "elapsed_s": 1.0, "tokens_seen": 1}
        (full / "metrics.jsonl").write_text(json.dumps(stale) + "\n")
        cll_train(*common(m30k_centered, full, 40, "--set", "checkpoint.every=20"))
    return built_once(tmp_path_factory, "train-full", train)


def test_a_fresh_start_drops_earlier_records_and_the_run_describes_itself(full_run, m30k_centered):
    assert train_steps(full_run) == list(range(1, 41)), "an earlier attempt's records kept"
    for name in ("config.json", "ds_config.json", "git.txt", "curves.png", "monitor/train/Train_loss.csv"):
        assert (full_run / name).is_file(), name
    ds_cfg = json.loads((full_run / "ds_config.json").read_text())
    assert ds_cfg["zero_optimization"]["stage"] == 2 and ds_cfg["gradient_accumulation_steps"] == 1
    assert sorted(p.name for p in (full_run / "checkpoints").glob("step*")) == ["step00000020", "step00000040"]
    # A second start without --resume refuses to overwrite the run.
    res = cll_train(*common(m30k_centered, full_run, 45), check=False)
    assert res.returncode == 2 and "pass --resume" in res.stderr


def test_losses_match_the_golden_run(full_run):
    """The first 30 losses of the fixed `tiny` fp32 run are those committed in
    tests/golden/train_tiny_fp32_losses.json, within 1e-3 (fp32 kernels round differently from
    one CPU to another; a change of initialisation, dropout, schedule, loss or data order moves
    them by far more). A change meant to alter the numerics regenerates the file with
    ``CLL_REGENERATE_GOLDEN=1 pytest tests/test_train.py -k golden`` and says so in its commit."""
    a = losses(full_run)
    got = {str(step): a[step] for step in range(1, 31)}
    if os.environ.get("CLL_REGENERATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"what": "train loss of steps 1-30: cll-train --preset tiny, cpu_fp32.json, "
                                              "the settings of tests/test_train.py common(), shards of "
                                              "Multi30k centered (tests/conftest.py m30k_centered)",
                                      "regenerate": "CLL_REGENERATE_GOLDEN=1 pytest tests/test_train.py -k golden",
                                      "losses": got}, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert got.keys() == golden.keys()
    off = {s: (got[s], golden[s]) for s in golden if abs(got[s] - golden[s]) > 1e-3}
    assert not off, f"losses differ from the golden run at steps {sorted(off, key=int)}: {off}"
    first, last = sum(a[s] for s in range(1, 6)) / 5, sum(a[s] for s in range(36, 41)) / 5
    assert last < first - 1.0, f"loss did not fall: {first:.3f} -> {last:.3f}"


def test_a_resumed_run_is_the_uninterrupted_run_and_exports_its_best(full_run, m30k_centered, tmp_path):
    split = tmp_path / "split"
    cll_train(*common(m30k_centered, split, 17, "--set", "checkpoint.export=false"))
    with open(split / "metrics.jsonl", "a") as f:    # what a run killed after its checkpoint leaves
        f.write(json.dumps({"step": 18, "loss": 99.0}) + "\n")
    # The second half also validates every 10 steps: validation must not disturb training, and the
    # best checkpoint on supervised validation NLL is exported to export-best/.
    res = cll_train(*common(m30k_centered, split, 40, "--set", "checkpoint.every=20",
                            "--set", "valid.every=10"), "--resume")
    assert "resumed from" in res.stderr and "step00000017" in res.stderr
    a, b = losses(full_run), losses(split)
    assert train_steps(split) == list(range(1, 41)), "stale records kept"
    valid = {r["step"]: r["valid_nll"] for r in rows_of(split) if "valid_nll" in r}
    assert sorted(valid) == [17, 20, 30, 40]       # 17: the end of the first half (no export there)
    del valid[17]
    best = json.loads((split / "export-best" / "export.json").read_text())
    assert best["best"]["metric"] == "valid_nll" and best["step"] == min(valid, key=valid.get)
    assert best["best"]["value"] == pytest.approx(min(valid.values()))
    for step in range(18, 41):            # fp32: the resumed run is the uninterrupted run
        assert abs(a[step] - b[step]) <= 1e-6, (step, a[step], b[step])


@pytest.mark.integration
def test_the_export_loads_without_deepspeed(full_run, m30k_centered):
    """A process that cannot import DeepSpeed (which the test process has imported) scores with
    the export."""
    code = f"""
import sys; sys.modules['deepspeed'] = None
import torch
from cll_scale.model.export import load_export
from cll_scale.model.model import label_smoothed_loss
from cll_scale.data.stream import eval_batches
model, manifest = load_export({str(full_run / 'export')!r})
nll = tokens = 0
with torch.no_grad():
    for b in eval_batches({str(m30k_centered)!r}, 'valid', 'en-de', 2048):
        logits = model(b.src_tokens, model.shift_right(b.tgt_tokens), b.tgt_lang)
        nll += float(label_smoothed_loss(logits, b.tgt_tokens, 0, 0.0)[1]); tokens += b.ntokens
print(nll / tokens, manifest.languages)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    nll = float(out.stdout.split()[0])
    assert 0 < nll < losses(full_run)[1]         # trained weights, better than at step 1


def test_a_tampered_export_is_refused(full_run, tmp_path):
    import shutil
    from cll_scale.model.export import ExportError, load_export
    tampered = tmp_path / "export"
    shutil.copytree(full_run / "export", tampered)
    weights = tampered / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportError, match="model.safetensors differ"):
        load_export(tampered)


def test_checkpoints_know_their_data(full_run, m30k_centered, tmp_path):
    """Other shards are refused on --resume unless asked for (train.new_data), which carries
    weights, optimizer and schedule on and starts the stream afresh."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    other = tmp_path / "other"
    shutil.copytree(m30k_centered, other, copy_function=os.link)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"] = [s for s in manifest["splits"]["train"]["shards"]
                                             if s["direction"] != "en-cs"]
    (other / "manifest.json").unlink()       # a link to the session's shards: writing through it changed them
    (other / "manifest.json").write_text(json.dumps(manifest))
    res = cll_train(*common(other, run, 42), "--resume", check=False)
    assert res.returncode == 2 and "not the ones" in res.stderr and "train.new_data=true" in res.stderr
    res = cll_train(*common(other, run, 42, "--set", "train.new_data=true"), "--resume")
    assert "on new data" in res.stderr and max(losses(run)) == 42


@pytest.mark.parametrize("change, refused", [
    (["--set", "data.rows_fraction=0.5"], "data.rows_fraction=1.0 (now 0.5)"),       # issue 51, finding 6
    (["--data.add_lang_tag", "false"], "data.add_lang_tag=True (now False)"),          # finding 7
    (["--data.add_lang_tag", "false", "--set", "train.new_data=true"], "data.add_lang_tag=True (now False)"),
])
def test_a_resume_that_would_train_on_other_rows_or_input_is_refused(full_run, m30k_centered, tmp_path, change,
                                                                     refused):
    """What the model learns from belongs to the run: a resume with another share of the rows or
    without the tag (export.json would then say lang_tag false for a model trained with tags) is
    refused before anything loads; train.new_data lets the rows change, never the input format."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    before = (run / "metrics.jsonl").read_bytes()
    res = cll_train(*common(m30k_centered, run, 42, *change), "--resume", check=False)
    assert res.returncode == 2 and refused in res.stderr and "resume with the run's own settings" in res.stderr
    assert (run / "metrics.jsonl").read_bytes() == before


@pytest.mark.parametrize("change, refused", [
    (["--set", "optim.lr=5e-2"], "optim.lr=0.003 (now 0.05)"),                      # issue 66, class B
    (["--optim.weight-decay", "0.01"], "optim.weight_decay=0.0 (now 0.01)"),
    (["--set", "data.batch_tokens=2048"], "data.batch_tokens=1024 (now 2048)"),
    (["--set", "data.temperature=1"], "data.temperature=5.0 (now 1.0)"),
    (["--set", "data.max_sentences=8"], "data.max_sentences=0 (now 8)"),
    (["--set", "train.label_smoothing=0.2"], "train.label_smoothing=0.1 (now 0.2)"),
    (["--set", "data.batch_tokens=2048", "--set", "train.new_data=true"], "data.batch_tokens=1024 (now 2048)"),
])
def test_a_resume_that_would_train_otherwise_is_refused_and_config_json_keeps_the_run(
        full_run, m30k_centered, tmp_path, capsys, change, refused):
    """Issue 66, B: a resume with another schedule, microbatch, sampling or loss used to keep the
    checkpoint's schedule but take the rest mid-run, and wrote the new values into config.json
    (which cll-extend reads to continue the schedule). Every such setting is refused before
    anything loads; config.json and metrics.jsonl are as the run left them."""
    import shutil
    from cll_scale.train import main
    from tests.conftest import run_cli
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    before = {name: (run / name).read_bytes() for name in ("config.json", "metrics.jsonl")}
    code, _, err = run_cli(main, [*common(m30k_centered, run, 42, *change), "--resume"], capsys)
    assert code == 2 and refused in err and "resume with the run's own settings" in err, err
    assert "a resume may change only train.shards, train.init_from" in err and "max_steps" in err
    assert {name: (run / name).read_bytes() for name in before} == before


def test_a_resume_may_change_its_budget_and_cadences(full_run, m30k_centered, tmp_path, capsys):
    """What decides only where a run stops and what it logs, validates or keeps may change."""
    import shutil
    from cll_scale.train import main
    from tests.conftest import run_cli
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    argv = [*common(m30k_centered, run, 41, "--set", "checkpoint.every=7", "--set", "checkpoint.keep_last=1",
                    "--set", "valid.every=500", "--set", "data.verify=size"), "--resume"]
    argv[argv.index("log.every=1")] = "log.every=5"
    code, _, err = run_cli(main, argv, capsys)
    assert code == 0, err
    config = json.loads((run / "config.json").read_text())
    assert (config["train"]["max_steps"], config["checkpoint"]["every"], config["log"]["every"]) == (41, 7, 5)


def probe(launch, shards, run_dir, report, steps, *extra, env=None):
    args = [*common(shards, run_dir, steps, "--set", "train.grad_accum=2", *extra), "--report", str(report)]
    return subprocess.Popen([*launch, str(ROOT / "tests" / "ds_probe.py"), *args], cwd=ROOT,
                            env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.whole_machine
@pytest.mark.integration
def test_two_ranks_zero2_then_resume_on_one_rank(m30k_centered, tmp_path):
    run, report = tmp_path / "run", tmp_path / "report.json"
    finish(probe([DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port())], m30k_centered, run, report, 12))
    ranks = json.loads(report.read_text())
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    assert all(r["threads"] == 1 for r in ranks)
    assert ranks[0]["param_sha"] == ranks[1]["param_sha"]            # data parallel: one model
    total = ranks[0]["total_params"]
    parts = [r["opt_partition_numel"] for r in ranks]
    assert sum(parts) >= total and max(parts) <= total // 2 + 64      # ZeRO-2: optimizer state halved
    assert len(list((run / "checkpoints" / "step00000012").glob("zero_pp_rank_*_optim_states.pt"))) == 2
    assert all(r["step"] == 12 for r in ranks)     # steps whose LSL gradients cover one language only
    # Resume the 2-rank checkpoint in one process: universal conversion, loss goes on.
    res = cll_train(*common(m30k_centered, run, 18, "--set", "train.grad_accum=2"), "--resume")
    assert "universal checkpoint" in res.stderr
    after = losses(run)
    assert sorted(after) == list(range(1, 19))
    assert all(abs(after[s]) < 20 for s in range(13, 19))
    assert abs(after[13] - after[12]) < 1.0                          # continuous, not restarted


@pytest.mark.whole_machine
@pytest.mark.integration
def test_simulated_two_node_launch(m30k_centered, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-a slots=1\nnode-b slots=1\n")
    port = str(free_port())
    report = tmp_path / "report.json"
    procs = [probe([DEEPSPEED, "--hostfile", str(hostfile), "--num_nodes", "2", "--num_gpus", "1", "--no_ssh",
                    "--master_addr", "127.0.0.1", "--master_port", port, "--node_rank", str(node)],
                   m30k_centered, tmp_path / "run", report, 6) for node in (0, 1)]
    for p in procs:
        finish(p)
    ranks = json.loads(report.read_text())
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["param_sha"] == ranks[1]["param_sha"]
    assert (tmp_path / "run" / "export" / "model.safetensors").is_file()


def test_an_absent_language_lsl_moves_only_by_momentum_under_zero2(m30k_centered, tmp_path):
    """What holds for a language absent from a step (FCLL, ZeRO-2, AdamW, one direction per step):
    its LSL gets no gradient, so before it is first trained it stays bit-identical to its initial
    value; once trained, later steps without it still move it, by AdamW's momentum (ZeRO updates its
    whole flat partition). Issue 34's finding 1, kept as a specification of data.mixing=direction."""
    import torch
    from cll_scale.model.config import ModelConfig
    from cll_scale.model.model import CLLTransformer
    from cll_scale.data.stream import ShardStream, StreamConfig
    from tests.test_train_step import checkpoint_weights
    run = tmp_path / "run"
    cll_train(*common(m30k_centered, run, 4, "--set", "checkpoint.every=1", "--set", "checkpoint.keep_last=10",
                      "--set", "checkpoint.export=false", "--set", "data.mixing=direction"))
    config = json.loads((run / "config.json").read_text())
    model_cfg = ModelConfig.from_json(config["model"])
    stream = ShardStream(m30k_centered, StreamConfig(**config["data"]))
    targets = [next(stream).direction.split("-")[1] for _ in range(4)]
    torch.manual_seed(config["train"]["seed"])
    before = {n: p.detach().clone() for n, p in CLLTransformer(model_cfg).named_parameters() if n.startswith("lsl.")}
    trained: set[str] = set()
    moved_by_momentum = never_moved = 0
    for step, tgt in enumerate(targets, 1):
        after = {n: w for n, w in checkpoint_weights(run, step).items() if n.startswith("lsl.")}
        for slot, lang in enumerate(model_cfg.lsl_languages):
            changed = not torch.equal(before[f"lsl.{slot}"], after[f"lsl.{slot}"])
            if lang == tgt:
                assert changed, (step, lang)
            elif lang not in trained:
                assert not changed, (step, lang)                 # never had a gradient, never moved
                never_moved += 1
            else:
                assert changed, (step, lang)                     # absent now, moved by its momentum
                moved_by_momentum += 1
        trained.add(tgt)
        before = after
    assert never_moved >= 1 and moved_by_momentum >= 1, targets     # both cases were seen



def test_a_torn_metrics_line_is_dropped_on_resume_and_damaged_json_names_its_file(full_run, m30k_centered, tmp_path):
    """Issue 66: a torn last line of metrics.jsonl (a full disk leaves one) stopped --resume with
    "Unterminated string starting at: line 1 column 27"; now it is dropped with a warning naming
    the file and the line, and the run goes on. A damaged config.json, or a recipe given as
    --ds-config, is named, before the run directory is touched."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 41, "loss": 3.')
    torn = len((run / "metrics.jsonl").read_text().splitlines())
    res = cll_train(*common(m30k_centered, run, 42), "--resume")
    assert f"warning: {run / 'metrics.jsonl'}: line {torn} is torn" in res.stderr
    assert train_steps(run) == list(range(1, 43))            # every line whole, each step once

    shutil.rmtree(run)
    shutil.copytree(full_run, run)
    (run / "config.json").write_text('{"preset": "tiny", "model": {"d_mo')
    res = cll_train(*common(m30k_centered, run, 42), "--resume", check=False)
    assert res.returncode == 2 and f"cll-train: error: {run / 'config.json'}: line 1, column" in res.stderr

    fresh = tmp_path / "fresh"
    recipe = ROOT / "recipes" / "multi30k_triangle_fcll.yaml"
    res = cll_train(*common(m30k_centered, fresh, 2), "--ds-config", str(recipe), check=False)
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"cll-train: error: {recipe}: line 1, column 1: not valid JSON" in res.stderr
    assert "a recipe goes to --recipe" in res.stderr and not fresh.exists()


def test_a_second_start_in_the_same_process_finds_no_stale_group(m30k_centered, tmp_path, capsys):
    """Two cll-train starts in one process (a notebook, the suite's in-process tests): the first
    left DeepSpeed's clone of the world group behind when it destroyed the process groups, and the
    second failed with "Group <ProcessGroup …> is not registered". Both run now."""
    from cll_scale.train import main
    from tests.conftest import run_cli
    for name in ("first", "second"):
        code, out, err = run_cli(main, [*common(m30k_centered, tmp_path / name, 2), "--dry-run",
                                        "--dry-run-steps", "1"], capsys)
        assert code == 0 and '"dry_run"' in out, err

"""A new user's mistakes, one test per finding of the misuse probe (docs/reliability.md): nothing
is lost, nothing is silently wrong, and every expected failure is one line with its exit code."""
import json
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cll_scale.core.errors import EXIT_DEVICE, EXIT_FILES, EXIT_INPUT
from tests.conftest import ROOT, run_cli
from tests.test_train import ENV, common, losses

PY = sys.executable


def one_line_error(res, prog, code, *needles):
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    line = next(x for x in res.stderr.splitlines() if x.startswith(f"{prog}: error:"))
    for needle in needles:
        assert needle in line, (needle, line)
    return line


# -- finding 2: one run owns its directory ------------------------------------------------------

@pytest.mark.integration
def test_second_run_into_the_same_directory_is_refused_and_a_killed_one_resumes(m30k_centered, tmp_path, cmd):
    run = tmp_path / "run"
    first = subprocess.Popen([PY, "-m", "cll_scale.train", *common(m30k_centered, run, 100000)], cwd=ROOT, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not ((run / "metrics.jsonl").exists() and losses(run)):
            time.sleep(0.2)
        second = cmd("cll_scale.train", *common(m30k_centered, run, 5), "--resume")
        line = one_line_error(second, "cll-train", EXIT_INPUT, "in use by", f"pid {first.pid}", "since")
        assert "host" in line
    finally:
        first.kill()          # kill -9: the kernel drops the lock with the process
        first.wait()
    steps = max(losses(run))
    res = cmd("cll_scale.train", *common(m30k_centered, run, steps + 2, "--set", "checkpoint.every=1"), "--resume")
    assert res.returncode == 0, res.stderr[-3000:]


# -- finding 3 and 11: --resume never starts over in silence ----------------------------------------

def test_resume_with_no_complete_checkpoint_is_one_clear_error(m30k_centered, tmp_path, cmd):
    """The fall-back to the newest complete checkpoint is specified in-process
    (tests/test_checkpointer.py); what the command adds is one line, naming each tag and what is
    wrong with it, when nothing is left to resume from."""
    run = tmp_path / "run"
    args = common(m30k_centered, run, 10, "--set", "checkpoint.every=5", "--set", "checkpoint.export=false")
    assert cmd("cll_scale.train", *args).returncode == 0
    for f in (run / "checkpoints").glob("step*/*model_states.pt"):
        f.write_bytes(b"")
    res = cmd("cll_scale.train", *common(m30k_centered, run, 12), "--resume")
    one_line_error(res, "cll-train", EXIT_INPUT, "no complete checkpoint", "step00000010:", "step00000005:")


def test_resume_with_other_model_settings_is_refused_before_loading(m30k_centered, tmp_path, cmd):
    run = tmp_path / "run"
    assert cmd("cll_scale.train", *common(m30k_centered, run, 3, "--set", "checkpoint.export=false")).returncode == 0
    args = common(m30k_centered, run, 6, "--set", "checkpoint.export=false")
    args[args.index("tiny")] = "small"
    res = cmd("cll_scale.train", *args, "--resume")
    one_line_error(res, "cll-train", EXIT_INPUT, "--resume:", "model.d_model=32 (now 256)")
    res = cmd("cll_scale.train", *common(m30k_centered, run, 6, "--set", "model.lsl_dim=8"), "--resume")
    one_line_error(res, "cll-train", EXIT_INPUT, "model.lsl_dim=16 (now 8)")


# -- finding 4 and 5: reruns with changed arguments are refused or honoured ---------------------------

def test_fine_tuning_settings_are_recorded_and_a_changed_rerun_names_each_difference(tmp_path):
    from cll_scale.loops.finetune import record_settings
    from cll_scale.core.outputs import OutputError
    out = tmp_path / "bt"
    first = {"bt_langs": ["de"], "max_rows": 10, "lr": 3e-4, "epochs": 2}
    record_settings(out, "cll-bt", first, {"epochs"}, restart=False)
    (out / "parts").mkdir()
    record_settings(out, "cll-bt", {**first, "epochs": 4}, {"epochs"}, restart=False)    # more epochs: fine
    with pytest.raises(OutputError) as err:
        record_settings(out, "cll-bt", {**first, "bt_langs": ["fr"], "max_rows": 20, "lr": 1e-2}, {"epochs"}, False)
    msg = str(err.value)
    assert "--bt-langs ['de'] (now ['fr'])" in msg and "--max-rows 10 (now 20)" in msg and "--lr 0.0003 (now 0.01)" in msg
    assert "--restart" in msg and (out / "parts").is_dir()
    record_settings(out, "cll-bt", {**first, "lr": 1e-2}, {"epochs"}, restart=True)     # discards the old run
    assert not (out / "parts").exists()
    assert json.loads((out / "settings.json").read_text())["settings"]["lr"] == 1e-2
    victim = tmp_path / "mine"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep")
    with pytest.raises(OutputError, match="not a cll-bt run"):
        record_settings(victim, "cll-bt", first, set(), restart=True)
    with pytest.raises(OutputError, match="not empty"):
        record_settings(victim, "cll-bt", first, set(), restart=False)
    assert (victim / "notes.txt").read_text() == "keep"


# -- finding 6, 7, 15, 18: honest scoring ---------------------------------------------------------

def test_eval_counts_are_validated_and_an_empty_selection_is_an_error(tiny_export, m30k_centered, multi30k,
                                                                       tmp_path, capsys):
    from cll_scale.evaluate import main
    base = ["--model", f"fcll={tiny_export}", "--data", str(m30k_centered), "--split", "test_2016_flickr"]
    with pytest.raises(SystemExit) as exit_:
        main([*base, "--out", str(tmp_path / "r"), "--max-sentences", "-1"])
    assert exit_.value.code == EXIT_INPUT and "negative" in capsys.readouterr().err
    code, _, err = run_cli(main, [*base, "--out", str(tmp_path / "r"), "--directions", "en-xx"], capsys)
    assert code == EXIT_INPUT and "no direction en-xx" in err and "en-de" in err
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run_cli(main, [*base, "--out", str(afile)], capsys)
    assert code == EXIT_INPUT and "is a file" in err and afile.read_text() == "x"
    # A split that is not there names the ones that are.
    code, _, err = run_cli(main, ["--model", f"fcll={tiny_export}", "--corpus", str(multi30k), "--split", "tset",
                                  "--out", str(tmp_path / "v")], capsys)
    assert code == EXIT_INPUT and "no split 'tset'" in err and "test_2016_flickr" in err and "--condition" not in err


def test_eval_lists_skipped_directions_and_averages_only_shared_ones(tiny_export, triangle_export, multi30k,
                                                                      tmp_path, capsys):
    from cll_scale.evaluate import main
    tri, _ = triangle_export
    out = tmp_path / "r"
    code, table, err = run_cli(main, ["--model", f"all={tiny_export}", "--model", f"tri={tri}", "--corpus",
                                      str(multi30k), "--split", "valid", "--max-sentences", "5",
                                      "--directions", "en-de,de-fr,fr-de", "--out", str(out)], capsys)
    assert code == 0, err
    report = json.loads((out / "results.json").read_text())
    assert report["models"]["tri"]["skipped"] == {"en-de": "the model has no en"}
    assert report["common_directions"] == ["de-fr", "fr-de"]
    assert "en-de  skipped: the model has no en" in err and "averages only the 2 they share" in err
    assert "cover only the 2 every model was scored on: de-fr, fr-de" in table and "Not scored: tri: en-de" in table
    assert all(d["n"] == 5 for m in report["models"].values() for d in m["directions"])     # not 4 (no [:-1])


# -- finding 8, 13: settings checked at the config boundary --------------------------------------------

def test_impossible_settings_and_bad_recipes_are_one_line_errors(m30k_centered, tiny_export, tmp_path, capsys, cmd):
    res = cmd("cll_scale.train", *common(m30k_centered, tmp_path / "a", 2, "--set", "model.dropout=1.5"))
    one_line_error(res, "cll-train", EXIT_INPUT, "model.dropout must be in [0, 1), not 1.5")
    res = cmd("cll_scale.train", *common(m30k_centered, tmp_path / "a", 2, "--set", "train.lrr=1"))
    one_line_error(res, "cll-train", EXIT_INPUT, "unknown setting train.lrr; did you mean optim.lr?")
    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: tiny\nmodel:\n  dropout: [0.1\n")
    res = cmd("cll_scale.train", "--recipe", bad, "--data", m30k_centered, "--max-steps", 1)
    one_line_error(res, "cll-train", EXIT_INPUT, f"{bad}: line", "not valid YAML")
    bad.write_text("train: 5\n")
    res = cmd("cll_scale.train", "--recipe", bad, "--data", m30k_centered, "--max-steps", 1)
    one_line_error(res, "cll-train", EXIT_INPUT, "section 'train' must be a mapping")
    afile = tmp_path / "afile"
    afile.write_text("")
    res = cmd("cll_scale.train", *common(m30k_centered, afile / "run", 2))
    one_line_error(res, "cll-train", EXIT_FILES, "Not a directory")
    from cll_scale.translate import main
    src = tmp_path / "in.txt"
    src.write_text("Ein Hund.\n")
    code, out, err = run_cli(main, ["--model", str(tiny_export), "--tgt-lang", "fr", "--input", str(src),
                                    "--max-len-a", "0", "--max-len-b", "-5"], capsys)
    assert code == EXIT_INPUT and "b >= 1" in err and out == ""
    with pytest.raises(SystemExit) as exit_:        # a float flag is finite at the parser (round 2)
        main(["--model", str(tiny_export), "--tgt-lang", "fr", "--input", str(src), "--len-penalty", "nan"])
    assert exit_.value.code == EXIT_INPUT and "--len-penalty must be a finite number, not 'nan'" in capsys.readouterr().err
    from demo.cli import main as demo_main
    with pytest.raises(SystemExit) as exit_:
        demo_main(["--model", str(tiny_export), "--max-chars", "0"])
    assert exit_.value.code == EXIT_INPUT and "expected 1 or more" in capsys.readouterr().err


# -- finding 9: the demo's batch tab says why there is no BLEU -------------------------------------

def test_demo_batch_refuses_references_of_another_length(tiny_export, tmp_path):
    from demo.app import Demo
    demo = Demo({"fcll": str(tiny_export)})
    src, refs = tmp_path / "src.txt", tmp_path / "refs.txt"
    src.write_text("Ein Hund.\nEine Katze.\n")
    refs.write_text("A dog.\nA cat.\nA bird.\nA fish.\nA cow.\n")
    table, path = demo.batch(str(src), str(refs), "en")
    assert "do not match" in table and "2 sentence lines but 5 reference lines" in table and path is None
    refs.write_text("A dog.\nA cat.\n")
    table, path = demo.batch(str(src), str(refs), "en")
    assert "| fcll |" in table and "–" not in table.splitlines()[-1] and path


# -- finding 10, 16: cll-repro -----------------------------------------------------------------------

def test_repro_writes_outside_the_checkout_and_checks_its_arguments_first(multi30k, tmp_path, cmd, monkeypatch):
    repro = ["cll_scale.repro", "--condition", "triangle", "--corpus", multi30k]
    from cll_scale.repro.cli import build_parser
    defaults = build_parser().parse_args(["--condition", "triangle"])
    assert all(str(getattr(defaults, k)).startswith("runs/repro") for k in ("out", "runs_root", "shards_root"))
    monkeypatch.chdir(tmp_path)                                  # the defaults are relative to it
    res = cmd(*repro, "--variants", "bogus")
    one_line_error(res, "cll-repro", EXIT_INPUT, "multi30k_triangle_bogus.yaml", "baseline")
    assert not (tmp_path / "runs").exists()                      # nothing built before the check
    res = cmd(*repro, "--eval-only")
    one_line_error(res, "cll-repro", EXIT_INPUT, "--eval-only: no trained model")
    res = cmd(*repro, "--steps-per-model", "-5")
    assert res.returncode == EXIT_INPUT and "-5 is negative" in res.stderr and "KeyError" not in res.stderr


# -- finding 12: Ctrl-C --------------------------------------------------------------------------

@pytest.mark.whole_machine
@pytest.mark.integration
def test_ctrl_c_checkpoints_and_exits_130_in_one_line(m30k_centered, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([PY, "-m", "cll_scale.train", *common(m30k_centered, run, 100000,
                                                                  "--set", "checkpoint.export=false")],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and losses(run)):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err
    step = max(losses(run))
    assert f"cll-train: stopped by SIGINT at step {step}, after saving its checkpoint" in err
    assert (run / "checkpoints" / "latest").read_text() == f"step{step:08d}"


# -- finding 14: cll-translate's files and devices ---------------------------------------------------

def test_translate_output_and_device_mistakes_are_one_line(tiny_export, tmp_path, capsys):
    from cll_scale.translate import main
    src = tmp_path / "in.txt"
    src.write_text("Ein Hund.\n")
    base = ["--model", str(tiny_export), "--tgt-lang", "fr", "--input", str(src)]
    code, _, err = run_cli(main, [*base, "--output", str(tmp_path)], capsys)
    assert code == EXIT_INPUT and "is a directory" in err
    code, _, err = run_cli(main, [*base, "--output", str(tmp_path / "missing" / "x.txt")], capsys)
    assert code == EXIT_INPUT and "does not exist" in err
    import torch
    if not torch.cuda.is_available():
        code, _, err = run_cli(main, [*base, "--device", "cuda"], capsys)
        assert code == EXIT_DEVICE and "no CUDA device" in err and "Traceback" not in err


# -- finding 17, 18, 20: fine-tuning commands name their own options, and write nothing on a refusal ----

def test_fine_tuning_refusals_name_real_options_and_leave_nothing(tiny_export, m30k_centered, triangle_export,
                                                                  multi30k, tmp_path, cmd):
    ext = ["cll_scale.extend", "--model", tiny_export, "--data", m30k_centered, "--corpus", multi30k,
           "--pairs", "en-xx,xx-en"]
    for extra, needle in ((["--lang", "xx"], "--lang 'xx' is not an ISO 639-1 language code"),
                          (["--lang", "it", "--max-steps", "0"], "--max-steps must be >= 1"),
                          (["--lang", "it", "--max-pairs", "0"], "--max-pairs must be >= 1")):
        out = tmp_path / "ext"
        line = one_line_error(cmd(*ext, "--out", out, *extra), "cll-extend", EXIT_INPUT, needle)
        assert "--langs" not in line and "--allow-lang" not in line and "max-minutes" not in line
        assert not out.exists()
    _, tri_shards = triangle_export
    out = tmp_path / "bt"
    res = cmd("cll_scale.backtranslate", "--model", tiny_export, "--data", tri_shards, "--out", out)
    one_line_error(res, "cll-bt", EXIT_INPUT, "was not trained on --data")
    assert not out.exists()                                     # no empty parts/ left behind
    res = cmd("cll_scale.backtranslate", "--model", tiny_export, "--data", m30k_centered, "--out", out,
              "--max-rows", "-1")
    one_line_error(res, "cll-bt", EXIT_INPUT, "--max-rows must be >= 0")
    assert not out.exists()


# -- finding 19: a corpus with no validation split ------------------------------------------------------

def test_no_validation_split_is_said_once_at_start(small_multiway, tmp_path, cmd):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in small_multiway.glob("train.*"):
        shutil.copy(f, corpus / f.name)
    from cll_scale.data.shards import BuildConfig, build_shards
    from cll_scale.data.corpora import read_multiway
    shards = tmp_path / "shards"
    build_shards(read_multiway(corpus, "centered"), BuildConfig(out_dir=str(shards), vocab_size=800))
    res = cmd("cll_scale.train", *common(shards, tmp_path / "run", 3, "--set", "valid.every=1"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("no validation split: no validation, and no export-best/") == 1
    assert (tmp_path / "run" / "export").is_dir() and not (tmp_path / "run" / "export-best").exists()


# -- finding 22: raw bytes never reach the terminal -------------------------------------------------------

def test_truncation_warning_escapes_control_characters(tiny_export, tmp_path, cmd, caplog):
    """The warning's text (in process the suite's log capture holds it; that a warning goes to
    stderr as one line is tests/test_std_streams.py's)."""
    src = tmp_path / "in.txt"
    src.write_text("\x1b[31mrot " + "Hund " * 2000 + "\n", encoding="utf-8")
    caplog.set_level("WARNING")
    res = cmd("cll_scale.translate", "--model", tiny_export, "--tgt-lang", "fr", "--input", src, "--max-len-b", "3",
              "--beam", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    warned = "\n".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "truncated" in warned and "\\x1b[31m" in warned and "\x1b" not in warned + res.stderr


def test_every_command_takes_debug_for_the_traceback(tmp_path, cmd):
    res = cmd("cll_scale.evaluate", "--model", f"x={tmp_path}", "--data", tmp_path, "--out", tmp_path / "r")
    one_line_error(res, "cll-eval", EXIT_INPUT)
    res = cmd("cll_scale.evaluate", "--model", f"x={tmp_path}", "--data", tmp_path, "--out", tmp_path / "r", "--debug")
    assert res.returncode == EXIT_INPUT and "Traceback" in res.stderr and "cll-eval: error:" in res.stderr

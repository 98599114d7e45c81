"""Who owns an output directory (the second misuse round, docs/reliability.md rows 24-): a command
never deletes, replaces or resumes into what another command wrote, an output is never one of the
command's inputs (by any name), and a refused command leaves nothing behind."""
import json
import os
import threading
from pathlib import Path

import pytest

from cll_scale.core.errors import EXIT_INPUT
from cll_scale.core.outputs import (DirLock, OutputError, atomic_dir, check_apart, check_owner, directory_owner,
                                    share_modes)
from tests.conftest import run_cli
from tests.test_misuse import one_line_error
from tests.test_train import common


def fake_run(path, command, **settings):
    """A directory as cll-bt or cll-extend leaves it: its settings.json and some outputs."""
    path.mkdir(parents=True)
    (path / "settings.json").write_text(json.dumps({"command": command, "settings": settings}))
    (path / "init-export").mkdir()
    (path / "spm.model").write_bytes(b"pieces")
    return path


# -- finding 1: --restart deletes another tool's run -------------------------------------------------

def test_restart_never_deletes_another_commands_run(tmp_path):
    from cll_scale.loops.finetune import record_settings
    ext = fake_run(tmp_path / "ext", "cll-extend", lang="it")
    for restart in (False, True):
        with pytest.raises(OutputError) as err:
            record_settings(ext, "cll-bt", {"epochs": 1}, set(), restart=restart)
        assert "holds a cll-extend run, not a cll-bt one" in str(err.value)
        assert "--restart" not in str(err.value)          # no advice that would discard it
    assert sorted(p.name for p in ext.iterdir()) == ["init-export", "settings.json", "spm.model"]
    bt = fake_run(tmp_path / "bt", "cll-bt", epochs=1)
    with pytest.raises(OutputError, match="holds a cll-bt run, not a cll-extend one"):
        record_settings(bt, "cll-extend", {"lang": "it"}, set(), restart=True)
    assert (bt / "spm.model").read_bytes() == b"pieces"
    record_settings(bt, "cll-bt", {"epochs": 2}, set(), restart=True)     # its own run: discarded as asked
    assert not (bt / "spm.model").exists()


def test_owners_are_recognised_by_their_markers(tmp_path, m30k_centered, tiny_export):
    assert directory_owner(m30k_centered) == "cll-shards build"
    assert directory_owner(tiny_export.parent) == "cll-train"
    assert directory_owner(fake_run(tmp_path / "b", "cll-bt")) == "cll-bt"
    assert directory_owner(tmp_path / "nothing") is None
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    assert directory_owner(plain) is None
    check_owner(plain, "cll-eval")                       # a user's folder is not another command's
    with pytest.raises(OutputError, match="--run-dir .* holds a cll-shards build run, not a cll-train one"):
        check_owner(m30k_centered, "cll-train", "--run-dir")


def test_train_and_eval_refuse_another_commands_directory(m30k_centered, tiny_export, tmp_path, cmd):
    bt = fake_run(tmp_path / "bt", "cll-bt")
    before = sorted(p.name for p in bt.iterdir())
    res = cmd("cll_scale.train", *common(m30k_centered, bt, 2))
    one_line_error(res, "cll-train", EXIT_INPUT, "holds a cll-bt run, not a cll-train one")
    res = cmd("cll_scale.evaluate", "--model", f"m={tiny_export}", "--data", m30k_centered, "--out", bt,
              "--max-sentences", "1")
    one_line_error(res, "cll-eval", EXIT_INPUT, "holds a cll-bt run, not a cll-eval one")
    assert sorted(p.name for p in bt.iterdir()) == before           # not even a .lock


# -- finding 2: output onto input ----------------------------------------------------------------------

def test_output_that_is_the_input_by_any_name_is_refused_before_reading(tiny_export, tmp_path, capsys, cmd):
    from cll_scale.translate import main
    src = tmp_path / "in.txt"
    src.write_text("Ein Hund läuft.\n")
    link = tmp_path / "link.txt"
    link.symlink_to(src)
    hard = tmp_path / "hard.txt"
    os.link(src, hard)
    for output in (src, link, hard):
        code, _, err = run_cli(main, ["--model", str(tiny_export), "--tgt-lang", "fr", "--input", str(src),
                                      "--output", str(output)], capsys)
        assert code == EXIT_INPUT and f"--output {output} is the input --input {src}" in err, err
    assert src.read_text() == "Ein Hund läuft.\n"
    # (the same refusal for the file on standard input is tests/test_std_streams.py's: a redirection)
    out = tmp_path / "out.txt"                           # a different file still works
    res = cmd("cll_scale.translate", "--model", tiny_export, "--tgt-lang", "fr", "--input", src, "--output", out)
    assert res.returncode == 0 and out.read_text().count("\n") == 1


def test_outputs_inside_or_around_inputs_are_refused(tmp_path, m30k_centered, tiny_export, cmd, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("x")
    with pytest.raises(OutputError, match="sits inside the input --corpus"):
        check_apart(corpus / "eval", {"--corpus": corpus})
    with pytest.raises(OutputError, match="contains the input --model m"):
        check_apart(tmp_path, {"--model m": corpus / "a.txt"})
    check_apart(tmp_path / "elsewhere", {"--corpus": corpus, "--data": None, "--hub": "org/name"})
    # an unset setting is no input, not the working directory: cll-train with no train.init_from
    # once refused every run directory inside the one it ran in (make quickstart's runs/)
    check_apart(Path.cwd() / "runs" / "x", {"train.init_from": ""})
    monkeypatch.chdir(tmp_path)
    res = cmd("cll_scale.train", *common(m30k_centered, "runs/inside", 2))
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "runs" / "inside" / "export" / "export.json").is_file()
    res = cmd("cll_scale.evaluate", "--model", f"m={tiny_export}", "--data", m30k_centered,
              "--out", m30k_centered / "eval", "--max-sentences", "1")
    one_line_error(res, "cll-eval", EXIT_INPUT, "sits inside the input --data")
    assert not (m30k_centered / "eval").exists()
    res = cmd("cll_scale.train", *common(m30k_centered, m30k_centered / "run", 2))
    one_line_error(res, "cll-train", EXIT_INPUT, "sits inside the input --data")
    assert not (m30k_centered / "run").exists()


# -- finding 4: two builds into one new directory ----------------------------------------------------

def test_a_directory_that_appears_meanwhile_is_never_replaced(tmp_path):
    out = tmp_path / "shards"
    started, other_done = threading.Event(), threading.Event()

    def other_build():
        started.wait()
        with atomic_dir(out, replace=True) as tmp:
            (tmp / "manifest.json").write_text("second")
        other_done.set()

    worker = threading.Thread(target=other_build)
    worker.start()
    with pytest.raises(FileExistsError, match="appeared while it was being built"):
        with atomic_dir(out, replace=True) as tmp:     # `--overwrite`, but `out` did not exist at the start
            (tmp / "manifest.json").write_text("first")
            started.set()
            other_done.wait(30)
    worker.join()
    assert (out / "manifest.json").read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["shards"]      # no temporary left
    with atomic_dir(out, replace=True) as tmp:          # existing at the start: replaced, as asked
        (tmp / "manifest.json").write_text("third")
    assert (out / "manifest.json").read_text() == "third"


# -- finding 5: model names that collide after sanitising ----------------------------------------------

def test_model_names_that_share_a_folder_are_refused(tiny_export, m30k_centered, tmp_path, cmd):
    out = tmp_path / "eval"
    res = cmd("cll_scale.evaluate", "--model", f"m ü={tiny_export}", "--model", f"m_ü={tiny_export}",
              "--data", m30k_centered, "--out", out, "--max-sentences", "1")
    one_line_error(res, "cll-eval", EXIT_INPUT, "'m ü' and 'm_ü' both become the folder 'm_ü'")
    assert not out.exists()


# -- finding 10: export permissions ---------------------------------------------------------------------

def test_exported_files_are_readable_by_others(tiny_export, tmp_path):
    mask = os.umask(0o022)
    try:
        modes = {p.name: p.stat().st_mode & 0o777 for p in tiny_export.iterdir()}
        assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
        private = tmp_path / "d"
        private.mkdir()
        (private / "f").write_text("x")
        (private / "f").chmod(0o600)
        share_modes(private)
        assert (private / "f").stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(mask)


# -- finding 21: a refused command leaves no .lock ----------------------------------------------------

def test_a_refused_command_leaves_no_lock_and_a_removed_lock_is_not_trusted(m30k_centered, tiny_export, tmp_path, cmd):
    res = cmd("cll_scale.backtranslate", "--model", tiny_export, "--data", m30k_centered, "--out", m30k_centered)
    one_line_error(res, "cll-bt", EXIT_INPUT)
    assert not (m30k_centered / ".lock").exists()
    fresh = tmp_path / "new"
    lock = DirLock(fresh, "test").acquire()
    lock.abandon()
    assert not fresh.exists()                        # made by the lock, empty: removed with it
    kept = tmp_path / "kept"
    kept.mkdir()
    first = DirLock(kept, "test").acquire()
    opened = os.open(kept / DirLock.NAME, os.O_RDWR)  # a second process that opened the file just before
    first.abandon()
    os.close(opened)
    assert kept.is_dir() and not (kept / DirLock.NAME).exists()
    second = DirLock(kept, "test").acquire()          # locks the file that exists now, not the removed one
    assert os.fstat(second.fd).st_ino == os.stat(kept / DirLock.NAME).st_ino
    second.release()


# -- issue 51, build note: an output that cannot be written is named as the user gave it -------------

def test_an_atomic_output_that_cannot_be_written_names_itself_not_its_temporary_folder(tmp_path):
    """Every command's atomic directory (shards, exports, extensions, back-translations): when its
    temporary sibling cannot be made, the error names the output (by the caller's ``name``, e.g.
    ``--out x``) and the folder that refused it, never the ``.x.tmp-PID`` the user did not ask for."""
    (tmp_path / "afile").write_text("keep")
    out = tmp_path / "afile" / "export"
    for name, shown in ((None, str(out)), ("--run-dir r", "--run-dir r")):
        with pytest.raises(OSError) as err, atomic_dir(out, replace=True, name=name):
            pytest.fail("the block ran although the output cannot be written")
        assert str(err.value) == f"{shown} cannot be written: {tmp_path / 'afile'}: a file, not a directory"
        assert ".tmp-" not in str(err.value)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"] and (tmp_path / "afile").read_text() == "keep"


# -- issue 51 (class C): cll-analyze and cll-eval own their output as the other commands do ---------

def test_an_export_is_named_as_an_export(tiny_export, m30k_centered, tmp_path, capsys):
    """Issue 51 row 19: an export (export.json, with a copy of the shards' manifest.json) was
    named "a cll-shards build run"."""
    import shutil
    from cll_scale.analyze import main as analyze_main
    from cll_scale.core.outputs import EXPORT
    copy = tmp_path / "exp-copy"
    shutil.copytree(tiny_export, copy)
    assert directory_owner(copy) == EXPORT and directory_owner(m30k_centered) == "cll-shards build"
    code, _, err = run_cli(analyze_main, ["attribution", "--model", str(tiny_export), "--text", "Ein Hund.",
                                          "--tgt-lang", "fr", "--out", str(copy)], capsys)
    assert code == EXIT_INPUT and f"--out {copy} holds an export (export.json), not a cll-analyze one" in err, err
    with pytest.raises(OutputError, match="--run-dir .* holds an export \\(export.json\\), not a cll-train one"):
        check_owner(copy, "cll-train", "--run-dir")
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in tiny_export.iterdir())


@pytest.mark.parametrize("command", ["cll-analyze", "cll-eval"])
def test_an_unwritable_output_is_refused_before_any_work(tiny_export, m30k_centered, tmp_path, capsys, monkeypatch,
                                                         command):
    """Issue 51 row 17: the output's place was first written after all the work. A file on the
    way refuses the directory to every user (root included, whom neither chmod nor, in most
    containers, chattr stops); a read-only folder only to one who is not root."""
    from cll_scale.analyze import main as analyze_main
    from cll_scale.core.errors import EXIT_FILES
    from cll_scale.evaluate import main as eval_main
    from cll_scale.evaluation.translator import Translator
    monkeypatch.setattr(Translator, "load", lambda *a, **k: pytest.fail("a model was loaded before the refusal"))
    (tmp_path / "afile").write_text("a file")
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o555)
    refused = {tmp_path / "afile" / "out": f"{tmp_path / 'afile'}: a file, not a directory"}
    if not os.access(readonly, os.W_OK):                 # root writes into a 0555 folder anyway
        refused[readonly / "out"] = f"{readonly}: Permission denied"
    for out, why in refused.items():
        if command == "cll-analyze":
            argv = ["attribution", "--model", str(tiny_export), "--data", str(m30k_centered), "--direction", "de-fr",
                    "--out", str(out)]
            code, _, err = run_cli(analyze_main, argv, capsys)
        else:
            argv = ["--model", f"m={tiny_export}", "--data", str(m30k_centered), "--out", str(out)]
            code, _, err = run_cli(eval_main, argv, capsys)
        assert code == EXIT_FILES, err
        assert err == f"{command}: error: --out {out} cannot be written: {why}; nothing was computed\n"
    assert (tmp_path / "afile").read_text() == "a file" and not any(readonly.iterdir())

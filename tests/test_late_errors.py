"""Late errors (the second misuse round, docs/reliability.md): arguments are checked before any
work and named by the flag the user typed, a run that failed before its first output may be re-run
with other arguments, a moved run goes on, and a damaged checkpoint is never used again."""
import json
import shutil

import pytest

from cll_scale.core.errors import EXIT_INPUT
from cll_scale.core.outputs import OutputError
from tests.test_train import common, losses


# -- finding 11: a damaged checkpoint is set aside, and the rerun works ----------------------------

def test_a_damaged_checkpoint_is_never_used_again(m30k_centered, tmp_path, cmd):
    """What only the command shows: the step saved afresh, the export, and a second resume. Every
    kind of damage, and the fall-back itself, are specified in-process (tests/test_checkpointer.py)."""
    run = tmp_path / "run"
    settings = ("--set", "checkpoint.every=10", "--set", "checkpoint.keep_last=3", "--set", "valid.every=15")
    assert cmd("cll_scale.train", *common(m30k_centered, run, 30, *settings)).returncode == 0
    model = next((run / "checkpoints" / "step00000030").glob("*model_states.pt"))
    model.write_bytes(model.read_bytes()[:100])
    res = cmd("cll_scale.train", *common(m30k_centered, run, 30, *settings), "--resume")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from step00000020" in res.stderr and "moved the damaged step00000030 aside" in res.stderr
    assert (run / "checkpoints" / "damaged-step00000030").is_dir()
    assert (run / "checkpoints" / "latest").read_text() == "step00000030"        # written afresh
    assert (run / "export" / "export.json").is_file() and max(losses(run)) == 30
    again = cmd("cll_scale.train", *common(m30k_centered, run, 32, *settings), "--resume")
    assert again.returncode == 0 and "resumed from" in again.stderr and "step00000030" in again.stderr, \
        again.stderr[-3000:]


# -- findings 16, 17: checked before any work, by the user's flag -----------------------------------

def test_fine_tuning_arguments_are_checked_before_any_work(tiny_export, m30k_centered, multi30k, tmp_path, cmd):
    out = tmp_path / "bt"
    base = ["cll_scale.backtranslate", "--model", tiny_export, "--data", m30k_centered, "--out", out]
    for extra, needle in ((["--eval-splits", "nosuch"], "--eval-splits nosuch: "),
                          (["--max-tokens", "5"], "--batch-tokens 5 cannot hold the longest pair"),
                          (["--lr", "inf"], "--lr must be a finite number, not 'inf'")):
        res = cmd(*base, *extra)
        assert res.returncode == EXIT_INPUT and needle in res.stderr, res.stderr[-2000:]
        assert "optim.lr" not in res.stderr and "Traceback" not in res.stderr
        assert not out.exists()                             # nothing generated, nothing recorded
    ext = tmp_path / "ext"
    res = cmd("cll_scale.extend", "--model", tiny_export, "--data", m30k_centered, "--corpus", multi30k,
              "--lang", "it", "--pairs", "en-it", "--out", ext, "--seed", "-1")
    assert res.returncode == EXIT_INPUT and "--seed: -1 is negative" in res.stderr and "Traceback" not in res.stderr


def test_a_run_that_wrote_nothing_yet_takes_other_settings(tmp_path):
    from cll_scale.loops.finetune import record_settings
    out = tmp_path / "ext"
    record_settings(out, "cll-extend", {"vocab_size": 200, "lang": "it"}, set(), restart=False)
    # It failed before its first output (say, SentencePiece refused 200 pieces): the corrected
    # command starts it afresh instead of being told to pass --restart.
    record_settings(out, "cll-extend", {"vocab_size": 50, "lang": "it"}, set(), restart=False)
    assert json.loads((out / "settings.json").read_text())["settings"]["vocab_size"] == 50
    (out / "spm.model").write_bytes(b"x")                   # once it has written something, it is a run
    with pytest.raises(OutputError, match="--vocab-size 50 \\(now 60\\)"):
        record_settings(out, "cll-extend", {"vocab_size": 60, "lang": "it"}, set(), restart=False)


def test_vocabulary_too_large_names_the_flag(m30k_centered, tmp_path):
    from cll_scale.data.manifest import Manifest
    from cll_scale.data.spm_extend import ExtendError, extend_sentencepiece
    old = m30k_centered / Manifest.load(m30k_centered).tokenizer.file
    text = ["Una frase breve, però già così è ricca: àèéìòù!", "Un cane corre sulla spiaggia?"] * 25
    with pytest.raises(ExtendError) as err:
        extend_sentencepiece(old, "it", text, tmp_path / "x.model", ["a dog runs"], 8, 1)
    assert "--vocab-size 8" in str(err.value) and "raise --vocab-size" in str(err.value)
    assert "character_coverage" not in str(err.value)
    assert not (tmp_path / "x.model").exists()


# -- finding 18: a moved run goes on -----------------------------------------------------------------

def test_a_moved_run_and_moved_inputs_resume(m30k_centered, tiny_export, tmp_path):
    from cll_scale.loops.finetune import record_settings, resolved_settings

    def open_output(out, settings):          # what cll-bt does on rank 0 (finetune.open_output)
        resolved, identity = resolved_settings(settings)
        record_settings(out, "cll-bt", resolved, set(), False, identity)
    data = tmp_path / "data"
    shutil.copytree(m30k_centered, data)
    settings = {"model": str(tiny_export), "data": str(data), "out": str(tmp_path / "bt"), "epochs": 1}
    open_output(tmp_path / "bt", settings)
    (tmp_path / "bt" / "parts").mkdir()
    (tmp_path / "bt").rename(tmp_path / "moved")
    data.rename(tmp_path / "data2")
    moved = {**settings, "data": str(tmp_path / "data2"), "out": str(tmp_path / "moved")}
    open_output(tmp_path / "moved", moved)                # the same contents at new paths
    recorded = json.loads((tmp_path / "moved" / "settings.json").read_text())
    assert recorded["settings"]["data"] == str(tmp_path / "data2")
    other = tmp_path / "data3"
    shutil.copytree(tmp_path / "data2", other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["block_rows"] += 1
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(OutputError, match="If --data only moved, give the new path of the same contents"):
        open_output(tmp_path / "moved", {**moved, "data": str(other)})

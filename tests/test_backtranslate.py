"""cll-bt end to end on real Multi30k text with a `tiny` model: pseudo data as inspectable
shards, nothing dropped silently, training carried across epochs, a before/after table, and a
restart that keeps finished generation work."""
import json
import os
import subprocess

import pytest

from cll_scale.data.languages import Direction
from cll_scale.data.manifest import Manifest
from tests.conftest import ROOT, built_once, head_corpus, train_in_process
from tests.test_train import DEEPSPEED, free_port

ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
BT_LANGS = ["de", "fr", "cs"]
MAX_ROWS = 50


@pytest.fixture(scope="module")
def small_model(multi30k, tmp_path_factory):
    """Shards of the first 300 lines of Multi30k and a `tiny` model trained on them; read, never
    changed, by both tests (built once for the session)."""
    from cll_scale.data.shards import BuildConfig, build_shards
    from cll_scale.data.corpora import read_multiway

    def build(root):
        corpus = head_corpus(multi30k, root / "small", lambda name: name.startswith(("train.", "val.")))
        build_shards(read_multiway(corpus, "centered"), BuildConfig(out_dir=str(root / "shards"), vocab_size=1000,
                                                                    block_rows=64))
        train_in_process("--data", root / "shards", "--preset", "tiny", "--run-dir", root / "pretrain", "--max-steps",
                         "10", "--ds-config", "cpu_fp32.json", "--set", "data.batch_tokens=1024", "--set",
                         "optim.lr=3e-3", "--set", "optim.warmup_steps=5")
    root = built_once(tmp_path_factory, "bt-small", build)
    return root / "shards", root / "pretrain" / "export"


def bt_args(shards, export, out, *extra) -> list[str]:
    return ["--model", str(export), "--data", str(shards), "--out", str(out), "--bt-langs", ",".join(BT_LANGS),
            "--epochs", "2", "--max-rows", str(MAX_ROWS), "--ds-config", "cpu_fp32.json", "--batch-tokens", "1024",
            "--lr", "1e-3", "--warmup-steps", "5", "--eval-splits", "valid", "--eval-max-sentences", "20",
            "--eval-beam", "2", *map(str, extra)]


def check_epochs(shards, out):
    """Both epochs' data: a verified manifest, every planned pair accounted for, the real data linked."""
    state = json.loads((out / "bt.json").read_text())
    assert state["epochs_done"] == 2
    original = Manifest.load(shards)
    for epoch in (1, 2):
        data = out / "data" / f"epoch-{epoch}"
        m = Manifest.load(data)
        m.verify(data, full=True)
        pseudo = [s for s in m.splits["train"].shards if s.file.startswith("train/bt.")]
        assert pseudo, "no pseudo shards"
        for s in pseudo:    # a pseudo source is in another chosen language than its target
            d = Direction.parse(s.direction)
            assert d.src in BT_LANGS and d.src != d.tgt
        # Every planned pair is either a pseudo pair or counted as filtered.
        filtered = sum(n for k, c in m.splits["train"].filtered.items() if k.startswith("bt.") for n in c.values())
        assert sum(s.rows for s in pseudo) + filtered == MAX_ROWS * len(original.splits["train"].directions())
        # The real data is all there, as links to the original files.
        real = {s.file for s in original.splits["train"].shards}
        assert real <= {s.file for s in m.splits["train"].shards}
        f = next(iter(real))
        assert os.stat(data / f).st_ino == os.stat(shards / f).st_ino
        # rank 0's generation speed: every pseudo pair it planned, in measured time
        speed = state["generation"][str(epoch)]
        assert speed["seconds"] > 0 and speed["sentences_per_s"] == speed["pseudo_sentences"] / speed["seconds"]


def test_back_translation_epochs_resume_and_report(small_model, tmp_path, cmd):
    shards, export = small_model

    def cll_bt(*args):
        return cmd("cll_scale.backtranslate", *bt_args(*args))
    out = tmp_path / "bt"
    res = cll_bt(shards, export, out)
    assert res.returncode == 0, res.stderr[-3000:]
    check_epochs(shards, out)
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    steps, epochs, lrs = ([r[k] for r in train] for k in ("step", "epoch", "lr"))
    assert steps == sorted(set(steps))              # one run: the step count goes on across epochs
    assert sum(b < a for a, b in zip(epochs, epochs[1:])) == 1, epochs   # the data epoch restarts once
    assert lrs == sorted(lrs, reverse=True)         # and the schedule does not (no second warm-up)
    assert "continuing" in res.stderr and "on new data" in res.stderr     # epoch 2 went on from epoch 1
    table = (out / "eval" / "valid" / "results.md").read_text()
    assert "; beam 2;" in table
    assert "| before |" in table and "| after 2 BT epochs |" in table
    assert "## valid" in res.stdout

    # An interruption in epoch 2's generation: finished chunks are kept, the missing one is made.
    parts = sorted((out / "parts" / "epoch-2").glob("*.json"))
    assert len(parts) == len(Manifest.load(shards).splits["train"].directions())
    state = json.loads((out / "bt.json").read_text())
    (out / "bt.json").write_text(json.dumps({**state, "epochs_done": 1}))
    import shutil
    shutil.rmtree(out / "data" / "epoch-2")
    parts[0].unlink()
    kept = {p: p.stat().st_mtime_ns for p in parts[1:]}
    res = cll_bt(shards, export, out)
    assert res.returncode == 0, res.stderr[-3000:]
    assert parts[0].exists() and all(p.stat().st_mtime_ns == t for p, t in kept.items())
    Manifest.load(out / "data" / "epoch-2").verify(out / "data" / "epoch-2")

    # Other settings in the same directory are refused; so is an unknown language.
    res = cll_bt(shards, export, out, "--lr", "5e-4")
    assert res.returncode == 2 and "other settings: --lr 0.001 (now 0.0005)" in res.stderr
    assert json.loads((out / "run" / "config.json").read_text())["optim"]["lr"] == 1e-3   # the record stays true
    res = cll_bt(shards, export, tmp_path / "bt2", "--bt-langs", "de,xx")
    assert res.returncode == 2 and "xx" in res.stderr and "(en, cs, de, fr)" in res.stderr


@pytest.mark.whole_machine
@pytest.mark.integration
def test_back_translation_on_two_ranks(small_model, tmp_path):
    """`deepspeed --num_gpus 2` (one thread per rank): the ranks share generation and training,
    rank 0 evaluates after the group is gone, both exit cleanly, and the printed command is the
    one the user typed (the launcher's --local_rank left out)."""
    shards, export = small_model
    out = tmp_path / "bt"
    res = subprocess.run([DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port()), "--module",
                          "cll_scale.backtranslate", *bt_args(shards, export, out)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    check_epochs(shards, out)
    assert "Command: `cll-bt --model" in res.stdout and "` (2 ranks)" in res.stdout
    assert "--local_rank" not in res.stdout.split("Command:")[1].splitlines()[0]
    assert "| after 2 BT epochs |" in (out / "eval" / "valid" / "results.md").read_text()
    assert "terminate called" not in res.stderr



def test_a_rerun_asking_fewer_epochs_than_done_is_refused(triangle_export, tmp_path):
    """Issue 66: `cll-bt --epochs 1` after 2 epochs evaluated the model of 2 epochs as "after 1 BT
    epochs" (bt.json: 2). Refused before anything is written; as many or more epochs go on."""
    from cll_scale.loops.backtranslate import BTConfig, check_epochs
    export, shards = triangle_export
    out = tmp_path / "bt"
    out.mkdir()
    (out / "bt.json").write_text(json.dumps({"epochs_done": 2}))     # as the second epoch leaves it

    def cfg(epochs):
        return BTConfig(model=str(export), data=str(shards), out=str(out), epochs=epochs, batch_tokens=1024)
    with pytest.raises(ValueError) as err:
        check_epochs(cfg(1), restart=False)
    assert str(err.value) == (f"--epochs 1: {out} has done 2 back-translation epochs, and its model is the one "
                              f"after them; ask --epochs 2 (or more, to go on), or --restart")
    assert sorted(p.name for p in out.iterdir()) == ["bt.json"]
    for epochs, restart in ((2, False), (3, False), (1, True)):
        assert check_epochs(cfg(epochs), restart).languages == ["de", "fr", "cs"]


@pytest.mark.parametrize("flag", ["--eval-beam", "--beam"])
def test_a_beam_wider_than_the_vocabulary_is_refused_before_generation(small_model, tmp_path, capsys, flag):
    """Issue 66, C: `cll-bt --eval-beam 600` on shards of a smaller vocabulary failed in the
    before/after evaluation, after generation and training. Both beams are checked first."""
    from cll_scale.backtranslate import main
    from cll_scale.core.errors import EXIT_INPUT
    from tests.conftest import run_cli
    shards, export = small_model
    vocab = Manifest.load(shards).tokenizer.vocab_size
    out = tmp_path / "bt"
    code, _, err = run_cli(main, ["--model", str(export), "--data", str(shards), "--out", str(out),
                                  "--ds-config", "cpu_fp32.json", "--batch-tokens", "1024", flag, str(vocab + 1)], capsys)
    assert code == EXIT_INPUT and f"{flag} {vocab + 1:,} exceeds this model's vocabulary" in err, err
    assert not out.exists()

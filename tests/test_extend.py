"""cll-extend on real Multi30k text: a `tiny` FCLL model pre-trained on en/de/fr learns cs.
Old ids and old-language tokenisation are kept, the grown model scores the old vocabulary as the
original did, frozen parameters stay bit-identical, and the CLI reports before/after."""
import json
import os
import sys

import pytest
import sentencepiece as spm
import torch
from safetensors.torch import load_file, save_file

from cll_scale.data.manifest import Manifest
from cll_scale.data.stream import eval_batches
from cll_scale.loops.extend import grow_model, old_cll_patterns
from cll_scale.model.export import load_export
from tests.conftest import ROOT, built_once, head_corpus, train_in_process

@pytest.fixture(scope="module")
def pretrained(multi30k, tmp_path_factory):
    """en/de/fr centered shards (first 300 lines) and a tiny FCLL model trained on them."""
    from cll_scale.data.shards import BuildConfig, build_shards
    from cll_scale.data.corpora import read_multiway
    def build(tmp):
        corpus = head_corpus(multi30k, tmp / "corpus",
                             lambda name: name.startswith(("train.", "val.", "test_2016_flickr.")))
        build_shards(read_multiway(corpus, "centered", langs=["en", "de", "fr"]),
                     BuildConfig(out_dir=str(tmp / "shards"), vocab_size=1000, block_rows=64))
        train_in_process("--data", tmp / "shards", "--preset", "tiny", "--run-dir", tmp / "pretrain", "--max-steps",
                         "12", "--ds-config", "cpu_fp32.json", "--set", "data.batch_tokens=1024", "--set",
                         "optim.lr=3e-3", "--set", "optim.warmup_steps=5")
    tmp = built_once(tmp_path_factory, "extend", build)
    return tmp / "corpus", tmp / "shards", tmp / "pretrain" / "export"


def cll_extend(cmd, corpus, shards, export, out, *extra):
    return cmd("cll_scale.extend", "--model", export, "--data", shards, "--lang", "cs", "--corpus", corpus, "--pairs",
               "en-cs,cs-en", "--max-pairs", "200", "--vocab-size", "600", "--out", out, "--max-steps", "8",
               "--ds-config", "cpu_fp32.json", "--batch-tokens", "1024", "--eval-splits", "test_2016_flickr",
               "--eval-max-sentences", "10", "--eval-beam", "2", *extra)


def test_grown_model_scores_old_vocabulary_as_before(pretrained):
    _, shards, export = pretrained
    model, manifest = load_export(export)
    grown = grow_model(model, "cs", manifest.tokenizer.vocab_size + 50, noise=0.01, seed=1)
    assert grown.cfg.languages == ["en", "de", "fr", "cs"]
    t = grown.t_weights()
    assert t["cs"] == pytest.approx([(a + b) / 2 for a, b in zip(t["de"], t["fr"])])
    for direction in ("en-de", "de-en", "en-fr"):
        b = next(eval_batches(shards, "valid", direction, 1024))
        with torch.no_grad():
            old = model(b.src_tokens, model.shift_right(b.tgt_tokens), b.tgt_lang)
            new = grown(b.src_tokens, grown.shift_right(b.tgt_tokens), b.tgt_lang)
        v = old.shape[-1]
        torch.testing.assert_close(new[..., :v], old, rtol=0, atol=1e-5)
    assert old_cll_patterns(grown.cfg, "cs") == ["lsl.0", "lsl.1"]


def test_cll_extend_end_to_end(pretrained, tmp_path, cmd):
    corpus, shards, export = pretrained
    out = tmp_path / "ext"
    res = cll_extend(cmd, corpus, shards, export, out)
    assert res.returncode == 0, res.stderr[-3000:]
    merged = Manifest.load(out / "data")
    merged.verify(out / "data", full=True)
    assert merged.languages == ["en", "de", "fr", "cs"] and merged.central_language == "en"
    assert {"en-cs", "cs-en"} <= set(merged.supervised) and {"de-cs", "cs-fr"} <= set(merged.zero_shot)
    assert merged.splits["train"].rows("en-cs") == 200
    # Old ids are unchanged and old-language text tokenises as before.
    a = spm.SentencePieceProcessor(model_file=str(shards / "spm.model"))
    b = spm.SentencePieceProcessor(model_file=str(out / "data" / "spm.model"))
    assert b.get_piece_size() > a.get_piece_size()
    assert all(a.id_to_piece(i) == b.id_to_piece(i) for i in range(a.get_piece_size()))
    for lang in ("en", "de", "fr"):
        lines = (corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        assert a.encode(lines) == b.encode(lines), lang
    cs = (corpus / "val.cs").read_text(encoding="utf-8").splitlines()
    assert sum(map(len, b.encode(cs))) < sum(map(len, a.encode(cs)))
    # Right after extension the old directions score the old vocabulary exactly as before (the
    # grown export, read back from disk, not just the in-memory model).
    original, _ = load_export(export)
    grown, _ = load_export(out / "init-export")
    batch = next(eval_batches(shards, "valid", "en-de", 1024))
    with torch.no_grad():
        want = original(batch.src_tokens, original.shift_right(batch.tgt_tokens), batch.tgt_lang)
        got = grown(batch.src_tokens, grown.shift_right(batch.tgt_tokens), batch.tgt_lang)
    torch.testing.assert_close(got[..., :want.shape[-1]], want, rtol=0, atol=1e-5)
    # Frozen parameters (the old languages' LSLs and t) are bit-identical after fine-tuning.
    w0 = load_file(str(out / "init-export" / "model.safetensors"))
    tuned_dir = out / "run" / "export-best" if (out / "run" / "export-best").exists() else out / "run" / "export"
    w1 = load_file(str(tuned_dir / "model.safetensors"))
    frozen = [k for k in w0 if k in ("lsl.0", "lsl.1")]                       # de's and fr's LSLs and t
    assert len(frozen) == 2 and all(torch.equal(w0[k], w1[k]) for k in frozen)
    assert not torch.equal(w0["lsl.2"], w1["lsl.2"])                          # cs's LSL learned
    # ... and the report's measurement of it (scripts/results.py) agrees, and can say otherwise.
    sys.path.insert(0, str(ROOT / "scripts"))
    from results import frozen_check
    assert frozen_check(out).startswith(f"{len(frozen)} of {len(frozen)} frozen tensors bit-identical")
    moved = tmp_path / "moved"
    (moved / "init-export").mkdir(parents=True)
    save_file({**w0, frozen[0]: w0[frozen[0]] + 1}, str(moved / "init-export" / "model.safetensors"))
    os.symlink(out / "run", moved / "run")
    assert frozen_check(moved).startswith(f"{len(frozen) - 1} of {len(frozen)} frozen")
    assert not torch.equal(w0["embed.weight"], w1["embed.weight"])
    info = json.loads((out / "init-export" / "export.json").read_text())
    assert info["pretrain"]["step"] == 12
    table = (out / "eval" / "test_2016_flickr" / "results.md").read_text()
    assert "; beam 2;" in table
    assert "| original |" in table and "| +cs | en-cs |" in table and "| +cs | de-cs | zero-shot |" in table

    # Re-running resumes (nothing rebuilt); bad arguments are clear errors.
    mtime = (out / "data" / "manifest.json").stat().st_mtime_ns
    res = cll_extend(cmd, corpus, shards, export, out)
    assert res.returncode == 0 and (out / "data" / "manifest.json").stat().st_mtime_ns == mtime
    # ... but not with other data: the recorded settings say what differs (misuse finding 4).
    res = cll_extend(cmd, corpus, shards, export, out, "--pairs", "de-cs,cs-de")
    assert res.returncode == 2 and "--pairs ['en-cs', 'cs-en'] (now ['de-cs', 'cs-de'])" in res.stderr
    assert (out / "data" / "manifest.json").stat().st_mtime_ns == mtime
    res = cll_extend(cmd, corpus, shards, export, tmp_path / "x", "--lang", "de")
    assert res.returncode == 2 and "already has 'de'" in res.stderr
    res = cll_extend(cmd, corpus, shards, export, tmp_path / "y", "--pairs", "de-fr")
    assert res.returncode == 2 and "de-fr" in res.stderr


def test_a_rerun_asking_fewer_steps_than_trained_is_refused(pretrained, tmp_path):
    """Found beside issue 66's cll-bt row: `cll-extend --max-steps 4` after 8 steps kept the 8-step
    model and recorded 4 in settings.json. Refused before anything is written; as many or more go on."""
    from cll_scale.loops.extend import ExtendConfig, check_steps
    corpus, shards, export = pretrained
    out = tmp_path / "ext"
    (out / "run").mkdir(parents=True)
    (out / "run" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in (
        {"step": 8, "loss": 3.0}, {"step": 8, "valid_loss": 3.1})))         # the last line: a validation

    def cfg(steps):
        return ExtendConfig(model=str(export), data=str(shards), lang="cs", corpus=str(corpus), pairs=["en-cs"],
                            out=str(out), max_steps=steps, batch_tokens=1024)
    with pytest.raises(ValueError) as err:
        check_steps(cfg(4), restart=False)
    assert str(err.value) == (f"--max-steps 4: {out} has done 8 fine-tuning steps, and its model is the one after "
                              f"them; ask --max-steps 8 (or more, to go on), or --restart")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["run", "run/metrics.jsonl"]
    for steps, restart in ((8, False), (12, False), (4, True)):
        assert check_steps(cfg(steps), restart).languages == ["en", "de", "fr"]


def test_the_pretraining_schedule_is_found_beside_the_export_or_refused_before_any_work(pretrained, tmp_path, capsys,
                                                                                        monkeypatch):
    """Issue 66, C: an export trained with a relative --run-dir, extended from elsewhere, built the
    data and the grown model before "its pre-training schedule is unknown", and the rerun with
    --lr (as the message said) was refused as other settings. The schedule is read from the run
    directory the export sits in; when there is none the refusal comes before any work, so the
    rerun with --lr is a fresh run."""
    import shutil
    from cll_scale.core.errors import EXIT_INPUT
    from cll_scale.extend import main
    from cll_scale.loops.extend import ExtendConfig, check_inputs, pretrain_schedule
    from tests.conftest import run_cli
    corpus, shards, export = pretrained
    run = tmp_path / "moved" / "pretrain"
    shutil.copytree(export.parent, run, ignore=shutil.ignore_patterns("checkpoints"))
    alone = tmp_path / "alone" / "model"
    shutil.copytree(export, alone)
    for copy in (run / "export", alone):
        info = json.loads((copy / "export.json").read_text())
        (copy / "export.json").write_text(json.dumps({**info, "run_dir": "pretrain"}))   # relative, as typed
    monkeypatch.chdir(tmp_path)            # elsewhere: ./pretrain is not there
    out = tmp_path / "ext"
    argv = ["--model", str(alone), "--data", str(shards), "--lang", "cs", "--corpus", str(corpus), "--pairs",
            "en-cs,cs-en", "--out", str(out), "--ds-config", "cpu_fp32.json", "--batch-tokens", "1024"]
    code, _, err = run_cli(main, argv, capsys)
    assert code == EXIT_INPUT and "its pre-training schedule is unknown" in err and "pass --lr" in err, err
    assert not out.exists()
    cfg = ExtendConfig(model=str(alone), data=str(shards), lang="cs", corpus=str(corpus), pairs=["en-cs", "cs-en"],
                       out=str(out), batch_tokens=1024, lr=1e-3)
    assert check_inputs(cfg).languages == ["en", "de", "fr"]        # with --lr: accepted
    assert pretrain_schedule(run / "export") == {"lr": 3e-3, "warmup_steps": 5, "step": 12}
    assert pretrain_schedule(alone) == {}

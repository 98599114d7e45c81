"""What a full-scale run needs before it starts: `cll-train --dry-run` (the run built and timed,
its figures consistent with the manifest, nothing written to the run directory) and validation on
the first N sentences of each direction (`valid.max_sentences`, OPUS-100: 200 of 2,000)."""
import json
import tempfile

import pytest
import torch

from tests.conftest import ROOT


def test_dry_run_prints_consistent_figures_and_leaves_the_run_dir_alone(m30k_centered, tmp_path, cmd,
                                                                          monkeypatch):
    from cll_scale.model.config import ModelConfig, PRESETS
    from cll_scale.data.manifest import Manifest
    from cll_scale.model.model import CLLTransformer
    run, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))     # TMPDIR, as the command reads it
    res = cmd("cll_scale.train", "--data", m30k_centered, "--preset", "tiny", "--run-dir", run, "--max-steps", "100",
              "--ds-config", "cpu_fp32.json", "--set", "data.batch_tokens=1024", "--dry-run", "--dry-run-steps", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])["dry_run"]
    m = Manifest.load(m30k_centered)
    train = m.splits["train"].shards
    # The model the run would train, counted independently.
    model = CLLTransformer(ModelConfig(**PRESETS["tiny"], vocab_size=m.tokenizer.vocab_size, languages=m.languages,
                                       central_language=m.central_language))
    assert r["parameters"] == sum(p.numel() for p in model.parameters())
    assert r["tensors"] == len(list(model.parameters()))
    # An epoch is every training row once; its target tokens (with eos) come from the manifest.
    assert r["epoch_rows"] == sum(s.rows for s in train)
    assert r["epoch_target_tokens"] == sum(s.tgt_tokens + s.rows for s in train)
    # Steps per epoch come from rows per step: with tokens per step they must give back the epoch's
    # target tokens (the sampled batches have the corpus's tokens per row).
    assert r["steps_per_epoch"] * r["tokens_per_step"] == pytest.approx(r["epoch_target_tokens"], rel=0.1)
    assert 0 < r["tokens_per_step"] <= 1024 and 0 < r["burst_tokens_per_step"] <= 1024
    assert r["seconds_per_epoch"] == pytest.approx(r["steps_per_epoch"] * r["seconds_per_step"])
    assert r["budget_steps"] == 100 and (r["warmup_steps"], r["timed_steps"]) == (2, 3)
    assert f"{r['parameters']:,} in {r['tensors']} tensors" in res.stdout
    assert f"{r['steps_per_epoch']:,.0f} steps per epoch" in res.stdout
    # Nothing in the run directory, and the temporary one (with its lock) is gone.
    assert not run.exists()
    assert not list(tmp.glob("cll-dry-run-*"))


def test_dry_run_refuses_resume():
    from cll_scale.train import main
    with pytest.raises(SystemExit) as err:
        main(["--data", "x", "--dry-run", "--resume"])
    assert err.value.code == 2


def test_valid_max_sentences_splits_the_first_lines_over_ranks(m30k_centered):
    from cll_scale.data.stream import eval_batches
    from cll_scale.training.validator import lines_between
    n, max_tokens = 50, 512
    seen = []
    for rank, world in ((0, 2), (1, 2)):
        first, last = rank * n // world, (rank + 1) * n // world
        for b in lines_between(eval_batches(m30k_centered, "valid", "en-de", max_tokens), first, last, 0, max_tokens):
            assert len(b) * max(b.src_tokens.shape[1], b.tgt_tokens.shape[1]) <= max_tokens
            assert b.ntokens == int((b.tgt_tokens != 0).sum())
            assert all(first < x <= last for x in b.lines.tolist())
            seen += b.lines.tolist()
    assert sorted(seen) == list(range(1, n + 1))      # every one of the first n lines once (none empty)


def test_validator_scores_only_the_first_sentences(m30k_centered, monkeypatch):
    """The validation NLL with valid.max_sentences = N is the NLL of the first N lines of each
    direction, computed here one sentence at a time."""
    from cll_scale.model.config import ModelConfig, PRESETS
    from cll_scale.data.manifest import Manifest
    from cll_scale.model.model import CLLTransformer
    m = Manifest.load(m30k_centered)
    torch.manual_seed(0)
    model = CLLTransformer(ModelConfig(**PRESETS["tiny"], vocab_size=m.tokenizer.vocab_size, languages=m.languages,
                                       central_language=m.central_language)).eval()

    class Engine:                      # what Validator uses of a DeepSpeed engine
        module = model
        __call__ = staticmethod(model.__call__)
        eval = train = staticmethod(lambda: None)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t: None)     # one rank
    threads = torch.get_num_threads()
    torch.set_num_threads(1)           # tiny matrices: more threads only wait for each other
    try:
        check_first_sentences(m, model, Engine(), m30k_centered)
    finally:
        torch.set_num_threads(threads)


def check_first_sentences(m, model, engine, shards, n=12):
    from cll_scale.model.model import label_smoothed_loss
    from cll_scale.data.stream import StreamConfig, eval_batches
    from cll_scale.training.validator import ValidConfig, Validator, lines_between
    validator = Validator(ValidConfig(max_sentences=n), str(shards), StreamConfig(batch_tokens=1024), m, 0, 1,
                          torch.device("cpu"), None)
    record = validator.run(engine, 1).record
    assert len(record["valid_by_direction"]) == len(m.splits["valid"].directions())
    with torch.no_grad():
        for direction, got in record["valid_by_direction"].items():
            nll = tokens = 0.0
            lang = m.languages.index(direction.split("-")[1])
            for batch in eval_batches(shards, "valid", direction, 1024):
                for line in batch.lines.tolist():
                    if line <= n:
                        (one,) = lines_between([batch], line - 1, line, 0, 1024)
                        logits = model(one.src_tokens, model.shift_right(one.tgt_tokens), one.tgt_lang, lang_runs=((lang, len(one)),))
                        nll += float(label_smoothed_loss(logits, one.tgt_tokens, 0, 0.0)[1])
                        tokens += one.ntokens
            assert got == pytest.approx(nll / tokens, rel=1e-5), direction


def test_recipe_for_opus100_resolves():
    from cll_scale.run.recipe import build_configs, load_recipe
    from cll_scale.data.manifest import TokenizerInfo
    recipe = load_recipe(ROOT / "recipes" / "opus100_fcll_paper.yaml")
    tok = TokenizerInfo("spm.model", "", 64000, 0, 1, 2, 3, {})
    cfg = build_configs(recipe, ["en", "de", "fr"], "en", tok)
    assert (cfg.model.d_model, cfg.model.encoder_layers, cfg.model.variant) == (512, 6, "fcll")
    assert cfg.data.temperature == 5.0 and cfg.valid.max_sentences == 200 and cfg.optim.clip_norm == 0.0

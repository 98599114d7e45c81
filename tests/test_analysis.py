"""Paper §5's analyses (issue 35): tags follow the model, the tag omitted at test time, layer
attribution with Captum (Fig. 5), attention maps (Fig. 3), and their command ``cll-analyze``."""
import json
import math
import os

import pytest
import torch

from cll_scale.analysis.attribution import (COMPONENTS, attention_maps, attribute, is_symbol_piece, prepare, tag_share,
                                            token_class, token_log_probs)
from cll_scale.analyze import main as analyze_main
from cll_scale.evaluation.evaluator import TAG_OMITTED, evaluate_entries
from cll_scale.evaluation.testsets import pairs_from_shards
from cll_scale.evaluation.translator import Translator
from cll_scale.model.export import export_lang_tag
from tests.conftest import built_once, train_in_process

SENTENCE = "Ein Mann fährt mit dem Fahrrad eine Straße entlang."


@pytest.fixture(scope="module")
def tagless_export(m30k_centered, tmp_path_factory):
    """A `tiny` FCLL model trained without language tags (paper Table 7)."""
    def train(run):
        train_in_process("--data", m30k_centered, "--preset", "tiny", "--run-dir", run, "--max-steps", "6",
                         "--ds-config", "cpu_fp32.json", "--set", "valid.every=1000", "--set", "data.batch_tokens=1024",
                         "--set", "data.add_lang_tag=false")
    return built_once(tmp_path_factory, "tagless", train) / "export"


def test_a_tagless_model_is_exported_as_such_and_decodes_without_the_tag(tagless_export, tiny_export):
    assert export_lang_tag(tiny_export) is True
    assert export_lang_tag(tagless_export) is False
    tagged, tagless = Translator.load(tiny_export), Translator.load(tagless_export)
    tag_ids = set(tagless.manifest.tokenizer.lang_tag_ids.values())
    ids = tagless.encode(SENTENCE, "fr")
    assert ids == tagless.sp.encode(SENTENCE) + [tagless.eos]        # no tag anywhere
    assert not tag_ids & set(ids)
    assert tagged.encode(SENTENCE, "fr")[0] == tagged.manifest.tokenizer.lang_tag_ids["fr"]
    # what translate() decodes from is that encoding: the same output as a Translator told so
    as_tagged = Translator(tagless.model, tagless.manifest, tagless_export / "spm.model", lang_tag=True)
    assert as_tagged.encode(SENTENCE, "fr") != ids
    out = tagless.translate([SENTENCE], "fr")[0]
    assert out == Translator(tagless.model, tagless.manifest, tagless_export / "spm.model",
                             lang_tag=False).translate([SENTENCE], "fr")[0]
    with pytest.raises(ValueError, match="trained without language tags"):
        tagless.translate([SENTENCE], "fr", omit_tag=True)


def test_omitting_the_tag_changes_the_input_ids_and_is_an_evaluation_entry(tiny_export, tagless_export,
                                                                           m30k_centered):
    tr = Translator.load(tiny_export)
    with_tag, without = tr.encode(SENTENCE, "de"), tr.encode(SENTENCE, "de", omit_tag=True)
    assert with_tag[0] == tr.manifest.tokenizer.lang_tag_ids["de"] and without == with_tag[1:]
    pairs = pairs_from_shards(m30k_centered, "test_2016_flickr")
    logs = []
    entries = evaluate_entries(tr, "m", pairs, ["en-de"], max_sentences=3, omit_lang_tag=True, log=logs.append)
    assert set(entries) == {"m", "m" + TAG_OMITTED}
    assert entries["m"].lang_tag is True and entries["m" + TAG_OMITTED].lang_tag is False
    tagless = evaluate_entries(Translator.load(tagless_export), "n", pairs, ["en-de"], max_sentences=3,
                               omit_lang_tag=True, log=logs.append)
    assert set(tagless) == {"n"} and any("trained without language tags" in line for line in logs)


def test_attribution_completeness_holds_within_the_reported_delta(tiny_export):
    tr = Translator.load(tiny_export)
    ex = prepare(tr, SENTENCE, "fr")
    assert ex.tgt_pieces[-1] == "</s>" and len(ex.tgt_pieces) == ex.target.shape[1]
    res = attribute(tr.model, ex, n_steps=32)
    n_layers, t = len(tr.model.decoder), ex.target.shape[1]
    for name in COMPONENTS:
        for layer in range(n_layers):
            values, effect, delta = (res.values[name][layer], res.effect[name][layer], res.delta[name][layer])
            assert values is not None and len(values) == t          # tiny FCLL: every layer has an LSL
            for v, e, d in zip(values, effect, delta):
                # Captum's delta is exactly the completeness gap, measured here independently ...
                assert abs((v - e) - d) < 1e-4
                # ... and small against the effect it explains
                assert abs(d) <= 0.02 * max(abs(e), 1e-2)
    # the effect is the difference of log-probabilities with and without the component
    assert res.log_probs == pytest.approx(token_log_probs(tr.model, ex)[0].tolist(), abs=1e-5)
    assert any(abs(x) > 1e-4 for x in res.values["lsl2"][0])
    assert res.max_abs_delta() == max(abs(d) for rows in res.delta.values() for row in rows for d in row)


def test_attribution_of_a_layer_without_lsl_is_absent_and_components_are_checked(tiny_export):
    tr = Translator.load(tiny_export)
    ex = prepare(tr, SENTENCE, "en")        # the central language: no LSL runs
    res = attribute(tr.model, ex, n_steps=4, components=("ffn2", "lsl2"))
    assert all(row is None for row in res.values["lsl2"]) and res.per_token("lsl2") is None
    assert all(row is None for row in res.values["ffn1"])               # not asked for
    assert len(res.per_token("ffn2")) == ex.target.shape[1]
    with pytest.raises(ValueError, match="unknown components"):
        attribute(tr.model, ex, components=("ffn3",))


def test_attention_rows_sum_to_one_and_the_kept_weights_change_nothing(tiny_export):
    tr = Translator.load(tiny_export)
    ex = prepare(tr, SENTENCE, "fr")
    fast = token_log_probs(tr.model, ex)
    maps = attention_maps(tr.model, ex)
    s, t = ex.src_tokens.shape[1], ex.target.shape[1]
    assert [tuple(w.shape) for w in maps["encoder"]] == [(tr.model.cfg.n_heads, s, s)] * len(tr.model.encoder)
    assert tuple(maps["cross"][0].shape)[1:] == (t, s) and tuple(maps["decoder"][0].shape)[1:] == (t, t)
    for kind in maps:
        for w in maps[kind]:
            assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5)
    assert torch.all(maps["decoder"][0].triu(1) == 0)                    # causal
    assert 0.0 < tag_share(maps["encoder"][0]) < 1.0
    # weights are kept only inside the block, and the explicit path gives the fused kernel's outputs
    assert all(not m.keep_weights and m.weights is None for m in tr.model.attentions().values())
    with torch.no_grad():
        from cll_scale.analysis.attribution import keeping_attention
        with keeping_attention(tr.model):
            kept = token_log_probs(tr.model, ex)
    assert torch.allclose(fast, kept, atol=1e-5)


def test_token_classes():
    pieces = {"de": {"▁Mann", "▁Berlin"}, "fr": {"▁homme", "▁Berlin"}}
    assert is_symbol_piece(".") and is_symbol_piece("▁2014") and is_symbol_piece("</s>")
    assert not is_symbol_piece("▁") and not is_symbol_piece("▁a.")
    assert token_class("▁Berlin", "fr", pieces) == "shared"
    assert token_class("▁homme", "fr", pieces) == "specific"
    assert token_class(",", "fr", pieces) == "symbol"


def test_cll_analyze_attribution_and_attention(tiny_export, tagless_export, m30k_centered, tmp_path, capsys):
    out = tmp_path / "attr"
    code = analyze_main(["attribution", "--model", str(tiny_export), "--data", str(m30k_centered),
                         "--direction", "de-fr", "--sentences", "2", "--steps", "8", "--heatmaps", "1",
                         "--reference", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "analysis.json").read_text())
    assert summary["sentences"] == 2 and math.isfinite(summary["max_abs_delta"])
    rows = json.loads((out / "sentences.json").read_text())
    refs = pairs_from_shards(m30k_centered, "test_2016_flickr")["de-fr"][1]
    assert rows[0]["tgt_text"] == refs[0]                       # --reference: teacher-forced references
    tokens = sum(len(r["tgt_pieces"]) for r in rows)
    assert sum(c["tokens"] for c in summary["classes"].values()) == tokens
    shares = [c["opposite_sign_share"] for c in summary["classes"].values() if c["pairs_with_lsl"]]
    assert shares and all(0.0 <= x <= 1.0 for x in shares)
    assert (out / "heatmap-0.png").stat().st_size > 1000 and not (out / "heatmap-1.png").exists()
    assert "LSL and FFN of opposite sign" in (out / "analysis.md").read_text()

    att = tmp_path / "att"
    code = analyze_main(["attention", "--model", f"tags={tiny_export}", "--model", f"notags={tagless_export}",
                         "--omit-lang-tag", "--text", SENTENCE, "--tgt-lang", "fr", "--out", str(att)])
    assert code == 0
    cases = json.loads((att / "analysis.json").read_text())["cases"]
    assert list(cases) == ["tags", "tags (tag omitted)", "notags"]      # no tag to omit in a tagless model
    assert cases["tags"]["src_pieces"][0] == "<2fr>" and cases["tags (tag omitted)"]["src_pieces"] == \
        cases["tags"]["src_pieces"][1:] == cases["notags"]["src_pieces"]
    assert all(0.0 < x < 1.0 for x in cases["tags"]["tag_share"]) and cases["notags"]["tag_share"] is None
    for row in cases["tags"]["encoder"][0]:
        assert sum(row) == pytest.approx(1.0, abs=1e-5)
    assert (att / "encoder.png").is_file() and (att / "cross.png").is_file()
    capsys.readouterr()

    # another command's directory is refused, and so is a bad --index
    assert analyze_main(["attention", "--model", str(tiny_export), "--text", "x", "--tgt-lang", "fr",
                         "--out", str(tiny_export.parent)]) == 2
    assert analyze_main(["attention", "--model", str(tiny_export), "--data", str(m30k_centered),
                         "--direction", "de-fr", "--index", "5000", "--out", str(tmp_path / "x")]) == 2
    assert "cll-train run" in capsys.readouterr().err


# -- issue 51: cll-analyze owns its output and checks its flags and sizes before any work -----------

def analyze(capsys, *argv):
    """cll-analyze in this process: (exit code, stderr)."""
    code = analyze_main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.fixture()
def no_model_loaded(monkeypatch):
    """A refusal "before any work" is one that comes before the first model is loaded."""
    def loaded(*args, **kwargs):
        pytest.fail("a model was loaded before the refusal")
    monkeypatch.setattr(Translator, "load", loaded)


def attribution_of(export, shards, out, sentences, heatmaps=None):
    return ["attribution", "--model", export, "--data", shards, "--direction", "de-fr", "--reference",
            "--steps", "2", "--sentences", sentences, "--heatmaps", heatmaps or sentences, "--out", out]


@pytest.mark.parametrize("second, left", [
    ("fewer sentences", {"analysis.json", "analysis.md", "sentences.json", "heatmap-0.png"}),    # issue 51 row 13
    ("attention", {"analysis.json", "encoder.png", "cross.png"}),                                # issue 51 row 14
])
def test_a_rerun_leaves_only_its_own_files_in_the_directory(tiny_export, m30k_centered, tmp_path, capsys, second,
                                                            left):
    out = tmp_path / "D"
    assert analyze(capsys, *attribution_of(tiny_export, m30k_centered, out, 3))[0] == 0
    assert {"heatmap-1.png", "heatmap-2.png"} <= {p.name for p in out.iterdir()}
    argv = (attribution_of(tiny_export, m30k_centered, out, 1) if second == "fewer sentences" else
            ["attention", "--model", tiny_export, "--data", m30k_centered, "--direction", "de-fr", "--out", out])
    assert analyze(capsys, *argv)[0] == 0
    assert {p.name for p in out.iterdir()} == left
    if second == "fewer sentences":
        assert len(json.loads((out / "sentences.json").read_text())) == 1
    else:
        assert "cases" in json.loads((out / "analysis.json").read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["D"]                 # no temporary left beside it


def test_a_directory_in_use_by_another_analysis_is_refused(tiny_export, m30k_centered, tmp_path, capsys,
                                                           no_model_loaded):
    """Issue 51 row 15: two analyses into one --out at once; the second is refused, not the last writer."""
    from cll_scale.core.outputs import DirLock
    out = tmp_path / "an" / "cc"
    running = DirLock(out, "cll-analyze run").acquire()          # the first analysis, still at work
    try:
        code, err = analyze(capsys, *attribution_of(tiny_export, m30k_centered, out, 1))
    finally:
        running.release()
    assert code == 2 and "cll-analyze: error:" in err and f"{out} is in use by pid {os.getpid()}" in err, err
    assert [p.name for p in out.iterdir()] == [".lock"]           # the first one's lock, nothing written


@pytest.mark.parametrize("memory, argv, message", [
    # issue 51 row 12: numpy asked for 7.28 TiB; 16 GiB available allow 8 GiB, 16 · 23170² bytes of quadrature
    (16 * 2 ** 30, ["--steps", "1000000", "--text", SENTENCE, "--tgt-lang", "fr"],
     r"--steps 1000000 needs 14\.6 TiB for the integration's quadrature alone, more than the 8\.0 GiB cll-analyze "
     r"allows itself \(50% of the memory available\); --steps at most 23170 fits"),
    # one integration step of a sentence: the budget holds a target one token shorter than the reference
    (None, ["--data", "SHARDS", "--direction", "de-fr", "--reference", "--sentences", "1", "--steps", "2"],
     r"sentence 1 of --direction de-fr: the reference has (\d+) tokens, and one integration step of them needs "
     r".* more than the .* cll-analyze allows itself \(50% of the memory available\); the longest target that "
     r"fits is (\d+) tokens"),
], ids=["steps", "sentence length"])
def test_attribution_too_large_for_memory_is_refused_naming_the_largest_that_fits(
        tiny_export, m30k_centered, tmp_path, capsys, monkeypatch, memory, argv, message):
    import re
    import cll_scale.analysis.attribution as analysis
    if memory is None:
        tr = Translator.load(tiny_export)
        src, ref = (x[0] for x in pairs_from_shards(m30k_centered, "test_2016_flickr")["de-fr"])
        ex = prepare(tr, src, "fr", ref)
        s, t = ex.src_tokens.shape[1], ex.target.shape[1]
        memory = 2 * analysis.step_bytes(tr.model.cfg, s, t - 1)           # MEMORY_SHARE is a half
    else:
        monkeypatch.setattr(Translator, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(analysis, "available_memory", lambda device="cpu": memory)
    out = tmp_path / "an"
    code, err = analyze(capsys, "attribution", "--model", tiny_export, "--out", out,
                        *[str(m30k_centered) if a == "SHARDS" else a for a in argv])
    line = next(x for x in err.splitlines() if x.startswith("cll-analyze: error:"))
    found = re.search(message, line)
    assert code == 2 and found, line
    if found.groups():
        assert [int(x) for x in found.groups()] == [t, t - 1]
    assert "[cll-analyze] 1/" not in err and not out.exists()            # no sentence attributed, nothing left


def test_attribution_takes_as_many_steps_at_a_time_as_fit_with_the_same_result(tiny_export):
    """What fits in memory decides how many integration steps go through the model at once, not
    the values: memory no longer grows with --steps."""
    from cll_scale.analysis.attribution import MemoryBudget, step_bytes
    tr = Translator.load(tiny_export)
    ex = prepare(tr, SENTENCE, "fr", "Un homme fait du vélo dans la rue.")
    t = ex.target.shape[1]
    step = step_bytes(tr.model.cfg, ex.src_tokens.shape[1], t)
    rows = []           # the rows of each pass through the model
    hook = tr.model.encoder[0].register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    try:
        whole = attribute(tr.model, ex, 8, components=("ffn2", "lsl2"), budget=MemoryBudget(2 ** 40, 2 ** 40))
        assert max(rows) == 8 * t
        rows.clear()
        parts = attribute(tr.model, ex, 8, components=("ffn2", "lsl2"), budget=MemoryBudget(2 ** 40, 3 * step))
        assert max(rows) == 3 * t
    finally:
        hook.remove()
    for name in ("ffn2", "lsl2"):
        for a, b in zip(whole.values[name], parts.values[name]):
            assert a == pytest.approx(b, abs=1e-5)
    assert parts.max_abs_delta() == pytest.approx(whole.max_abs_delta(), abs=1e-5)
    with pytest.raises(ValueError, match=r"needs .* per integration step, more than the .* allowed; the longest"):
        attribute(tr.model, ex, 8, budget=MemoryBudget(2 ** 40, step - 1))


@pytest.mark.parametrize("analysis, argv, message", [
    # issue 51 row 20: --direction was silently ignored for --text
    ("attribution", ["--data", "SHARDS", "--direction", "de-fr", "--text", "Hallo Welt.", "--tgt-lang", "cs"],
     "--direction de-fr and --text both choose the sentences"),
    ("attention", ["--data", "SHARDS", "--direction", "de-fr", "--text", "Hallo Welt.", "--tgt-lang", "cs"],
     "--direction de-fr and --text both choose the sentences"),
    ("attribution", ["--data", "SHARDS", "--direction", "de-fr", "--tgt-lang", "cs"],
     "--tgt-lang cs disagrees with --direction de-fr, whose target is fr"),
])
def test_flags_that_disagree_about_the_sentences_are_refused_before_any_work(tiny_export, m30k_centered, tmp_path,
                                                                           capsys, no_model_loaded, analysis, argv,
                                                                           message):
    out = tmp_path / "an"
    code, err = analyze(capsys, analysis, "--model", tiny_export, "--out", out,
                        *[str(m30k_centered) if a == "SHARDS" else a for a in argv])
    assert code == 2 and f"cll-analyze: error: {message}" in err, err
    assert not out.exists()


@pytest.mark.parametrize("command", ["cll-eval", "cll-analyze attention"])
def test_omitting_the_tag_of_models_that_have_none_is_refused(tagless_export, tiny_export, m30k_centered, tmp_path,
                                                              capsys, command):
    """Issue 51's note: --omit-lang-tag adds the tag-omitted case to each model trained with tags and
    says so of the others; asked of tagless models only, it would add nothing: refused, as for one
    model in cll-translate."""
    from cll_scale.evaluate import main as eval_main
    out = tmp_path / "out"

    def run(*models):
        if command == "cll-eval":
            code = eval_main([*[a for m in models for a in ("--model", m)], "--data", str(m30k_centered),
                              "--split", "test_2016_flickr", "--directions", "en-de", "--max-sentences", "1",
                              "--beam", "1", "--lid-workers", "0", "--omit-lang-tag", "--out", str(out)])
        else:
            code = analyze_main(["attention", *[a for m in models for a in ("--model", m)], "--text", SENTENCE,
                                 "--tgt-lang", "fr", "--omit-lang-tag", "--out", str(out)])
        return code, capsys.readouterr().err
    code, err = run(f"n={tagless_export}")
    assert code == 2 and "--omit-lang-tag: the model n was trained without language tags" in err, err
    assert not out.exists()
    code, err = run(f"n={tagless_export}", f"m={tagless_export}")
    assert code == 2 and "none of the models (n, m) was trained with language tags" in err, err
    code, err = run(f"n={tagless_export}", f"t={tiny_export}")          # a tagged one: its case is added
    assert code == 0, err
    if command == "cll-eval":
        assert set(json.loads((out / "results.json").read_text())["models"]) == {"n", "t", "t" + TAG_OMITTED}
        assert "n: trained without language tags, so no 'tag omitted' entry" in err


def test_an_index_past_the_sentences_says_which_indices_there_are(tiny_export, m30k_centered, tmp_path, capsys,
                                                                 no_model_loaded):
    """Issue 66: `--index 3` with one --text sentence said "the direction has 1 sentences"."""
    code, err = analyze(capsys, "attention", "--model", tiny_export, "--text", "Ein Hund.", "--tgt-lang", "fr",
                        "--index", "3", "--out", tmp_path / "a")
    assert code == 2 and "cll-analyze: error: --index 3: --text gives 1 sentence; --index must be 0" in err, err
    code, err = analyze(capsys, "attention", "--model", tiny_export, "--text", "Ein Hund.", "--text", "Eine Katze.",
                        "--tgt-lang", "fr", "--index", "2", "--out", tmp_path / "a")
    assert code == 2 and "--index 2: --text gives 2 sentences; --index must be 0 to 1" in err, err

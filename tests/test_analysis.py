"""Paper §5's analyses (issue 35): tags follow the model, the tag omitted at test time, layer
attribution with Captum (Fig. 5), attention maps (Fig. 3), and their command ``cll-analyze``."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from cll_scale.analysis import (COMPONENTS, attention_maps, attribute, is_symbol_piece, prepare, tag_share,
                                token_class, token_log_probs)
from cll_scale.analyze import main as analyze_main
from cll_scale.evaluate import TAG_OMITTED, evaluate_entries, pairs_from_shards
from cll_scale.export import export_lang_tag
from cll_scale.translate import Translator
from tests.conftest import ROOT

SENTENCE = "Ein Mann fährt mit dem Fahrrad eine Straße entlang."


@pytest.fixture(scope="module")
def tagless_export(m30k_centered, tmp_path_factory):
    """A `tiny` FCLL model trained without language tags (paper Table 7)."""
    run = tmp_path_factory.mktemp("runs") / "tagless"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "cll_scale.train", "--data", str(m30k_centered), "--preset", "tiny",
                    "--run-dir", str(run), "--max-steps", "6", "--ds-config", "cpu_fp32.json",
                    "--set", "valid.every=1000", "--set", "data.max_tokens=1024",
                    "--set", "data.add_lang_tag=false"], cwd=ROOT, env=env, check=True, capture_output=True)
    return run / "export"


@pytest.mark.slow
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


@pytest.mark.slow
def test_omitting_the_tag_changes_the_input_ids_and_is_an_evaluation_entry(tiny_export, tagless_export,
                                                                           m30k_centered):
    tr = Translator.load(tiny_export)
    with_tag, without = tr.encode(SENTENCE, "de"), tr.encode(SENTENCE, "de", omit_tag=True)
    assert with_tag[0] == tr.manifest.tokenizer.lang_tag_ids["de"] and without == with_tag[1:]
    pairs = pairs_from_shards(m30k_centered, "test_2016_flickr")
    logs = []
    entries = evaluate_entries(tr, "m", pairs, ["en-de"], max_sentences=3, omit_lang_tag=True, log=logs.append)
    assert set(entries) == {"m", "m" + TAG_OMITTED}
    assert entries["m"]["lang_tag"] is True and entries["m" + TAG_OMITTED]["lang_tag"] is False
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
        from cll_scale.analysis import keeping_attention
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


@pytest.mark.slow
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

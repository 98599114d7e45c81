"""cll-export --hf: a model trained here loads in transformers (remote code) and translates as our
Translator does, token for token: greedy and beam 4, with the LSLs on and off, one target language
or several in a batch."""
from __future__ import annotations

import ast

import pytest

from cll_scale.export import main as export_main
from tests.conftest import ROOT, run_cli

transformers = pytest.importorskip(
    "transformers", reason="cll-export --hf writes a directory for transformers; loading it needs transformers "
    "(pip install 'transformers>=5')")

REMOTE_CODE = ROOT / "cll_scale" / "model" / "hf"


@pytest.fixture(scope="module")
def hf_dir(tiny_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "tiny-hf"
    assert export_main(["--model", str(tiny_export), "--hf", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def loaded(hf_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    return model, tokenizer


@pytest.fixture(scope="module")
def sentences(multi30k) -> list[str]:
    """Ten real German sources of test_2016 (the tiny model's outputs are what they are: the test
    compares two implementations, not their quality)."""
    return (multi30k / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:10]


def hf_translate(model, tokenizer, texts, tgt, **generate):
    enc = tokenizer(texts, tgt_lang=tgt, return_tensors="pt", padding=True)
    return tokenizer.batch_decode(model.generate(**enc, **generate), skip_special_tokens=True)


@pytest.mark.parametrize("beam", [1, 4])
def test_transformers_translates_as_the_translator_with_the_lsls_on_and_off(tiny_export, loaded, sentences, beam):
    from cll_scale.evaluation.translator import TranslateConfig, Translator
    from cll_scale.model.decode_config import DecodeConfig
    model, tokenizer = loaded
    ours = Translator.load(tiny_export, cfg=TranslateConfig(DecodeConfig(beam=beam)))
    assert model.config.cll_layers == ours.model.cfg.cll_layers != []          # an FCLL model
    for use_lsl in (True, False):
        for tgt in ("fr", "en"):            # fr has an LSL; en is the central language
            expected = ours.translate(sentences, tgt, use_lsl=use_lsl)
            assert hf_translate(model, tokenizer, sentences, tgt, num_beams=beam, use_lsl=use_lsl) == expected
            assert any(expected), "every output empty: the comparison would say nothing"


def test_one_batch_may_mix_target_languages(tiny_export, loaded, sentences):
    """Each row's LSL is its own target language's, as in the Translator's mixed batches."""
    from cll_scale.evaluation.translator import TranslateConfig, Translator
    from cll_scale.model.decode_config import DecodeConfig
    model, tokenizer = loaded
    tgts = ["fr", "cs", "en", "de", "fr"] * 2
    ours = Translator.load(tiny_export, cfg=TranslateConfig(DecodeConfig(beam=4)))
    rows = [tokenizer(s, tgt_lang=t)["input_ids"] for s, t in zip(sentences, tgts)]
    assert rows == [ours.encode(s, t) for s, t in zip(sentences, tgts)]
    enc = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
    out = tokenizer.batch_decode(model.generate(**enc), skip_special_tokens=True)       # tgt_lang read from the tags
    assert out == ours.translate(sentences, tgts)


def test_the_switches_reach_the_model(loaded, sentences):
    """use_lsl=False changes a non-central language's logits and leaves the central one's as they
    are; a tag that disagrees with tgt_lang is decided by tgt_lang (it picks the LSL)."""
    import torch
    model, tokenizer = loaded
    enc = tokenizer(sentences[:3], tgt_lang="fr", return_tensors="pt", padding=True)
    prev = torch.full((3, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        on, off = (model(**enc, decoder_input_ids=prev, use_lsl=u).logits for u in (True, False))
        assert not torch.equal(on, off)
        cs = model(**enc, decoder_input_ids=prev, tgt_lang="cs").logits
        assert not torch.equal(cs, on)
        en = [model(**enc, decoder_input_ids=prev, tgt_lang="en", use_lsl=u).logits for u in (True, False)]
        assert torch.equal(*en)


def test_the_target_language_must_be_known(loaded, sentences):
    model, tokenizer = loaded
    with pytest.raises(ValueError, match="set the target language"):
        tokenizer(sentences[:1])
    with pytest.raises(ValueError, match="unknown target language"):
        tokenizer(sentences[:1], tgt_lang="xx")
    plain = tokenizer(sentences[:1], tgt_lang="fr", return_tensors="pt")["input_ids"][:, 1:]    # tag cut off
    with pytest.raises(ValueError, match="pass tgt_lang"):
        model.generate(input_ids=plain)


def test_the_remote_code_imports_nothing_of_cll_scale():
    """Whoever loads the directory may not have cll-scale: its three files import torch,
    sentencepiece, transformers, the standard library and each other only."""
    allowed = {"math", "os", "shutil", "torch", "sentencepiece", "transformers"}
    for path in sorted(REMOTE_CODE.glob("*_cll.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [] if node.level else [node.module]
            else:
                continue
            assert all(n.split(".")[0] in allowed for n in names), f"{path.name} imports {names}"


def test_cll_export_refuses_what_is_not_an_export_and_a_foreign_directory(tiny_export, tmp_path, capsys):
    code, _, err = run_cli(export_main, ["--model", str(tmp_path), "--hf", str(tmp_path / "out")], capsys)
    assert code != 0 and "not a cll-scale export" in err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    code, _, err = run_cli(export_main, ["--model", str(tiny_export), "--hf", str(tmp_path / "mine")], capsys)
    assert code != 0 and "notes.txt" in err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    code, _, err = run_cli(export_main, ["--model", str(tiny_export), "--hf", str(tiny_export)], capsys)
    assert code != 0 and (tiny_export / "export.json").is_file()


@pytest.mark.parametrize("variant, pre_norm, residual_sublayer, central", [
    ("sd", True, "ffn", None),                   # every language has an LSL (non-centered data)
    ("residual", False, "self_attn", "en"),      # post-norm, the attention's residual removed
    ("baseline", True, None, "en"),
])
def test_every_variant_computes_the_same_logits(m30k_centered, tmp_path, variant, pre_norm, residual_sublayer, central):
    """The forward pass of each variant, in a batch of mixed target languages, LSLs on and off."""
    import torch
    from transformers import AutoModelForSeq2SeqLM
    from cll_scale.data.manifest import Manifest
    from cll_scale.model.config import PRESETS, ModelConfig
    from cll_scale.model.export import write_export
    from cll_scale.model.hf_export import write_hf_export
    from cll_scale.model.model import CLLTransformer
    manifest = Manifest.load(m30k_centered)
    tok = manifest.tokenizer
    cfg = ModelConfig(**{**PRESETS["tiny"], "pre_norm": pre_norm}, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                      bos_id=tok.bos_id, eos_id=tok.eos_id, languages=list(manifest.languages),
                      central_language=central, variant=variant, residual_sublayer=residual_sublayer)
    torch.manual_seed(0)
    ours = CLLTransformer(cfg).eval()
    with torch.no_grad():
        for p in ours.lsl:
            p.mul_(10.0)           # LSLs that move the logits well past rounding
    write_export(tmp_path / "export", ours.state_dict(), cfg, m30k_centered, {"lang_tag": True}, manifest)
    (tmp_path / "hf").mkdir()
    write_hf_export(tmp_path / "export", tmp_path / "hf")
    theirs = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    src = torch.randint(4, tok.vocab_size, (6, 9))
    src[3, 5:] = tok.pad_id
    prev = torch.randint(4, tok.vocab_size, (6, 7))
    tgt_lang = torch.tensor([0, 1, 2, 3, 1, 2])
    with torch.no_grad():
        for use_lsl in (True, False):
            expected = ours.decode(prev, *ours.encode(src), tgt_lang, use_lsl=use_lsl)
            got = theirs(input_ids=src, attention_mask=(src != tok.pad_id).long(), decoder_input_ids=prev,
                         tgt_lang=tgt_lang, use_lsl=use_lsl).logits
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        if cfg.cll_layers:
            assert not torch.allclose(expected, ours.decode(prev, *ours.encode(src), tgt_lang), atol=1e-3)

"""Translator, cll-translate and cll-eval as a user runs them, plus the metrics they rely on."""
import json
import math
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from cll_scale.core.cli import config_from_args
from cll_scale.evaluate import main as eval_main
from cll_scale.evaluation.langid import detect
from cll_scale.evaluation.report import EvalReport, ModelEntry, markdown
from cll_scale.evaluation.scoring import DESTINATIONS, destinations, score_direction, unpack_languages
from cll_scale.evaluation.testsets import pairs_from_shards
from cll_scale.evaluation.translator import TranslateConfig, Translator
from cll_scale.model.decoding import DecodeConfig
from tests.conftest import ROOT, run_cli


def test_bleu_of_known_pairs():
    """Values worked out by hand: six words with the last one wrong keep 5/6, 4/5, 3/4 and 2/3 of
    their 1- to 4-grams, so BLEU = 100 · (1/3)^(1/4); five correct words of a six-word reference
    have every precision 1 and the brevity penalty exp(1 - 6/5)."""
    ref = ["ein Hund läuft über die Wiese"]
    res, signature, _ = score_direction("en-de", "supervised", ["ein Hund läuft über die Straße"], ref, ["x"],
                                        ["en", "de"], ["en-de"])
    assert res.bleu == pytest.approx(100 * 3 ** -0.25, abs=1e-6) and 50 < res.chrf < 100
    res, *_ = score_direction("en-de", "supervised", ["ein Hund läuft über die"], ref, ["x"], ["en", "de"], ["en-de"])
    assert res.bleu == pytest.approx(100 * math.exp(1 - 6 / 5), abs=1e-6)
    assert "tok:13a" in signature


def test_off_target_counter_labels_known_languages(multi30k):
    langs = ["en", "de", "fr", "cs"]
    for lang in langs:
        lines = (multi30k / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:40]
        restricted = sum(detect(x, langs) == lang for x in lines)
        assert restricted >= 38, (lang, restricted)       # short sentences, still ≥ 95%
    cs = (multi30k / "test_2016_flickr.cs").read_text(encoding="utf-8").splitlines()[:40]
    fr = (multi30k / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()[:40]
    # Czech outputs where de→fr (zero-shot) was asked for, in a model trained on de→cs: all
    # off-target, all "rolled back" into the source's supervised target (paper Table 10).
    both = ("langdetect", "lingua")
    res, *_ = score_direction("de-fr", "zero-shot", cs, fr, fr, langs, ["de-cs", "cs-de"], lid=both)
    assert res.off_target_restricted >= 95 and res.rollback >= 95 and res.off_languages.get("cs", 0) >= 38
    assert res.lingua_off_target >= 95 and res.lingua_code_switch <= 10
    res, *_ = score_direction("de-fr", "zero-shot", fr, fr, fr, langs, [], lid=both)
    assert res.lingua_off_target <= 5 and res.off_target_restricted <= 5
    mixed = [f"{c} {c} {f} {f} {f} {f}" for c, f in zip(cs, fr)]    # starts in Czech, ends in French
    res, *_ = score_direction("de-fr", "zero-shot", mixed, fr, fr, langs, [], lid=both)
    assert res.code_switch > 50 and res.lingua_code_switch > 50     # lingua's spans find both
    with pytest.raises(ValueError, match="language identifiers"):
        score_direction("de-fr", "zero-shot", fr, fr, fr, langs, [], lid=("fasttext",))


def known_lines(multi30k: Path, lang: str, k: int) -> list[str]:
    """``k`` test sentences of ``lang`` that plain langdetect reads as ``lang`` (checked here, so a
    change of detector shows as this failure rather than as a wrong split)."""
    lines = (multi30k / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[100:100 + k]
    assert [detect(x) for x in lines] == [lang] * k
    return lines


def test_zero_shot_destinations_on_sentences_of_known_languages(multi30k):
    """de→cs asked of a model of en/de/fr/cs whose de is trained into en only: four Czech outputs
    (target), three English (a target de is trained into), one German (the source), one French
    (another of the model's languages) and one with no letters (outside): 40/30/10/10/10 %."""
    cs, en, de, fr = (known_lines(multi30k, x, k) for x, k in (("cs", 4), ("en", 3), ("de", 1), ("fr", 1)))
    hyps = [cs[0], cs[1].rsplit(" ", 1)[0], cs[2].rsplit(" ", 1)[0], cs[3], *en, *de, *fr, "1 2 3"]
    refs = (multi30k / "test_2016_flickr.cs").read_text(encoding="utf-8").splitlines()[100:110]
    langs, supervised = ["en", "de", "fr", "cs"], ["de-en", "en-de", "en-cs", "cs-en", "en-fr", "fr-en"]
    res, *_ = score_direction("de-cs", "zero-shot", hyps, refs, refs, langs, supervised)
    split = {k: getattr(res, k) for k in DESTINATIONS}
    assert split == {"to_target": 40.0, "to_trained": 30.0, "to_source": 10.0, "to_other": 10.0, "to_outside": 10.0}
    assert sum(split.values()) == pytest.approx(100.0)
    # the languages kept per sentence give the same split again, without identifying anything
    detected = unpack_languages(res.languages["langdetect"])
    assert detected == ["cs"] * 4 + ["en"] * 3 + ["de", "fr", None] and destinations("de-cs", detected, langs,
                                                                                      supervised) == split
    assert len(unpack_languages(res.languages["langdetect-restricted"])) == 10
    # French is outside a model of en/de/cs, and a trained target of no source leaves nothing "trained"
    three = destinations("de-cs", detected, ["en", "de", "cs"], ["en-de", "en-cs"])
    assert three == {"to_target": 40.0, "to_trained": 0.0, "to_source": 10.0, "to_other": 30.0, "to_outside": 20.0}
    # on-target BLEU/chrF: sacreBLEU over the four Czech outputs and their references alone
    kept = sacrebleu.BLEU().corpus_score(hyps[:4], [refs[:4]]).score
    assert res.on_target_bleu == pytest.approx(kept, abs=1e-9) and 0 < kept < 100 and kept != res.bleu
    assert res.on_target_chrf == pytest.approx(sacrebleu.CHRF().corpus_score(hyps[:4], [refs[:4]]).score, abs=1e-9)
    sup, *_ = score_direction("de-en", "supervised", en, en, en, langs, supervised)
    assert sup.to_target is None and sup.on_target_bleu is None and sup.languages["langdetect"] == "en en en"


def test_an_evaluation_written_before_the_destinations_is_still_read(multi30k):
    """An entry of format 1 (no destinations, no per-sentence languages, no version mark) reads
    with its destinations unmeasured, shown as "–"; today's entry keeps and shows them."""
    cs, fr = known_lines(multi30k, "cs", 3), known_lines(multi30k, "fr", 1)
    res, *_ = score_direction("de-cs", "zero-shot", [*cs, *fr], cs + cs[:1], cs + cs[:1], ["en", "de", "fr", "cs"],
                              ["de-en"])
    entry = ModelEntry([res], {}, {}, None, True, ["langdetect"], {}, {}, [])
    now = EvalReport.from_json(EvalReport("test_2016_flickr", 4, ["langdetect"], {"m": entry}).to_json())
    assert now.models["m"].format_version == 2 and now.models["m"].directions[0].to_other == 25.0
    assert "| 75.0 / 0.0 / 0.0 / 25.0 / 0.0 | 100.00 / 100.00 |" in markdown(now)
    old = entry.to_json()
    del old["format_version"]
    for d in old["directions"]:
        for key in (*DESTINATIONS, "on_target_bleu", "on_target_chrf", "languages"):
            del d[key]
    before = EvalReport.from_json({"test_set": "test_2016_flickr", "beam": 4, "models": {"m": old}})
    assert before.models["m"].format_version == 1 and before.models["m"].directions[0].to_target is None
    row = next(x for x in markdown(before).splitlines() if x.startswith("| m | de-cs |"))
    assert row.endswith("| fr 1 | – | – |"), row


def test_translator_contract(tiny_export):
    tr = Translator.load(tiny_export)
    out = tr.translate(["Ein Hund läuft.", "", "   ", "Zwei Männer."], ["en", "fr", "cs", "cs"])
    assert len(out) == 4 and out[1] == "" and out[2] == "" and all(isinstance(x, str) for x in out)
    assert tr.translate(["Ein Hund läuft."], "en", use_cache=False) == [out[0]]
    with pytest.raises(ValueError, match="unknown language 'xx'.*en, cs, de, fr"):
        tr.translate(["a"], "xx")
    # The device picks batch sizes and precision unless told: bf16 and big batches on a GPU.
    auto = TranslateConfig(DecodeConfig())
    assert (tr.cfg.beam_tokens, tr.cfg.max_sentences, tr.cfg.dtype) == (6000, 64, "fp32")
    assert auto.resolved(torch.device("cuda")).dtype == "bf16" and auto.resolved(torch.device("cuda")).max_sentences > 64
    half = Translator.load(tiny_export, cfg=TranslateConfig(DecodeConfig(), dtype="bf16"))
    assert next(half.model.parameters()).dtype == torch.bfloat16 and (half.param_dtype, tr.param_dtype) == ("bf16", "fp32")
    assert len(half.translate(["Ein Hund läuft."], "en")) == 1
    trainee = half.model.train()
    assert Translator(trainee, half.manifest, tiny_export / "spm.model").model is trainee   # used as it is


def test_cll_translate_cli(tiny_export, cmd, caplog):
    def run(*args, stdin=""):
        return cmd("cll_scale.translate", "--model", tiny_export, *args, stdin=stdin)
    res = run("--tgt-lang", "de", "--src-lang", "en", "--beam", "2", stdin="A dog runs.\n\nTwo men.\n")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""      # empty line in, empty line out
    res = run("--tsv", stdin="de\tA dog runs.\nen\tfr\tUn chien.\n")
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 2
    res = run("--tgt-lang", "xx", stdin="a\n")
    assert res.returncode == 2 and "unknown language 'xx'" in res.stderr and "en, cs, de, fr" in res.stderr
    long = " ".join(["Hund"] * 600)
    caplog.set_level("WARNING")
    res = run("--tgt-lang", "en", "--beam", "1", "--max-len-a", "0", "--max-len-b", "5", stdin=long + "\n")
    # the warning is logged (in process the suite's log capture holds it; that it reaches stderr
    # is tests/test_std_streams.py's)
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "truncated" in r.getMessage()]
    assert res.returncode == 0 and warned and len(res.stdout.splitlines()) == 1


def test_cll_eval_cli(tiny_export, m30k_centered, tmp_path, capsys):
    out = tmp_path / "eval"
    code, table, err = run_cli(eval_main, ["--model", f"fcll={tiny_export}", "--data", str(m30k_centered),
                                           "--split", "test_2016_flickr", "--directions", "en-de,de-fr",
                                           "--max-sentences", "8", "--beam", "2", "--ablate-lsl",
                                           "--lid", "lingua", "--out", str(out)], capsys)
    assert code == 0, err
    report = json.loads((out / "results.json").read_text())
    assert report["lid"] == ["langdetect", "lingua"] and "off-target (lingua)" in table
    # every hypothesis is kept, per model, setting and direction, and rescores to the same figures
    for setting, name in (("default", "fcll"), ("lsl-off", "fcll (LSL off)")):
        for d in report["models"][name]["directions"]:
            hyps = (out / "hyps" / "fcll" / setting / f"{d['direction']}.txt").read_text().split("\n")[:-1]
            pairs = pairs_from_shards(m30k_centered, "test_2016_flickr")[d["direction"]]
            again, *_ = score_direction(d["direction"], d["kind"], hyps, pairs[1][:8], pairs[0][:8], ["en", "cs", "de", "fr"],
                                        [], lid=("langdetect", "lingua"))
            assert len(hyps) == 8 and again.bleu == d["bleu"] and again.lingua_off_target == d["lingua_off_target"]
    timing = report["models"]["fcll"]["timing"]
    assert timing["sentences"] == 16 and timing["decode_s"] > 0 and timing["lid_s"] > 0 and timing["sentences_per_s"] > 0
    assert set(report["models"]) == {"fcll", "fcll (LSL off)"}
    rows = {d["direction"]: d for d in report["models"]["fcll"]["directions"]}
    assert rows["en-de"]["kind"] == "supervised" and rows["de-fr"]["kind"] == "zero-shot"
    assert rows["en-de"]["n"] == 8 and 0 <= rows["de-fr"]["off_target"] <= 100
    # where the zero-shot outputs went, recomputable from the languages the JSON keeps per sentence
    zero, detected = rows["de-fr"], unpack_languages(rows["de-fr"]["languages"]["langdetect"])
    assert len(detected) == 8 and zero["to_target"] == 100 * detected.count("fr") / 8
    assert sum(zero[k] for k in DESTINATIONS) == pytest.approx(100) and rows["en-de"]["to_target"] is None
    assert "zero-shot destination" in table
    assert "zero-shot" in report["models"]["fcll"]["averages"] and "en→xx" in report["models"]["fcll"]["averages"]
    assert report["bleu_signature"].startswith("nrefs:1")
    assert "| fcll |" in table and (out / "bleu_offtarget.png").stat().st_size > 1000
    fcll = report["models"]["fcll"]     # FCLL: a t_l for every decoder layer, numbered from 1
    assert fcll["cll_layers"] == list(range(1, len(fcll["t_weights"]["de"]) + 1)) and fcll["cll_layers"]
    assert (out / "t_weights.png").is_file() and (out / "results.md").read_text() in table


def test_cll_eval_with_two_models_tests_each_against_the_first(tiny_export, m30k_centered, tmp_path, capsys):
    """Two models on the same sentences: paired p-values for BLEU, chrF and off-target per direction
    group, printed and written beside the report. The same export twice gives identical outputs,
    which are no evidence of a difference (p = 1 everywhere)."""
    out = tmp_path / "eval"
    code, printed, err = run_cli(eval_main, ["--model", f"a={tiny_export}", "--model", f"b={tiny_export}",
                                             "--data", str(m30k_centered), "--split", "test_2016_flickr",
                                             "--directions", "en-de,de-fr", "--max-sentences", "4", "--beam", "1",
                                             "--lid-workers", "0", "--out", str(out)], capsys)
    assert code == 0, err
    paired = json.loads((out / "significance.json").read_text())
    rows = {c["group"]: c for c in paired["comparisons"]}
    assert set(rows) == {"supervised", "zero-shot"}
    assert rows["zero-shot"]["directions"] == ["de-fr"] and rows["supervised"]["sentences"] == 4
    assert all(c["model"] == "b" and c["against"] == "a" and c["discordant"] == [0, 0]
               and c["bleu_p"] == c["chrf_p"] == c["off_target_p"] == 1.0 for c in rows.values())
    assert "| b | a | zero-shot | 4 |" in printed and "bs:1000" in printed
    assert (out / "significance.md").read_text() in printed


def test_zero_shot_anatomy_labels_start_and_end(multi30k):
    """scripts/zero_shot_anatomy.py: outputs that start on target and switch are told apart from
    clean ones, and only the clean ones are scored."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from zero_shot_anatomy import anatomy
    de = (multi30k / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:20]
    cs = (multi30k / "test_2016_flickr.cs").read_text(encoding="utf-8").splitlines()[:20]
    hyps = de[:10] + [f"{d} {d} {c} {c}" for d, c in zip(de[10:15], cs[10:15])] + cs[15:]
    row = anatomy(hyps, de, "de", ["de", "fr", "cs"])
    assert row["n"] == 20 and row["target → target"] >= 9 and row["target → other"] >= 4
    assert row["other → other"] >= 4 and sum(row[k] for k in row if "→" in k) == 20
    assert row["bleu_on_target"] > 95      # the clean German outputs are the references themselves


def test_command_flags_come_from_the_config_dataclasses():
    """cll-translate, cll-bt and cll-extend declare no default or help text of their own: each
    flag is a config field's, so a default changed in the config is the flag's default too."""
    import argparse
    import dataclasses

    from cll_scale.loops.backtranslate import BTConfig
    from cll_scale.backtranslate import build_parser as bt_parser
    from cll_scale.loops.extend import ExtendConfig
    from cll_scale.extend import build_parser as extend_parser
    from cll_scale.translate import build_parser as translate_parser
    for cls, parser in ((DecodeConfig, translate_parser()), (BTConfig, bt_parser()), (ExtendConfig, extend_parser())):
        actions = {a.dest: a for a in parser._actions if a.help != argparse.SUPPRESS}     # old spellings aside
        flagged = [f for f in dataclasses.fields(cls) if "help" in f.metadata]
        assert len(flagged) >= 5, cls
        for f in flagged:
            action = actions[f.name]
            assert f.metadata["help"] in action.help, (cls.__name__, f.name)
            if f.default is not dataclasses.MISSING:
                assert action.default == f.default and f"(default: {f.default})" in action.help or f.default == ""
            elif f.default_factory is not dataclasses.MISSING:
                assert action.default == f.default_factory()
            else:
                assert action.required
    args = bt_parser().parse_args(["--model", "m", "--data", "d", "--out", "o", "--bt-langs", "de, fr",
                                   "--epochs", "2"])
    cfg = config_from_args(BTConfig, args)
    assert cfg.bt_langs == ["de", "fr"] and cfg.epochs == 2 and cfg.beam == BTConfig.__dataclass_fields__["beam"].default
    with pytest.raises(SystemExit):
        extend_parser().parse_args(["--model", "m"])          # the required fields are required flags


def test_lid_agreement_reads_hypotheses_files(multi30k, tmp_path):
    """scripts/lid_agreement.py on hypotheses files in cll-eval's layout: real French where French
    was asked for, real Czech where German was: both identifiers call half of it off-target and
    agree on nearly every line."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from lid_agreement import agreement, report
    fr = (multi30k / "test_2016_flickr.fr").read_text(encoding="utf-8").splitlines()[:30]
    cs = (multi30k / "test_2016_flickr.cs").read_text(encoding="utf-8").splitlines()[:30]
    hyps = tmp_path / "hyps" / "fcll" / "default"
    hyps.mkdir(parents=True)
    (hyps / "de-fr.txt").write_text("".join(x + "\n" for x in fr), encoding="utf-8")
    (hyps / "fr-de.txt").write_text("".join(x + "\n" for x in cs), encoding="utf-8")
    r = agreement(sorted(hyps.glob("*.txt")), ["en", "de", "fr", "cs"])
    assert r["sentences"] == 60 and r["agree_restricted"] >= 90
    assert 45 <= r["off_lingua"] <= 55 and 45 <= r["off_langdetect_restricted"] <= 55
    assert "| fcll (default) | 60 |" in report(tmp_path / "hyps", ["en", "de", "fr", "cs"], 2)
    # Captions half German, half French: the identifiers part ways, and lingua sees two languages
    # in most of the lines they part on.
    de = (multi30k / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[:40]
    mixed = [" ".join(d.split()[:len(d.split()) // 2] + f.split()[len(f.split()) // 2:]) for d, f in zip(de, fr + fr)]
    (hyps / "cs-fr.txt").write_text("".join(x + "\n" for x in mixed), encoding="utf-8")
    r = agreement([hyps / "cs-fr.txt"], ["en", "de", "fr", "cs"])
    assert r["agree_restricted"] <= 80 and r["disagree_mixed"] >= 60


def test_bleu_offtarget_figure_stays_readable_at_opus100_size(tmp_path):
    """218 directions (OPUS-100's test set): the figure stops widening at 40 inches; 6 keep 0.9 each."""
    import struct
    from cll_scale.evaluation.plots import plot_bleu_offtarget
    from cll_scale.evaluation.report import EvalReport, ModelEntry
    from cll_scale.evaluation.scoring import DirectionResult

    def width(n: int) -> int:
        dirs = [DirectionResult(f"en-x{i:03d}", "zero-shot" if i % 7 == 0 else "supervised", 10, float(i % 30), 0.0,
                                0.0, float(i % 100), 0.0, 0.0) for i in range(n)]
        fcll = ModelEntry(dirs, {}, {}, None, True, ["langdetect"], {}, {}, [])
        png = plot_bleu_offtarget(EvalReport("opus-100", 5, ["langdetect"], {"fcll": fcll}), tmp_path / f"{n}.png")
        return struct.unpack(">I", png.read_bytes()[16:20])[0]       # the PNG header's width
    assert width(6) == 600 and width(218) == 4000


def test_cll_eval_replaces_its_directory_as_a_whole(tiny_export, m30k_centered, tmp_path, capsys):
    """Issue 51 row 16: an evaluation of other models into the same --out leaves no hypotheses of
    the earlier models (rescoring hyps/ would mix them in); a file cll-eval did not write is never
    deleted with it: refused."""
    out = tmp_path / "ev" / "1"
    base = ["--data", str(m30k_centered), "--split", "test_2016_flickr", "--directions", "en-de", "--max-sentences",
            "1", "--beam", "1", "--lid-workers", "0", "--out", str(out)]
    code, _, err = run_cli(eval_main, ["--model", f"tags={tiny_export}", "--model", f"notag={tiny_export}", *base],
                           capsys)
    assert code == 0 and sorted(p.name for p in (out / "hyps").iterdir()) == ["notag", "tags"], err
    code, _, err = run_cli(eval_main, ["--model", f"c={tiny_export}", *base], capsys)
    assert code == 0, err
    assert [p.name for p in (out / "hyps").iterdir()] == ["c"]
    assert set(json.loads((out / "results.json").read_text())["models"]) == {"c"}
    assert sorted(p.name for p in out.iterdir()) == ["bleu_offtarget.png", "hyps", "results.json", "results.md",
                                                     "t_weights.png"]
    assert [p.name for p in out.parent.iterdir()] == ["1"]                # no temporary left beside it
    (out / "notes.txt").write_text("mine")
    code, _, err = run_cli(eval_main, ["--model", f"c={tiny_export}", *base], capsys)
    assert code == 2 and "holds what cll-eval did not write: notes.txt" in err, err
    assert (out / "notes.txt").read_text() == "mine" and (out / "hyps" / "c").is_dir()


def test_input_mistakes_are_named_where_they_are(tiny_export, multi30k, tmp_path, capsys):
    """Issue 66: a --tsv line with a tab inside its text said "unknown language 'Ein Hund'" without
    its line; cll-eval --corpus on a folder with only test files asked for train.<lang> files; a
    damaged export.json did not name the file."""
    import shutil
    from cll_scale.translate import main as translate_main
    tsv = tmp_path / "in.tsv"
    tsv.write_text("fr\tEin Hund.\nde\tEin Hund\trennt.\n", encoding="utf-8")
    code, _, err = run_cli(translate_main, ["--model", str(tiny_export), "--tsv", "--input", str(tsv)], capsys)
    assert code == 2 and "cll-translate: error: line 2: 'Ein Hund' is not a language of this model" in err
    assert "a tab inside the text makes another column" in err

    tests = tmp_path / "tests"
    tests.mkdir()
    for lang in ("de", "en"):
        lines = (multi30k / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:3]
        (tests / f"test_2016_flickr.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, _, err = run_cli(eval_main, ["--model", f"m={tiny_export}", "--corpus", str(tests), "--split",
                                       "test_2016_flickr", "--beam", "1", "--out", str(tmp_path / "r"),
                                       "--lid-workers", "0"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "r" / "results.json").read_text())
    assert sorted(d["direction"] for d in report["models"]["m"]["directions"]) == ["de-en", "en-de"]

    damaged = tmp_path / "export"
    shutil.copytree(tiny_export, damaged)
    (damaged / "export.json").write_text('{"step": 15, "sha256": {"model.safet')
    code, _, err = run_cli(translate_main, ["--model", str(damaged), "--tgt-lang", "fr", "--input", str(tsv)], capsys)
    assert code == 2 and f"cll-translate: error: {damaged / 'export.json'}: line 1, column" in err


def test_an_output_that_cannot_be_written_is_refused_before_translating(tiny_export, tmp_path, capsys, monkeypatch):
    """Issue 66, C: `cll-translate --output` into a read-only folder translated everything, then
    failed naming a temporary file. The folder is tried first (a 0555 folder stops all but root;
    /sys stops root too), and the refusal names --output as given."""
    import os
    from cll_scale.core.errors import EXIT_FILES
    from cll_scale.evaluation.translator import Translator
    from cll_scale.translate import main
    from tests.conftest import run_cli
    monkeypatch.setattr(Translator, "load", lambda *a, **k: pytest.fail("a model was loaded before the refusal"))
    src = tmp_path / "in.en"
    src.write_text("A dog runs.\n")
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o555)
    refused = {Path("/sys/cll-out.de"): "/sys: Permission denied"}
    if not os.access(readonly, os.W_OK):
        refused[readonly / "out.de"] = f"{readonly}: Permission denied"
    for out, why in refused.items():
        code, _, err = run_cli(main, ["--model", str(tiny_export), "--tgt-lang", "de", "--input", str(src),
                                      "--output", str(out)], capsys)
        assert code == EXIT_FILES, err
        assert err == f"cll-translate: error: --output {out} cannot be written: {why}; nothing was translated\n"
    assert not any(readonly.iterdir())


def test_fill_destinations_gives_an_old_entry_what_scoring_gives_a_new_one(multi30k, tmp_path):
    """scripts/fill_destinations.py: an entry of format 1 filled from its stored hypotheses has the
    destinations, on-target scores and zero-shot averages that scoring the same outputs gives; a
    hypotheses file that is not the one scored is refused."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from fill_destinations import fill_entry
    from cll_scale.evaluation.scoring import averages
    cs, en, fr = known_lines(multi30k, "cs", 4), known_lines(multi30k, "en", 3), known_lines(multi30k, "fr", 1)
    hyps = [cs[0], cs[1].rsplit(" ", 1)[0], *cs[2:], *en, *fr]
    refs = (multi30k / "test_2016_flickr.cs").read_text(encoding="utf-8").splitlines()[100:108]
    # the model's languages and supervised directions are read from the entry's scored directions
    langs, supervised = ["en", "de", "fr", "cs"], ["de-en", "en-cs", "en-fr"]
    zero, *_ = score_direction("de-cs", "zero-shot", hyps, refs, refs, langs, supervised)
    rows = [zero] + [score_direction(d, "supervised", x, x, x, langs, supervised)[0]
                     for d, x in (("en-cs", cs), ("de-en", en), ("en-fr", fr))]
    new = ModelEntry(rows, averages(rows, None), {}, None, True, ["langdetect"], {}, {}, [])
    old = new.to_json()
    del old["format_version"]
    for d in old["directions"]:
        for key in (*DESTINATIONS, "on_target_bleu", "on_target_chrf", "languages"):
            del d[key]
    old["averages"] = {g: {k: v for k, v in m.items() if k not in (*DESTINATIONS, "on_target_bleu", "on_target_chrf")}
                       for g, m in old["averages"].items()}
    (tmp_path / "de-cs.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    pairs = {"de-cs": (refs, refs)}
    filled = fill_entry(ModelEntry.from_json(old), tmp_path, pairs, log=lambda _: None)
    row = filled.directions[0]
    assert filled.format_version == 2 and [getattr(row, k) for k in DESTINATIONS] == [getattr(zero, k) for k in DESTINATIONS]
    assert row.on_target_bleu == zero.on_target_bleu and row.languages == {"langdetect": zero.languages["langdetect"]}
    assert filled.averages == new.averages and filled.directions[1].to_target is None
    (tmp_path / "de-cs.txt").write_text("".join(h + "\n" for h in reversed(hyps)), encoding="utf-8")
    with pytest.raises(ValueError, match="not the hypotheses it scored"):
        fill_entry(ModelEntry.from_json(old), tmp_path, pairs, log=lambda _: None)

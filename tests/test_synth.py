"""`cll-shards synth`: a synthetic corpus in the OPUS-100 layout, at OPUS-100's shape."""
import json
import unicodedata
from itertools import combinations

import pytest

from cll_scale.data.corpora import detect_format, read_opus100
from cll_scale.data.manifest import Manifest
from data_tools import synth as synth_mod
from data_tools.cli import main
from data_tools.synth import (EVAL_PAIRS, EVAL_SHORT, LANG_SCRIPT, NO_EVAL, OPUS100_TRAIN, ZERO_SHOT_LANGS, plan,
                              synthesize)
from tests.conftest import OPUS_SAMPLE, run_cli

TINY = 0.0002
BASE = "opus-100-corpus/v1.0"


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _tree(path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def full_tiny(tmp_path_factory):
    """All 99 languages at 1/5000 of OPUS-100, evaluation sets scaled too."""
    out = tmp_path_factory.mktemp("synth") / "opus-synth"
    synthesize(out, TINY, seed=1, scale_eval=True)
    return out


def test_the_table_is_opus100s():
    """The numbers the paper gives for the release: 99 languages with English, ~55M pairs,
    44 at 1M, 73 with >= 100K, 95 with >= 10K; 94 pairs with test sets; 30 zero-shot directions."""
    sizes = OPUS100_TRAIN.values()
    assert len(OPUS100_TRAIN) == 99 and "en" not in OPUS100_TRAIN
    assert 54_500_000 < sum(sizes) < 55_500_000
    assert sum(n == 1_000_000 for n in sizes) == 44 and max(sizes) == 1_000_000
    assert sum(n >= 100_000 for n in sizes) == 73 and sum(n >= 10_000 for n in sizes) == 95
    assert len(OPUS100_TRAIN) - len(NO_EVAL) == 94 and NO_EVAL <= set(OPUS100_TRAIN)
    assert set(LANG_SCRIPT) == set(OPUS100_TRAIN) | {"en"}
    plans = plan(1.0)
    assert sum(p.rows.get("train", 0) for p in plans) == sum(sizes)
    zero = [p for p in plans if p.kind == "zero-shot"]
    assert len(zero) == 15 and {p.pair for p in zero} == {f"{a}-{b}" for a, b in combinations(ZERO_SHOT_LANGS, 2)}


def test_eval_sets_keep_their_real_size_unless_scale_eval():
    by_pair = {p.pair: p.rows for p in plan(0.001)}
    assert by_pair["de-en"] == {"train": 1000, "dev": EVAL_PAIRS, "test": EVAL_PAIRS}
    assert by_pair["en-gd"] == {"train": 16, "dev": EVAL_SHORT["gd"][0], "test": EVAL_SHORT["gd"][1]}
    assert by_pair["dz-en"] == {"train": 1}              # 624 pairs, no dev/test in the release
    assert by_pair["ar-de"] == {"test": EVAL_PAIRS}
    scaled = {p.pair: p.rows for p in plan(0.001, scale_eval=True)}
    assert scaled["de-en"] == {"train": 1000, "dev": 2, "test": 2} and scaled["ar-de"] == {"test": 2}


def test_layout_is_the_opus100_tarballs(full_tiny):
    assert detect_format(str(full_tiny)) == "opus100"
    if OPUS_SAMPLE.is_dir():        # every file of the real sample has its synthetic counterpart
        for rel in _tree(OPUS_SAMPLE):
            assert (full_tiny / rel).is_file(), rel
    sup = sorted(p.name for p in (full_tiny / BASE / "supervised").iterdir())
    assert len(sup) == 99 and all(d == "-".join(sorted(d.split("-"))) and "en" in d.split("-") for d in sup)
    assert {"de-en", "en-fr", "af-en", "en-zh"} <= set(sup)
    for x in NO_EVAL:
        pair = "-".join(sorted((x, "en")))
        assert sorted(p.name for p in (full_tiny / BASE / "supervised" / pair).iterdir()) == \
            sorted(f"opus.{pair}-train.{y}" for y in pair.split("-"))
    corpus = read_opus100(full_tiny)
    assert corpus.central == "en" and len(corpus.languages) == 100
    assert len(corpus.supervised) == 2 * 99
    assert sorted(map(str, corpus.zero_shot)) == sorted(f"{a}-{b}" for a in ZERO_SHOT_LANGS
                                                        for b in ZERO_SHOT_LANGS if a != b)
    assert len({s.label for s in corpus.splits if s.name == "test"}) == 94 + 15


def test_counts_follow_the_table(full_tiny):
    marker = json.loads((full_tiny / "synth.json").read_text())
    assert marker["tool"] == "cll-shards synth" and marker["args"]["scale"] == TINY
    for x, n in OPUS100_TRAIN.items():
        pair = "-".join(sorted((x, "en")))
        want = max(1, round(n * TINY))
        assert marker["pairs"][pair]["train"] == want
        files = [full_tiny / BASE / "supervised" / pair / f"opus.{pair}-train.{y}" for y in pair.split("-")]
        assert [len(_lines(f)) for f in files] == [want, want], pair
    # Proportional: the 1M languages against af's 275,512 and ur's 753,913.
    assert len(_lines(full_tiny / BASE / "supervised/de-en/opus.de-en-train.de")) == 200
    assert len(_lines(full_tiny / BASE / "supervised/af-en/opus.af-en-train.af")) == 55
    assert len(_lines(full_tiny / BASE / "supervised/en-ur/opus.en-ur-train.ur")) == 151
    assert marker["totals"]["train"] == sum(max(1, round(n * TINY)) for n in OPUS100_TRAIN.values())
    assert len(_lines(full_tiny / BASE / "zero-shot/ru-zh/opus.ru-zh-test.zh")) == 1


# A letter's Unicode name starts with its script's name.
SCRIPT_NAMES = {"latin": ("LATIN",), "cyrillic": ("CYRILLIC",), "greek": ("GREEK",), "armenian": ("ARMENIAN",),
                "georgian": ("GEORGIAN",), "hebrew": ("HEBREW",), "arabic": ("ARABIC",),
                "devanagari": ("DEVANAGARI",), "bengali": ("BENGALI",), "gurmukhi": ("GURMUKHI",),
                "gujarati": ("GUJARATI",), "oriya": ("ORIYA",), "tamil": ("TAMIL",), "telugu": ("TELUGU",),
                "kannada": ("KANNADA",), "malayalam": ("MALAYALAM",), "sinhala": ("SINHALA",), "thai": ("THAI",),
                "khmer": ("KHMER",), "myanmar": ("MYANMAR",), "tibetan": ("TIBETAN",), "ethiopic": ("ETHIOPIC",),
                "hangul": ("HANGUL",), "han": ("CJK UNIFIED",), "japanese": ("HIRAGANA", "KATAKANA", "CJK UNIFIED")}


def test_each_language_writes_in_its_own_script(full_tiny):
    assert set(SCRIPT_NAMES) == set(LANG_SCRIPT.values())
    letters_of = {}
    for pair_dir in (full_tiny / BASE / "supervised").iterdir():
        for f in pair_dir.glob("*-train.*"):
            lang = f.suffix[1:]
            text = f.read_text(encoding="utf-8")
            letters = {ch for ch in text if unicodedata.category(ch).startswith("L")}
            names = SCRIPT_NAMES[LANG_SCRIPT[lang]]
            strays = sorted(ch for ch in letters if not unicodedata.name(ch).startswith(names))
            assert letters and not strays, (lang, strays[:5])
            if lang == "en":
                assert text.isascii()
            else:
                letters_of[lang] = letters
            if LANG_SCRIPT[lang] in ("han", "japanese", "thai"):
                assert " " not in text
    # Languages sharing a script still differ: de and fr use different words and letters.
    de = _lines(full_tiny / BASE / "supervised/de-en/opus.de-en-train.de")
    fr = _lines(full_tiny / BASE / "supervised/en-fr/opus.en-fr-train.fr")
    assert letters_of["de"] != letters_of["fr"]
    de_words, fr_words = ({w.lower() for ln in lines for w in ln.rstrip(".").split()} for lines in (de, fr))
    assert len(de_words & fr_words) / len(de_words | fr_words) < 0.1


def test_text_looks_like_sentences_and_the_target_follows_the_source(tmp_path):
    synthesize(tmp_path / "s", 0.005, langs=["de"], scale_eval=True)
    pair = tmp_path / "s" / BASE / "supervised/de-en"
    de, en = _lines(pair / "opus.de-en-train.de"), _lines(pair / "opus.de-en-train.en")
    assert len(de) == len(en) == 5000
    words = [ln.rstrip(".").split() for ln in de]
    counts = sorted(len(w) for w in words)
    assert 9 <= counts[len(counts) // 2] <= 13 and counts[0] >= 1 and counts[-1] <= 80
    assert all(2 <= len(w) <= 9 for ws in words for w in ws[1:])     # the first may gain a letter: ß -> SS
    assert all(ln[0].isupper() and ln.endswith(".") for ln in de + en)
    # Line i of both sides spells one sequence of word ranks: a word-for-word substitution.
    mapping = {}
    for d, e in zip(words, (ln.rstrip(".").split() for ln in en)):
        assert len(d) == len(e)
        for dw, ew in zip(d[1:], e[1:]):        # the first word is capitalised: leave it out
            assert mapping.setdefault(dw, ew) == ew
    assert len(mapping) > 500


def test_same_arguments_same_bytes_another_seed_other_text(tmp_path):
    args = dict(scale=0.0005, langs=["de", "zh", "ar"], scale_eval=True)
    synthesize(tmp_path / "a", seed=3, **args)
    synthesize(tmp_path / "b", seed=3, **args)
    synthesize(tmp_path / "c", seed=4, **args)
    a, b, c = _tree(tmp_path / "a"), _tree(tmp_path / "b"), _tree(tmp_path / "c")
    assert a == b and len(a) == 3 * 6 + 3 * 2 + 1
    assert a.keys() == c.keys()
    for rel in a:
        if rel != "synth.json":
            assert a[rel] != c[rel] and a[rel].count(b"\n") == c[rel].count(b"\n"), rel
    # A pair's text does not depend on which other languages were asked for.
    synthesize(tmp_path / "d", seed=3, scale=0.0005, langs=["de"], scale_eval=True)
    rel = f"{BASE}/supervised/de-en/opus.de-en-train.de"
    assert (tmp_path / "d" / rel).read_bytes() == a[rel]


def test_bad_arguments_are_named(tmp_path, capsys):
    for bad in ("0", "-1"):
        code, _, err = run_cli(main, ["synth", "--scale", bad, "--out", str(tmp_path / "o")], capsys)
        assert code == 2 and "--scale must be a number > 0" in err
    with pytest.raises(SystemExit) as exit_:
        main(["synth", "--scale", "nan", "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2 and "--scale: nan: expected a finite number" in capsys.readouterr().err
    code, _, err = run_cli(main, ["synth", "--scale", "1", "--langs", "de,xx", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--langs: 'xx' not among OPUS-100's languages" in err
    code, _, err = run_cli(main, ["synth", "--scale", "1", "--langs", "de,de", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--langs lists de twice" in err
    with pytest.raises(ValueError, match="--scale"):
        synthesize(tmp_path / "o", 0.0)
    assert not (tmp_path / "o").exists()


def test_overwrite_replaces_only_a_corpus_synth_wrote(tmp_path, capsys):
    out = tmp_path / "corpus"
    argv = ["synth", "--scale", "0.0005", "--langs", "de", "--scale-eval", "--out", str(out)]
    out.mkdir()                                        # an empty directory is fine to fill
    code, stdout, err = run_cli(main, argv, capsys)
    assert code == 0, err
    assert "2 languages, 500 training pairs" in stdout and "pairs/s" in stdout
    first = _tree(out)
    code, _, err = run_cli(main, argv, capsys)
    assert code == 2 and "exists; pass --overwrite" in err
    code, _, err = run_cli(main, argv + ["--overwrite", "--seed", "2"], capsys)
    assert code == 0, err
    assert _tree(out).keys() == first.keys() and _tree(out) != first
    # Something synth did not write inside its corpus: refused, named, kept.
    (out / "notes.txt").write_text("mine")
    code, _, err = run_cli(main, argv + ["--overwrite"], capsys)
    assert code == 2 and "notes.txt" in err and (out / "notes.txt").read_text() == "mine"
    # A directory synth did not write at all: refused, untouched.
    victim = tmp_path / "home"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work")
    code, _, err = run_cli(main, argv[:-1] + [str(victim), "--overwrite"], capsys)
    assert code == 2 and "not a synthetic OPUS-100 corpus" in err and "thesis.tex" in err
    assert (victim / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "home"]     # no temporaries left


def test_an_interrupted_run_leaves_no_corpus(tmp_path, monkeypatch):
    real, calls = synth_mod._render, []

    def dies_midway(*args):
        calls.append(1)
        if len(calls) > 5:
            raise KeyboardInterrupt
        return real(*args)
    monkeypatch.setattr(synth_mod, "_render", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        synthesize(tmp_path / "o", 0.001, langs=["de", "fr", "ru"])
    assert list(tmp_path.iterdir()) == []


def test_cll_shards_build_reads_a_synth_corpus(tmp_path, capsys):
    corpus, shards = tmp_path / "corpus", tmp_path / "shards"
    code, _, err = run_cli(main, ["synth", "--scale", "0.0005", "--scale-eval", "--langs", "ar,de,fr,ru,hi",
                                  "--out", str(corpus)], capsys)
    assert code == 0, err
    # Byte fallback needs 256 pieces, the language tags and every character: 800 fits these four
    # scripts (Han or Japanese alone would need more than 1,000).
    code, table, err = run_cli(main, ["build", "--format", "opus100", "--corpus", str(corpus), "--out", str(shards),
                                      "--vocab-size", "800"], capsys)
    assert code == 0, err
    m = Manifest.load(shards)
    assert m.central_language == "en" and sorted(m.languages) == ["ar", "de", "en", "fr", "hi", "ru"]
    assert sorted(m.supervised) == sorted(f"{d}" for x in ("ar", "de", "fr", "hi", "ru") for d in (f"{x}-en", f"en-{x}"))
    assert sorted(m.zero_shot) == sorted(f"{a}-{b}" for a in ("ar", "de", "fr", "ru")
                                         for b in ("ar", "de", "fr", "ru") if a != b)
    assert m.splits["train"].rows("de-en") == 500 and m.splits["train"].rows("en-hi") == 267
    assert m.splits["test"].rows("fr-ru") == 1 and m.splits["valid"].rows("en-de") == 1
    assert sum(f.get("empty", 0) + f.get("too_long", 0) for f in m.splits["train"].filtered.values()) == 0
    assert run_cli(main, ["verify", str(shards)], capsys)[0] == 0


def test_synth_estimates_its_size_and_refuses_more_than_the_disk_holds(tmp_path, capsys):
    """Misuse round 2, finding 22: the size is said before writing, a corpus larger than the free
    space is refused before a byte is written, and a file as --out is refused without suggesting
    --overwrite (which would not help)."""
    code, out, err = run_cli(main, ["synth", "--scale", "1e9", "--out", str(tmp_path / "big")], capsys)
    assert code == 2 and "--scale: the corpus needs about" in err and "GB free" in err
    assert not (tmp_path / "big").exists() and list(tmp_path.iterdir()) == []
    code, out, err = run_cli(main, ["synth", "--scale", "0.0005", "--langs", "de", "--out", str(tmp_path / "c")],
                             capsys)
    written = sum(f.stat().st_size for f in (tmp_path / "c").rglob("*") if f.is_file())
    said = int(err.split("about ")[1].split(" MB")[0].replace(",", ""))
    assert code == 0 and "pairs, about" in err and written <= max(said, 1) * 1e6      # the estimate errs high
    afile = tmp_path / "afile"
    afile.write_text("x")
    for extra in ([], ["--overwrite"]):
        code, _, err = run_cli(main, ["synth", "--scale", "0.0005", "--out", str(afile), *extra], capsys)
        assert code == 2 and "is a file" in err and "pass --overwrite" not in err
    assert afile.read_text() == "x"

"""Corpus readers: formats, data conditions, and clear errors for bad input."""
import gzip

import pytest

from cll_scale.data.corpora import CorpusError, read_multiway, read_opus100, scan_text_file
from cll_scale.data.languages import Direction, LanguageError, check_languages, strict_dependence, targets_by_source


def dirs(text):
    return [Direction.parse(d) for d in text.split()]


def test_centered_condition_on_multi30k(multi30k):
    corpus = read_multiway(multi30k, "centered")
    assert corpus.languages[0] == "en" and corpus.central == "en"
    assert sorted(corpus.supervised) == sorted(dirs("en-de en-fr en-cs de-en fr-en cs-en"))
    assert sorted(corpus.zero_shot) == sorted(dirs("de-fr fr-de de-cs cs-de fr-cs cs-fr"))
    train = corpus.train_splits()[0]
    assert train.n_lines == 29000 and sorted(train.directions) == sorted(corpus.supervised)
    valid = next(s for s in corpus.splits if s.name == "valid")       # "val" is renamed
    assert valid.n_lines == 1014 and len(valid.directions) == 12      # zero-shot has references


def test_triangle_is_a_cycle_in_the_given_order(multi30k):
    corpus = read_multiway(multi30k, "triangle", langs=["de", "fr", "cs"])
    assert corpus.supervised == dirs("de-fr fr-cs cs-de")
    assert sorted(corpus.zero_shot) == sorted(dirs("fr-de cs-fr de-cs"))
    assert corpus.central is None and corpus.languages == ["de", "fr", "cs"]


# The paper's Table 11, third column: the number of zero-shot directions (Triangle 3, Square 4);
# with n languages there are n(n-1) directions, the rest supervised. Centered on 4 languages: 6 / 6.
# Strict dependence (paper §4.1): every source language is trained into one target only; the
# fan-out is how many targets each source language has.
@pytest.mark.parametrize("condition,langs,supervised,zero_shot,fan_out,strict", [
    ("centered", ["en", "de", "fr", "cs"], 6, 6, {"en": 3, "de": 1, "fr": 1, "cs": 1}, False),
    ("triangle", ["de", "fr", "cs"], 3, 3, {"de": 1, "fr": 1, "cs": 1}, True),
    ("square", ["de", "fr", "cs", "en"], 8, 4, {"de": 2, "fr": 2, "cs": 2, "en": 2}, False),
    ("cycle", ["de", "fr", "cs", "en"], 4, 8, {"de": 1, "fr": 1, "cs": 1, "en": 1}, True),
    # the paper's Table 6 row (2): centered plus one-way pairs among the other languages
    ("centered-cycle", ["en", "de", "fr", "cs"], 9, 3, {"en": 3, "de": 2, "fr": 2, "cs": 2}, False),
])
def test_named_conditions_have_the_papers_counts_and_dependence(multi30k, condition, langs, supervised,
                                                                zero_shot, fan_out, strict):
    corpus = read_multiway(multi30k, condition, langs=langs)
    assert (len(corpus.supervised), len(corpus.zero_shot)) == (supervised, zero_shot)
    assert {src: len(t) for src, t in targets_by_source(corpus.supervised).items()} == fan_out
    assert strict_dependence(corpus.supervised) is strict


def test_square_is_every_edge_both_ways_with_the_diagonals_zero_shot(multi30k):
    square = read_multiway(multi30k, "square", langs=["de", "fr", "cs", "en"])
    assert sorted(square.supervised) == sorted(dirs("de-fr fr-de fr-cs cs-fr cs-en en-cs en-de de-en"))
    assert sorted(square.zero_shot) == sorted(dirs("de-cs cs-de fr-en en-fr"))
    assert targets_by_source(square.supervised) == {"de": ["fr", "en"], "fr": ["de", "cs"],
                                                    "cs": ["fr", "en"], "en": ["cs", "de"]}


def test_cycle_is_one_way_over_any_number_of_languages_and_explicit_lists_stay(multi30k):
    cycle = read_multiway(multi30k, "cycle", langs=["de", "fr", "cs", "en"])
    assert cycle.supervised == dirs("de-fr fr-cs cs-en en-de")
    assert read_multiway(multi30k, "cycle", langs=["de", "fr", "cs"]).supervised == dirs("de-fr fr-cs cs-de")
    explicit = read_multiway(multi30k, "de-fr,fr-de")
    assert explicit.languages == ["de", "fr"] and explicit.zero_shot == []


def test_centered_cycle_adds_the_one_way_cycle_to_the_centered_data(multi30k):
    """Table 6 row (2): the English-centered data with de→fr, fr→cs, cs→de added, one way; the
    reverse directions stay zero-shot. Read without --langs, the cycle takes the paper's order."""
    plus = read_multiway(multi30k, "centered-cycle", langs=["en", "de", "fr", "cs"])
    centered = read_multiway(multi30k, "centered", langs=["en", "de", "fr", "cs"])
    assert plus.supervised == centered.supervised + dirs("de-fr fr-cs cs-de")
    assert sorted(plus.zero_shot) == sorted(dirs("fr-de cs-fr de-cs")) and plus.central == "en"
    unordered = read_multiway(multi30k, "centered-cycle")
    assert unordered.supervised == plus.supervised and unordered.languages == ["en", "de", "fr", "cs"]


@pytest.mark.parametrize("condition,langs,message", [
    ("triangle", None, "needs exactly 3 languages"),
    ("square", ["de", "fr", "cs"], "needs exactly 4 languages"),
    ("cycle", ["de", "fr"], "needs at least 3 languages"),
    ("centered", ["de", "fr"], "needs --central"),
    ("de-xx", None, "not in the corpus"),
    ("de-de", None, "into itself"),
    ("pentagon", None, "must be one of"),
])
def test_bad_conditions_are_explained(multi30k, condition, langs, message):
    with pytest.raises(CorpusError, match=message):
        read_multiway(multi30k, condition, langs=langs)


def test_line_count_mismatch_names_files_and_counts(tmp_path):
    (tmp_path / "train.en").write_text("a\nb\nc\n")
    (tmp_path / "train.de").write_text("a\nb\n")
    with pytest.raises(CorpusError) as err:
        read_multiway(tmp_path, "centered")
    assert "train.en: 3" in str(err.value) and "train.de: 2" in str(err.value)


def test_non_utf8_names_file_and_line(tmp_path):
    (tmp_path / "train.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "train.de").write_bytes(b"eins\nzwei\ndr\xffei\n")
    with pytest.raises(CorpusError, match=r"train\.de: line 3, byte 3: not valid UTF-8"):
        read_multiway(tmp_path, "centered")


def test_unknown_and_duplicate_language_codes(tmp_path):
    (tmp_path / "train.en").write_text("a\n")
    (tmp_path / "train.qq").write_text("a\n")
    with pytest.raises(LanguageError, match="unknown language code 'qq'"):
        read_multiway(tmp_path, "centered")
    assert read_multiway(tmp_path, "centered", allow_langs=frozenset({"qq"})).languages == ["en", "qq"]
    with pytest.raises(LanguageError, match="duplicate language code"):
        check_languages(["de", "en", "de"])
    with pytest.raises(LanguageError, match="duplicate"):
        read_multiway(tmp_path, "centered", langs=["en", "qq", "en"], allow_langs=frozenset({"qq"}))


def test_missing_train_and_missing_language_file(tmp_path):
    with pytest.raises(CorpusError, match="no train"):
        read_multiway(tmp_path, "centered")
    (tmp_path / "train.en").write_text("a\n")
    (tmp_path / "train.de").write_text("a\n")
    (tmp_path / "val.en").write_text("a\n")
    with pytest.raises(CorpusError, match="no file for de"):
        read_multiway(tmp_path, "centered")


def test_gzip_files_and_missing_final_newline(tmp_path):
    with gzip.open(tmp_path / "train.en.gz", "wt") as f:
        f.write("a\nb")
    (tmp_path / "train.de").write_text("x\ny")
    assert scan_text_file(tmp_path / "train.de") == 2
    corpus = read_multiway(tmp_path, "centered")
    (_, chunk), = list(corpus.train_splits()[0].read_chunks(10))
    assert chunk == {"en": ["a", "b"], "de": ["x", "y"]}


def test_opus100_layout(tmp_path):
    from tests.conftest import OPUS_SAMPLE
    if not OPUS_SAMPLE.is_dir():
        pytest.skip("OPUS-100 sample missing")
    corpus = read_opus100(OPUS_SAMPLE)
    assert corpus.central == "en" and corpus.languages[0] == "en"
    assert sorted(corpus.supervised) == sorted(dirs("de-en en-de en-fr fr-en"))
    assert sorted(corpus.zero_shot) == sorted(dirs("de-fr fr-de"))
    names = sorted((s.name, tuple(s.langs)) for s in corpus.splits)
    assert names.count(("test", ("de", "fr"))) == 1 and ("valid", ("de", "en")) in names
    only_de = read_opus100(OPUS_SAMPLE, langs=["de", "en"])
    assert sorted(only_de.supervised) == sorted(dirs("de-en en-de")) and only_de.zero_shot == []

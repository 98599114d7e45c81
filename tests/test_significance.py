"""Paired tests between two models on the same sentences: exact McNemar for off-target,
sacreBLEU's paired bootstrap for BLEU and chrF (real Multi30k lines)."""
from __future__ import annotations

from math import comb

import pytest

from cll_scale.evaluation.significance import compare_models, mcnemar_exact, paired_bootstrap


def lines(multi30k, lang: str, n: int = 200) -> list[str]:
    return (multi30k / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()[:n]


def test_mcnemar_matches_a_hand_computed_case():
    # 1 sentence off-target for the first model only, 5 for the second only: n = 6 discordant,
    # P(X <= 1) for X ~ Binomial(6, 1/2) is (1 + 6) / 64, two-sided 14/64.
    assert mcnemar_exact(1, 5) == pytest.approx(14 / 64)
    assert mcnemar_exact(5, 1) == pytest.approx(14 / 64)
    # 0 against 10: 2 / 1024
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 2 ** 10)
    # balanced or no discordant pair: no evidence at all
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(7, 20) == pytest.approx(2 * sum(comb(27, k) for k in range(8)) / 2 ** 27)


def test_bootstrap_tells_very_different_hypotheses_apart_and_not_identical_ones(multi30k):
    refs, english = lines(multi30k, "de"), lines(multi30k, "en")
    # a fair system: every reference with its last word dropped
    fair = [" ".join(r.split()[:-1]) for r in refs]
    scores, signature = paired_bootstrap(fair, fair, refs)
    # identical outputs: no evidence of a difference (sacreBLEU alone would say 1/1001)
    assert scores["bleu"][0] == scores["bleu"][1] and scores["bleu"][2] == scores["chrf"][2] == 1.0
    # one sentence of 200 made whole: a real but tiny difference, far from significant
    nearly = [refs[0], *fair[1:]]
    scores, _ = paired_bootstrap(fair, nearly, refs)
    assert scores["bleu"][1] > scores["bleu"][0] and scores["bleu"][2] > 0.05 and scores["chrf"][2] > 0.05
    scores, _ = paired_bootstrap(fair, english, refs)
    assert scores["bleu"][1] < scores["bleu"][0] and scores["bleu"][2] < 0.01
    assert scores["chrf"][2] < 0.01
    assert "bs:1000" in signature and "seed:12345" in signature


def test_compare_models_counts_off_target_sentences_per_group(multi30k):
    de, fr, en = lines(multi30k, "de", 60), lines(multi30k, "fr", 60), lines(multi30k, "en", 60)
    refs = {"en-de": de, "de-fr": fr}
    kinds = {"en-de": "supervised", "de-fr": "zero-shot"}
    good = {"en-de": de, "de-fr": fr}
    # the second model answers the zero-shot direction in English (off-target) and the
    # supervised one as the first does
    bad = {"en-de": de, "de-fr": en}
    result = compare_models({"fcll": good, "baseline": bad}, refs, kinds, samples=200)
    by_group = {c.group: c for c in result.comparisons}
    assert set(by_group) == {"supervised", "zero-shot"}
    sup, zero = by_group["supervised"], by_group["zero-shot"]
    assert (sup.model, sup.against, sup.sentences) == ("baseline", "fcll", 60)
    assert sup.discordant == (0, 0) and sup.off_target_p == 1.0 and sup.bleu_p == 1.0
    only_first, only_second = zero.discordant
    assert only_second > 40 and zero.off_target[1] > 60
    assert zero.off_target_p == pytest.approx(mcnemar_exact(only_first, only_second))
    assert zero.off_target_p < 1e-6 and zero.bleu_p < 0.01
    assert "| baseline | fcll | zero-shot | 60 |" in result.markdown()


def test_compare_models_refuses_different_sentences(multi30k):
    de = lines(multi30k, "de", 20)
    with pytest.raises(ValueError, match="same sentences"):
        compare_models({"a": {"en-de": de}, "b": {"en-de": de[:10]}}, {"en-de": de}, {"en-de": "supervised"})

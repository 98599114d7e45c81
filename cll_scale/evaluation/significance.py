"""Whether two models differ on the same sentences: sacreBLEU's paired bootstrap resampling for BLEU
and chrF, and an exact McNemar test for the off-target rate (langdetect, the paper's measure), each
model against the first, over the sentences of each direction group (supervised, zero-shot).

A group's directions are pooled into one corpus, so its BLEU here is the corpus BLEU of all its
sentences, not the mean of the directions' BLEU that the tables show. The paired bootstrap is
sacreBLEU's own (``sacrebleu.significance.PairedTest``, 1,000 resamples, its fixed seed); the
signature it returns names the test. No learned metric (COMET) is offered: its package does not
install offline on our set-up.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from math import comb

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from cll_scale.data.languages import Direction
from cll_scale.evaluation.langid import detect

GROUPS = ("supervised", "zero-shot")
BOOTSTRAP_SAMPLES = 1000


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: sentences off-target for the
    first model only, and for the second only. Under the null each discordant sentence is a fair
    coin, so the p-value is twice the binomial tail of the rarer side (at most 1)."""
    n = only_first + only_second
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(only_first, only_second) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_bootstrap(baseline: list[str], system: list[str], refs: list[str],
                     samples: int = BOOTSTRAP_SAMPLES) -> tuple[dict[str, tuple[float, float, float]], str]:
    """sacreBLEU's paired bootstrap of ``system`` against ``baseline`` on the same ``refs``:
    ``{"bleu"|"chrf": (baseline score, system score, p)}`` and the BLEU signature of the test."""
    if not (len(baseline) == len(system) == len(refs)) or not refs:
        raise ValueError(f"a paired test needs the same sentences: {len(baseline)} baseline, "
                         f"{len(system)} system hypotheses, {len(refs)} references")
    test = PairedTest([("baseline", baseline), ("system", system)], {"bleu": BLEU(), "chrf": CHRF()},
                      [refs], test_type="bs", n_samples=samples)
    signatures, scores = test()
    out = {}
    for key, name in (("bleu", "BLEU"), ("chrf", "chrF2")):
        base, other = scores[name]
        # sacreBLEU counts resampled differences strictly above the observed one, plus one, so two
        # identical outputs (every difference 0) get p = 1/(samples + 1), as if they differed.
        # Identical outputs are no evidence of a difference: p = 1.
        out[key] = (base.score, other.score, 1.0 if system == baseline else other.p_value)
    return out, str(signatures["BLEU"])


@dataclass
class Comparison:
    """One model against the first on one direction group's sentences."""
    model: str
    against: str
    group: str
    directions: list[str]
    sentences: int
    bleu: tuple[float, float]              # (against, model), corpus BLEU over the group's sentences
    bleu_p: float
    chrf: tuple[float, float]
    chrf_p: float
    off_target: tuple[float, float]        # % off-target (plain langdetect)
    discordant: tuple[int, int]            # sentences off-target for `against` only, for `model` only
    off_target_p: float


@dataclass
class Significance:
    comparisons: list[Comparison]
    signature: str

    def to_json(self) -> dict:
        return {"signature": self.signature, "comparisons": [asdict(c) for c in self.comparisons]}

    @classmethod
    def from_json(cls, d: dict) -> "Significance":
        pairs = ("bleu", "chrf", "off_target", "discordant")
        return cls([Comparison(**{k: tuple(v) if k in pairs else v for k, v in c.items()}) for c in d["comparisons"]],
                   d["signature"])

    def find(self, model: str, against: str, group: str) -> Comparison | None:
        return next((c for c in self.comparisons if (c.model, c.against, c.group) == (model, against, group)), None)

    def markdown(self) -> str:
        if not self.comparisons:
            return ""
        lines = ["Each model against the first on the same sentences (a group's directions pooled): "
                 "paired bootstrap (sacreBLEU) for BLEU and chrF, exact McNemar for off-target "
                 "(langdetect); p < 0.05 marks a difference unlikely by chance.", "",
                 "| model | against | group | sentences | BLEU | p | chrF | p | off-target | discordant | p |",
                 "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in self.comparisons:
            lines.append(f"| {c.model} | {c.against} | {c.group} | {c.sentences:,} | "
                         f"{c.bleu[0]:.2f} → {c.bleu[1]:.2f} | {c.bleu_p:.4f} | "
                         f"{c.chrf[0]:.2f} → {c.chrf[1]:.2f} | {c.chrf_p:.4f} | "
                         f"{c.off_target[0]:.1f}% → {c.off_target[1]:.1f}% | "
                         f"{c.discordant[0]} / {c.discordant[1]} | {c.off_target_p:.4f} |")
        return "\n".join(lines + ["", f"Paired test signature: {self.signature}"]) + "\n"


def off_target_flags(hyps: list[str], direction: str) -> list[bool]:
    """Per sentence: not in the direction's target language (plain langdetect, the paper's)."""
    tgt = Direction.parse(direction).tgt
    return [detect(h) != tgt for h in hyps]


def compare_models(hyps: dict[str, dict[str, list[str]]], refs: dict[str, list[str]], kinds: dict[str, str],
                   samples: int = BOOTSTRAP_SAMPLES) -> Significance:
    """``hyps``: model -> direction -> hypotheses (the first model is the one compared against);
    ``refs``: direction -> references (cut to the hypotheses' length: an evaluation of the first N
    sentences); ``kinds``: direction -> supervised / zero-shot. Only directions every model has
    are compared."""
    names = list(hyps)
    if len(names) < 2:
        return Significance([], "")
    first = names[0]
    shared = sorted(set.intersection(*(set(h) for h in hyps.values())) & set(refs))
    flags = {(name, d): off_target_flags(hyps[name][d], d) for name in names for d in shared}
    comparisons, signature = [], ""
    for group in GROUPS:
        directions = [d for d in shared if kinds.get(d) == group]
        if not directions:
            continue
        ref = [r for d in directions for r in refs[d][: len(hyps[first][d])]]
        base = [h for d in directions for h in hyps[first][d]]
        base_off = [f for d in directions for f in flags[first, d]]
        for name in names[1:]:
            if any(len(hyps[name][d]) != len(hyps[first][d]) for d in directions):
                raise ValueError(f"{name} and {first} were not evaluated on the same sentences of {group}")
            other = [h for d in directions for h in hyps[name][d]]
            other_off = [f for d in directions for f in flags[name, d]]
            scores, signature = paired_bootstrap(base, other, ref, samples)
            only_first = sum(a and not b for a, b in zip(base_off, other_off))
            only_second = sum(b and not a for a, b in zip(base_off, other_off))
            n = len(ref)
            comparisons.append(Comparison(
                name, first, group, directions, n, scores["bleu"][:2], scores["bleu"][2],
                scores["chrf"][:2], scores["chrf"][2],
                (100 * sum(base_off) / n, 100 * sum(other_off) / n), (only_first, only_second),
                mcnemar_exact(only_first, only_second)))
    return Significance(comparisons, signature)

"""A synthetic corpus in the OPUS-100 tarball layout, at OPUS-100's real shape.

The pipeline's cost at scale (vocabulary sampling, sharding, the stream's direction sampling, the
per-language LSL parameters) depends on how many languages there are, how unevenly their data is
spread and how long the sentences are, not on what the sentences mean. ``synthesize`` writes a
corpus with OPUS-100's languages, per-pair sizes, dev / test / zero-shot sets and file layout, so
the whole pipeline can be measured at that shape without downloading the release::

    <out>/synth.json        the arguments, every pair's row counts and the files written
    <out>/opus-100-corpus/v1.0/supervised/<a>-<b>/opus.<a>-<b>-{train,dev,test}.{<a>,<b>}
    <out>/opus-100-corpus/v1.0/zero-shot/<a>-<b>/opus.<a>-<b>-test.{<a>,<b>}

``cll-shards build --format opus100 --corpus <out>`` reads it like the real release.

The text is made up, but it looks like text to the tools downstream:
  * each language writes in its own script (Latin, Cyrillic, Arabic, Han without spaces, ...) and
    draws from its own Zipf-distributed word list, built from a language-specific letter
    distribution, so a character-level language identifier can tell languages apart;
  * sentence lengths are log-normal around 11 words (median), as in subtitle and web corpora;
  * line *i* of both files of a pair carries the same sequence of word ranks, each side spelling
    it with its own vocabulary: the pair is a word-for-word substitution, something a model can
    learn. Zero-shot pairs are built the same way, so they are consistent with the English pivot.

Same arguments (and the same numpy) give byte-identical files. The vocabularies depend only on
the language, the sentences on ``seed`` and the pair, so a pair's files do not change when
``langs`` adds or drops other languages.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from cll_scale.core.outputs import atomic_dir, check_output, json_text, write_atomic

MARKER = "synth.json"
TOOL = "cll-shards synth"
CENTRAL = "en"
CORPUS_ROOT = Path("opus-100-corpus") / "v1.0"

# Training pairs of each language with English in the OPUS-100 v1.0 release (Zhang et al. 2020,
# "Improving Massively Multilingual Neural Machine Translation and Zero-Shot Translation", ACL),
# as recorded per pair in the split sizes of the Hugging Face dataset Helsinki-NLP/opus-100.
# The paper sampled at most 1M pairs per language; these add up to 55.0M pairs, with 44 languages
# at the 1M cap, 73 with at least 100K and 95 with at least 10K, as the paper reports.
OPUS100_TRAIN: dict[str, int] = {
    "af": 275_512, "am": 89_027, "an": 6_961, "ar": 1_000_000, "as": 138_479, "az": 262_089,
    "be": 67_312, "bg": 1_000_000, "bn": 1_000_000, "br": 153_447, "bs": 1_000_000, "ca": 1_000_000,
    "cs": 1_000_000, "cy": 289_521, "da": 1_000_000, "de": 1_000_000, "dz": 624, "el": 1_000_000,
    "eo": 337_106, "es": 1_000_000, "et": 1_000_000, "eu": 1_000_000, "fa": 1_000_000, "fi": 1_000_000,
    "fr": 1_000_000, "fy": 54_342, "ga": 289_524, "gd": 16_316, "gl": 515_344, "gu": 318_306,
    "ha": 97_983, "he": 1_000_000, "hi": 534_319, "hr": 1_000_000, "hu": 1_000_000, "hy": 7_059,
    "id": 1_000_000, "ig": 18_415, "is": 1_000_000, "it": 1_000_000, "ja": 1_000_000, "ka": 377_306,
    "kk": 79_927, "km": 111_483, "kn": 14_537, "ko": 1_000_000, "ku": 144_844, "ky": 27_215,
    "li": 25_535, "lt": 1_000_000, "lv": 1_000_000, "mg": 590_771, "mk": 1_000_000, "ml": 822_746,
    "mn": 4_294, "mr": 27_007, "ms": 1_000_000, "mt": 1_000_000, "my": 24_594, "nb": 142_906,
    "ne": 406_381, "nl": 1_000_000, "nn": 486_055, "no": 1_000_000, "oc": 35_791, "or": 14_273,
    "pa": 107_296, "pl": 1_000_000, "ps": 79_127, "pt": 1_000_000, "ro": 1_000_000, "ru": 1_000_000,
    "rw": 173_823, "se": 35_907, "sh": 267_211, "si": 979_109, "sk": 1_000_000, "sl": 1_000_000,
    "sq": 1_000_000, "sr": 1_000_000, "sv": 1_000_000, "ta": 227_014, "te": 64_352, "tg": 193_882,
    "th": 1_000_000, "tk": 13_110, "tr": 1_000_000, "tt": 100_843, "ug": 72_170, "uk": 1_000_000,
    "ur": 753_913, "uz": 173_157, "vi": 1_000_000, "wa": 104_496, "xh": 439_671, "yi": 15_010,
    "yo": 10_375, "zh": 1_000_000, "zu": 38_616,
}
# Dev and test sets hold 2,000 pairs each. Five pairs had too little data for any (94 of the 99
# have test data) and five more ran short: their (dev, test) sizes are those of the release.
EVAL_PAIRS = 2000
EVAL_SHORT: dict[str, tuple[int, int]] = {
    "gd": (1605, 1606), "ig": (1843, 1843), "kn": (917, 918), "or": (1317, 1318), "tk": (1852, 1852)}
NO_EVAL = frozenset({"an", "dz", "hy", "mn", "yo"})
# Zero-shot test sets: 2,000 pairs for each of the 15 pairs (30 directions) among these six.
ZERO_SHOT_LANGS = ("ar", "de", "fr", "nl", "ru", "zh")
MIN_PAIRS = 1      # a scaled-down language keeps at least this many pairs, so no pair disappears


# ---------------------------------------------------------------------------------------------
# Scripts and vocabularies

@dataclass(frozen=True)
class Script:
    """How one writing system looks in the synthetic text."""

    letters: tuple[tuple[int, int], ...]     # code-point ranges (inclusive) of its letters
    word_len: tuple[int, int] = (2, 9)       # letters per word, inclusive
    sep: str = " "                           # between words: "" where the script uses no spaces
    end: str = "."                           # sentence-final mark
    cased: bool = False                      # the first word of a sentence is capitalised
    sampled: tuple[int, int, int] | None = None   # (first, last, k): each language's k letters of a large block
    extras: str = ""                         # letters a language may add to the base alphabet (diacritics)


SCRIPTS: dict[str, Script] = {
    "latin": Script(((0x61, 0x7A),), cased=True,
                    extras="àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßăąćčďđęěğıłńňőœřśşšťţůűźżžə"),
    "cyrillic": Script(((0x430, 0x44F),), cased=True, extras="ёђѓєѕіїјљњћќўџґғқңүұһәөҷ"),
    "greek": Script(((0x3B1, 0x3C9),), cased=True),
    "armenian": Script(((0x561, 0x586),), cased=True, end="։"),
    "georgian": Script(((0x10D0, 0x10F0),)),
    "hebrew": Script(((0x5D0, 0x5EA),)),
    "arabic": Script(((0x621, 0x63A), (0x641, 0x64A)), extras="پچژکگیٹڈڑںھہےۆۇۈۋې"),
    "devanagari": Script(((0x905, 0x939),), end="।"),
    "bengali": Script(((0x985, 0x9B9),), end="।"),
    "gurmukhi": Script(((0xA05, 0xA39),), end="।"),
    "gujarati": Script(((0xA85, 0xAB9),)),
    "oriya": Script(((0xB05, 0xB39),), end="।"),
    "tamil": Script(((0xB85, 0xBB9),)),
    "telugu": Script(((0xC05, 0xC39),)),
    "kannada": Script(((0xC85, 0xCB9),)),
    "malayalam": Script(((0xD05, 0xD39),)),
    "sinhala": Script(((0xD85, 0xDC6),)),
    "thai": Script(((0xE01, 0xE2E),), sep="", end=""),
    "khmer": Script(((0x1780, 0x17B3),), sep="", end="។"),
    "myanmar": Script(((0x1000, 0x102A),), sep="", end="။"),
    "tibetan": Script(((0xF40, 0xF6C),), word_len=(1, 4), sep="་", end="།"),
    "ethiopic": Script(((0x1200, 0x1357),), word_len=(1, 5), end="።"),
    "hangul": Script((), word_len=(1, 4), sampled=(0xAC00, 0xD7A3, 800)),
    "han": Script((), word_len=(1, 3), sep="", end="。", sampled=(0x4E00, 0x9FFF, 3000)),
    "japanese": Script(((0x3041, 0x3096), (0x30A1, 0x30FA)), word_len=(1, 4), sep="", end="。",
                       sampled=(0x4E00, 0x9FFF, 1500)),
}
_SCRIPT_LANGS = {
    "latin": "af an az br bs ca cs cy da de en eo es et eu fi fr fy ga gd gl ha hr hu id ig is it ku li "
             "lt lv mg ms mt nb nl nn no oc pl pt ro rw se sh sk sl sq sv tk tr uz vi wa xh yo zu",
    "cyrillic": "be bg kk ky mk mn ru sr tg tt uk",
    "arabic": "ar fa ps ug ur", "hebrew": "he yi", "greek": "el", "armenian": "hy", "georgian": "ka",
    "devanagari": "hi mr ne", "bengali": "as bn", "gurmukhi": "pa", "gujarati": "gu", "oriya": "or",
    "tamil": "ta", "telugu": "te", "kannada": "kn", "malayalam": "ml", "sinhala": "si", "thai": "th",
    "khmer": "km", "myanmar": "my", "tibetan": "dz", "ethiopic": "am", "hangul": "ko", "han": "zh",
    "japanese": "ja",
}
LANG_SCRIPT: dict[str, str] = {lang: s for s, langs in _SCRIPT_LANGS.items() for lang in langs.split()}

VOCAB_WORDS = 6000
# Sentence length in words: log-normal, median 11, most lines 5 to 25 words, a long tail.
MEDIAN_WORDS, SIGMA_WORDS, MAX_WORDS = 11.0, 0.55, 80
CHUNK_PAIRS = 16384     # pairs rendered at once: a few MB of text, whatever the scale


def _key(*parts: int | str) -> list[int]:
    """Entropy for ``np.random.default_rng``: strings by their bytes, never Python's salted hash."""
    return [p if isinstance(p, int) else int.from_bytes(p.encode(), "big") for p in parts]


def _letters(first: int, last: int) -> list[str]:
    # Blocks have holes (unassigned code points) and signs that are not letters: keep letters only.
    return [chr(c) for c in range(first, last + 1) if unicodedata.category(chr(c)) in ("Ll", "Lo")]


def alphabet(lang: str) -> list[str]:
    """The letters ``lang`` writes with, most frequent first."""
    script = SCRIPTS[LANG_SCRIPT[lang]]
    rng = np.random.default_rng(_key("alphabet", lang))
    chars = [ch for lo, hi in script.letters for ch in _letters(lo, hi)]
    if script.sampled:
        lo, hi, k = script.sampled
        chars += rng.choice(_letters(lo, hi), size=k, replace=False).tolist()
    # Each language prefers its own letters: the frequency order is a per-language shuffle.
    chars = [chars[i] for i in rng.permutation(len(chars))]
    if script.extras and lang != CENTRAL:
        # A few letters with diacritics of its own, among the rarer ones as in real orthographies.
        chars += rng.choice(list(script.extras), size=int(rng.integers(2, 7)), replace=False).tolist()
    return chars


def vocabulary(lang: str) -> tuple[str, ...]:
    """``VOCAB_WORDS`` distinct words of ``lang``, most frequent first."""
    script = SCRIPTS[LANG_SCRIPT[lang]]
    rng = np.random.default_rng(_key("words", lang))
    letters = alphabet(lang)
    p = 1.0 / (np.arange(len(letters)) + 2.0)
    p /= p.sum()
    lo, hi = script.word_len
    words: dict[str, None] = {}
    while len(words) < VOCAB_WORDS:
        n = 2 * VOCAB_WORDS
        lens = lo + rng.binomial(hi - lo, 0.4, size=n)
        # Frequent words are short (Zipf's law of abbreviation): candidates go loosely by length.
        lens = lens[np.argsort(lens + 2.5 * rng.random(n), kind="stable")]
        picks = rng.choice(len(letters), size=(n, hi), p=p)
        for row, k in zip(picks.tolist(), lens.tolist()):
            words.setdefault("".join([letters[i] for i in row[:k]]))
    return tuple(words)[:VOCAB_WORDS]


@dataclass(frozen=True)
class _Table:
    """Every token of one language as UTF-8 bytes, back to back: ids 0..V-1 the words, V..2V-1 the
    same words capitalised, 2V the word separator, 2V+1 the sentence end with its newline."""

    data: np.ndarray      # uint8
    offset: np.ndarray    # int64 per token id
    length: np.ndarray    # int64 per token id


@lru_cache(maxsize=None)     # a few hundred KB per language; the word strings are not kept
def _table(lang: str) -> _Table:
    script = SCRIPTS[LANG_SCRIPT[lang]]
    words = vocabulary(lang)
    caps = [w[:1].upper() + w[1:] for w in words] if script.cased else list(words)
    tokens = [w.encode() for w in words] + [w.encode() for w in caps] + [script.sep.encode(),
                                                                          (script.end + "\n").encode()]
    length = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    return _Table(np.frombuffer(b"".join(tokens), dtype=np.uint8), np.cumsum(length) - length, length)


_RANK_P = 1.0 / (np.arange(VOCAB_WORDS) + 2.7)       # Zipf-Mandelbrot word frequencies
_RANK_CDF = np.cumsum(_RANK_P / _RANK_P.sum())


def _sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(words per sentence, word ranks of all sentences back to back) for ``n`` sentences."""
    lens = np.clip(np.rint(rng.lognormal(math.log(MEDIAN_WORDS), SIGMA_WORDS, size=n)), 1, MAX_WORDS)
    lens = lens.astype(np.int64)
    ranks = np.searchsorted(_RANK_CDF, rng.random(int(lens.sum())), side="right")
    return lens, np.minimum(ranks, VOCAB_WORDS - 1)


def _render(table: _Table, lens: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The UTF-8 bytes of the sentences: word, separator, word, ..., end, one line each.

    Built with one gather over the token table (no Python loop per word): each output byte is
    ``data[offset[token] + position within the token]``."""
    n_words, vocab = len(ranks), VOCAB_WORDS
    first = np.cumsum(lens) - lens
    tokens = np.full(2 * n_words, 2 * vocab, dtype=np.int64)    # every odd slot a separator ...
    tokens[0::2] = ranks
    tokens[2 * first] += vocab                                  # ... the first word capitalised
    tokens[2 * (first + lens) - 1] = 2 * vocab + 1              # ... the last separator the end
    size = table.length[tokens]
    out_start = np.cumsum(size) - size
    index = np.repeat(table.offset[tokens] - out_start, size) + np.arange(int(size.sum()))
    return table.data[index]


# ---------------------------------------------------------------------------------------------
# What to write

@dataclass(frozen=True)
class PairPlan:
    pair: str                  # the directory name, languages sorted: "de-en", "en-fr", "ar-de"
    kind: str                  # "supervised" or "zero-shot"
    rows: dict[str, int]       # split ("train", "dev", "test") -> pairs


def _scaled(n: int, scale: float) -> int:
    return max(MIN_PAIRS, int(math.floor(n * scale + 0.5)))


def check_langs(langs: list[str] | None) -> list[str]:
    """The non-English OPUS-100 languages to write (all 99 by default); ``en`` is always there."""
    if langs is None:
        return sorted(OPUS100_TRAIN)
    unknown = [x for x in langs if x not in OPUS100_TRAIN and x != CENTRAL]
    if unknown:
        raise ValueError(f"--langs: {', '.join(map(repr, unknown))} not among OPUS-100's languages "
                         f"({' '.join(sorted(OPUS100_TRAIN))}, each paired with en)")
    twice = sorted({x for x in langs if langs.count(x) > 1})
    if twice:
        raise ValueError(f"--langs lists {', '.join(twice)} twice")
    chosen = sorted(x for x in langs if x != CENTRAL)
    if not chosen:
        raise ValueError("--langs: name at least one language besides en")
    return chosen


def plan(scale: float, langs: list[str] | None = None, scale_eval: bool = False) -> list[PairPlan]:
    """Every pair directory to write and its row counts. ``scale`` multiplies training pairs
    (1.0 = OPUS-100's 55M); dev, test and zero-shot sets keep their real sizes unless ``scale_eval``."""
    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"--scale must be a number > 0 (1.0 = OPUS-100's 55M training pairs), got {scale!r}")
    chosen = check_langs(langs)
    eval_scale = scale if scale_eval else 1.0
    plans = []
    for x in chosen:
        rows = {"train": _scaled(OPUS100_TRAIN[x], scale)}
        if x not in NO_EVAL:
            dev, test = EVAL_SHORT.get(x, (EVAL_PAIRS, EVAL_PAIRS))
            rows |= {"dev": _scaled(dev, eval_scale), "test": _scaled(test, eval_scale)}
        plans.append(PairPlan("-".join(sorted((x, CENTRAL))), "supervised", rows))
    zero = [x for x in ZERO_SHOT_LANGS if x in chosen]
    for i, a in enumerate(zero):
        for b in zero[i + 1:]:
            plans.append(PairPlan(f"{a}-{b}", "zero-shot", {"test": _scaled(EVAL_PAIRS, eval_scale)}))
    return plans


def split_files(p: PairPlan, split: str) -> list[Path]:
    """The two files of one split of a pair, relative to the output directory."""
    return [CORPUS_ROOT / p.kind / p.pair / f"opus.{p.pair}-{split}.{x}" for x in p.pair.split("-")]


# ---------------------------------------------------------------------------------------------
# Writing

def synth_strangers(path: Path) -> list[str] | None:
    """What in ``path`` synth did not write (``None``: no synth.json, not a synthetic corpus)."""
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("tool") != TOOL or not isinstance(marker.get("files"), list):
        return None
    ours = {MARKER, *map(str, marker["files"])}
    ours |= {str(parent) for f in marker["files"] for parent in Path(f).parents} - {"."}
    return sorted(rel for rel in (str(p.relative_to(path)) for p in path.rglob("*")) if rel not in ours)


def _output_dir(out: str | os.PathLike, overwrite: bool) -> Path:
    path = Path(out)
    # An empty directory (made by mktemp -d, say) holds nothing that replacing it could lose.
    if path.is_dir() and not any(path.iterdir()):
        return path.resolve()
    return check_output(out, overwrite=overwrite, kind="synthetic OPUS-100 corpus", strangers=synth_strangers)


def _write_split(root: Path, p: PairPlan, split: str, seed: int, bar) -> int:
    """Write one split of a pair chunk by chunk; returns the bytes written."""
    tables = [_table(x) for x in p.pair.split("-")]
    n, written = p.rows[split], 0
    paths = [root / f for f in split_files(p, split)]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    with open(paths[0], "wb", buffering=1 << 20) as fa, open(paths[1], "wb", buffering=1 << 20) as fb:
        for k, start in enumerate(range(0, n, CHUNK_PAIRS)):
            # Each chunk has its own generator: the text of a pair depends on (seed, pair, split)
            # alone, not on which other pairs were written before it.
            rng = np.random.default_rng(_key(seed, p.pair, split, k))
            lens, ranks = _sample(rng, min(CHUNK_PAIRS, n - start))
            for f, table in zip((fa, fb), tables):
                text = _render(table, lens, ranks)
                f.write(text)
                written += text.nbytes
            bar.update(len(lens))
    return written


# Bytes a synthetic pair takes on disk (both sides, newlines): 100-117 measured at scales
# 0.0005-0.002; the estimate errs high.
BYTES_PER_PAIR = 125


def estimate_bytes(pairs: int) -> int:
    return pairs * BYTES_PER_PAIR


def check_space(target: Path, pairs: int) -> None:
    """Say the size before writing, and refuse a corpus the file system cannot hold (it would
    fill the disk and fail late; ``--scale 1e9`` asks for about 10^15 bytes)."""
    need = estimate_bytes(pairs)
    parent = next(p for p in (target, *target.parents) if p.exists())
    free = shutil.disk_usage(parent).free
    print(f"synth: {pairs:,} pairs, about {need / 1e6:,.0f} MB (free on {parent}: {free / 1e6:,.0f} MB)",
          file=sys.stderr)
    if need > free:
        raise ValueError(f"--scale: the corpus needs about {need / 1e9:,.1f} GB, {parent} has {free / 1e9:,.1f} GB "
                         f"free; lower --scale or --out elsewhere")


def synthesize(out: str | os.PathLike, scale: float, seed: int = 1, langs: list[str] | None = None,
               scale_eval: bool = False, overwrite: bool = False) -> dict:
    """Write a synthetic OPUS-100 corpus into ``out`` and return what ``synth.json`` records, plus
    ``seconds`` and ``pairs_per_s``.

    ``out`` must not exist (or be an empty directory); with ``overwrite`` it may be a corpus this
    function wrote that holds nothing else. The corpus is written into a temporary sibling and
    renamed into place at the end, so an interrupted run leaves no partial corpus."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")
    plans = plan(scale, langs, scale_eval)
    target = _output_dir(out, overwrite)
    total = sum(n for p in plans for n in p.rows.values())
    check_space(target, total)
    started = time.perf_counter()
    n_bytes = 0
    with atomic_dir(target, replace=True) as tmp:
        bar = tqdm(total=total, unit="pairs", desc="synth", leave=False, disable=None)
        for p in plans:
            for split in p.rows:
                n_bytes += _write_split(tmp, p, split, seed, bar)
        bar.close()
        marker = {
            "tool": TOOL, "version": 1, "format": "opus100",
            "source": "per-language sizes of OPUS-100 v1.0 (Zhang et al. 2020, ACL); synthetic text",
            "args": {"scale": scale, "seed": seed, "langs": langs, "scale_eval": scale_eval},
            "languages": [CENTRAL] + check_langs(langs),
            "totals": {"train": sum(p.rows.get("train", 0) for p in plans),
                       "dev": sum(p.rows.get("dev", 0) for p in plans),
                       "test": sum(p.rows.get("test", 0) for p in plans if p.kind == "supervised"),
                       "zero_shot_test": sum(p.rows["test"] for p in plans if p.kind == "zero-shot"),
                       "pairs": total, "bytes": n_bytes},
            "pairs": {p.pair: {"kind": p.kind, **p.rows} for p in plans},
            "files": sorted(str(f) for p in plans for split in p.rows for f in split_files(p, split)),
        }
        write_atomic(tmp / MARKER, json_text(marker, indent=1) + "\n")
    seconds = time.perf_counter() - started
    return {**marker, "seconds": seconds, "pairs_per_s": total / max(seconds, 1e-9)}

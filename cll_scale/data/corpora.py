"""Corpus readers: the three on-disk formats, seen as *aligned splits*.

An :class:`AlignedSplit` is a set of line-aligned texts in several languages (a multi-way
``{split}.{lang}`` set, or one OPUS-100 / Hugging Face pair) together with the translation
directions to write from it. The builder never needs to know which format a split came from.

Every reader checks its input before anything is written: files of one split with different
line counts, non-UTF-8 bytes, unknown or duplicate language codes are errors that name the file.
"""
from __future__ import annotations

import gzip
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from cll_scale.data.languages import Direction, LanguageError, check_language, check_languages

# Validation splits are called val / dev / validation depending on the corpus; the manifest
# calls them all "valid" so that training and evaluation find them by one name.
_SPLIT_ALIASES = {"val": "valid", "dev": "valid", "validation": "valid"}
_READ_BLOCK = 1 << 24


class CorpusError(ValueError):
    """The input corpus is malformed; the message names the file (and line)."""


def canonical_split(name: str) -> str:
    return _SPLIT_ALIASES.get(name, name)


def split_names(name: str) -> list[str]:
    """Every name of one split, ``name`` first: valid, val, dev and validation are one."""
    canonical = canonical_split(name)
    return list(dict.fromkeys([name, canonical, *(k for k, v in _SPLIT_ALIASES.items() if v == canonical)]))


@dataclass
class AlignedSplit:
    """Line-aligned text in ``langs``; ``directions`` are the pairs to write from it."""

    name: str
    langs: tuple[str, ...]
    directions: list[Direction]
    n_lines: int | None
    label: str
    # Yields (first_line_number, {lang: [text, ...]}) chunks, texts already stripped.
    read_chunks: Callable[[int], Iterator[tuple[int, dict[str, list[str]]]]] = field(repr=False)


@dataclass
class Corpus:
    fmt: str
    path: str
    languages: list[str]
    central: str | None
    condition: str
    supervised: list[Direction]
    zero_shot: list[Direction]
    splits: list[AlignedSplit]

    def train_splits(self) -> list[AlignedSplit]:
        return [s for s in self.splits if s.name == "train"]


# ---------------------------------------------------------------------------------------------
# Plain text files (multi-way directories and the OPUS-100 layout)

def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def scan_text_file(path: Path) -> int:
    """Count the lines of ``path`` and check that it is valid UTF-8 (error names the line)."""
    n_lines, tail = 0, b""
    with _open_binary(path) as f:
        while True:
            block = f.read(_READ_BLOCK)
            data = tail + block
            if not block:
                if data:
                    _decode_or_fail(data, path, n_lines)
                    n_lines += 1
                return n_lines
            cut = data.rfind(b"\n") + 1
            _decode_or_fail(data[:cut], path, n_lines)
            n_lines += data.count(b"\n", 0, cut)
            tail = data[cut:]


def _decode_or_fail(data: bytes, path: Path, lines_before: int) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = lines_before + data.count(b"\n", 0, err.start) + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise CorpusError(
            f"{path}: line {line}, byte {col}: not valid UTF-8 "
            f"({err.reason}, byte 0x{data[err.start]:02x})") from None


def _text_chunks(files: dict[str, Path]) -> Callable[[int], Iterator[tuple[int, dict[str, list[str]]]]]:
    def read(size: int):
        handles = {lang: _open_binary(p) for lang, p in files.items()}
        try:
            first = 1
            while True:
                chunk = {lang: [ln.decode("utf-8").strip() for ln in itertools.islice(h, size)]
                         for lang, h in handles.items()}
                n = len(next(iter(chunk.values())))
                if n == 0:
                    return
                yield first, chunk
                first += n
        finally:
            for h in handles.values():
                h.close()
    return read


def _text_split(name: str, files: dict[str, Path], directions: list[Direction]) -> AlignedSplit:
    counts = {lang: scan_text_file(p) for lang, p in files.items()}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"{files[lang].name}: {n}" for lang, n in counts.items())
        raise CorpusError(f"split {name!r}: files have different line counts ({detail})")
    label = ", ".join(str(p) for p in files.values())
    return AlignedSplit(canonical_split(name), tuple(files), directions,
                        next(iter(counts.values())), label, _text_chunks(files))


# ---------------------------------------------------------------------------------------------
# Data conditions (paper §4.1)

CONDITIONS = ("centered", "triangle", "square", "cycle", "centered-cycle")
# The order the paper's conditions take their languages in (§4.1, Table 11: the triangle
# de→fr→cs→de; the square de↔fr↔cs↔en↔de, zero-shot de↔cs and fr↔en; the one-way cycle
# de→fr→cs→en→de). The order of a ring decides which directions are zero-shot, so a build
# without --langs takes this one (cll-repro's), never the alphabetical order of the files.
PAPER_ORDER = {"triangle": ["de", "fr", "cs"], "square": ["de", "fr", "cs", "en"], "cycle": ["de", "fr", "cs", "en"],
               "centered-cycle": ["en", "de", "fr", "cs"]}


def _cycle(langs: list[str]) -> list[Direction]:
    """l0→l1→…→l(n-1)→l0, one way: every source has one target (strict dependence)."""
    return [Direction(langs[i], langs[(i + 1) % len(langs)]) for i in range(len(langs))]


def _ring(condition: str, langs: list[str], central: str | None, ordered: bool
          ) -> tuple[list[str], None, list[Direction]]:
    """The ring conditions of :func:`condition_directions` (``triangle``, ``square``, ``cycle``)."""
    need = {"triangle": 3, "square": 4}.get(condition)
    if (need and len(langs) != need) or len(langs) < 3:
        wanted = f"exactly {need}" if need else "at least 3"
        raise CorpusError(f"condition {condition!r} needs {wanted} languages, got "
                          f"{len(langs)} ({', '.join(langs)}): choose them with --langs")
    if central:
        raise CorpusError(f"condition {condition!r} is non-centered; do not pass --central")
    if not ordered:
        paper = PAPER_ORDER[condition]
        if sorted(langs) != sorted(paper):
            raise CorpusError(f"condition {condition!r} joins its languages in a ring in the order of --langs, "
                              f"which decides its zero-shot directions: pass --langs (e.g. "
                              f"{','.join(sorted(langs))} in the order wanted; the paper's is {','.join(paper)})")
        langs = paper
    ring = _cycle(langs)
    sup = [x for d in ring for x in (d, d.reverse())] if condition == "square" else ring
    return list(langs), None, sup


def condition_directions(condition: str, langs: list[str], central: str | None, ordered: bool = True
                         ) -> tuple[list[str], str | None, list[Direction]]:
    """Resolve a data condition to (ordered languages, central language, supervised directions).

    The named conditions follow the paper (§4.1, Table 11: supervised / zero-shot directions):

    * ``centered``: central ↔ every other language (central defaults to ``en``); 4 languages:
      6 / 6.
    * ``triangle``: the one-way cycle l0→l1→l2→l0 over 3 languages in the order given (Multi30k
      ``de,fr,cs``: de→fr, fr→cs, cs→de): 3 / 3, every source with one target (strict dependence).
    * ``square``: 4 languages l0..l3, each edge of the square both ways (l0↔l1, l1↔l2, l2↔l3,
      l3↔l0), the diagonals l0↔l2, l1↔l3 zero-shot: 8 / 4. Every source has two targets, so the
      tag must decide the output language (the paper: "designed for avoiding strict dependence").
    * ``cycle``: the one-way cycle over any number (≥ 3) of languages; over 4 it is 4 / 8 and keeps
      the triangle's strict dependence (not the paper's square: ``cll-scale`` called it ``square``
      before 2026-12-05).
    * ``centered-cycle``: ``centered`` plus the one-way cycle over the other languages in the
      order given (Multi30k ``en,de,fr,cs``: de→fr, fr→cs, cs→de added): the paper's Table 6 row
      (2), whose added pairs are one-way; 4 languages: 9 / 3 (fr→de, cs→fr, de→cs stay zero-shot).
    * an explicit list ``de-fr,fr-cs``: exactly those directions.

    ``ordered``: ``langs`` are in the order the user chose (``--langs``). Otherwise (the corpus's
    files) a ring takes :data:`PAPER_ORDER` when they are the paper's languages, and is refused
    when they are not, since its zero-shot directions depend on the order.
    """
    if condition in ("centered", "centered-cycle"):
        central = central or ("en" if "en" in langs else None)
        if central is None or central not in langs:
            raise CorpusError(f"condition {condition!r} needs --central, one of {', '.join(langs)}")
        others = [lang for lang in langs if lang != central]
        if not others:
            raise CorpusError(f"condition {condition!r} needs at least two languages")
        paper = PAPER_ORDER["centered-cycle"]
        if condition == "centered-cycle" and not ordered and [central, *sorted(others)] == [paper[0], *sorted(paper[1:])]:
            others = paper[1:]          # the files' order is alphabetical; the cycle takes the paper's
        sup = [Direction(central, x) for x in others] + [Direction(x, central) for x in others]
        if condition == "centered-cycle":
            others, _, ring = _ring("cycle", others, None, True)
            sup += ring
        return [central] + others, central, sup
    if condition in ("triangle", "square", "cycle"):
        return _ring(condition, langs, central, ordered)
    try:
        sup = [Direction.parse(d) for d in condition.split(",") if d.strip()]
    except LanguageError as err:
        raise CorpusError(f"--condition must be one of {', '.join(CONDITIONS)} or a list of "
                          f"directions like 'de-fr,fr-cs': {err}") from None
    if not sup:
        raise CorpusError("--condition: empty list of directions")
    if len(set(sup)) != len(sup):
        raise CorpusError(f"--condition lists a direction twice: {condition}")
    missing = sorted({x for d in sup for x in (d.src, d.tgt)} - set(langs))
    if missing:
        raise CorpusError(f"--condition uses languages not in the corpus: {', '.join(missing)}")
    used = [lang for lang in langs if any(lang in (d.src, d.tgt) for d in sup)]
    if central and central not in used:
        raise CorpusError(f"--central {central} is not a language of --condition")
    if central:
        used = [central] + [lang for lang in used if lang != central]
    return used, central, sup


# ---------------------------------------------------------------------------------------------
# Multi-way, line-aligned directory: {split}.{lang}[.gz]

def read_multiway(root: str | os.PathLike, condition: str = "centered", langs: list[str] | None = None,
                  central: str | None = None, allow_langs: frozenset[str] = frozenset(),
                  only_split: str | None = None) -> Corpus:
    """``only_split``: read that split alone (an evaluation's test text), which then needs no
    train split beside it; without it the corpus is one to train on."""
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"{root}: not a directory")
    if langs:
        check_languages(langs, allow_langs, where="--langs")
    by_split: dict[str, dict[str, Path]] = {}
    for path in sorted(root.iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        stem = path.name[:-3] if path.name.endswith(".gz") else path.name
        split, dot, lang = stem.rpartition(".")
        if not dot or not split:
            raise CorpusError(f"{path}: expected files named {{split}}.{{lang}}, e.g. train.de")
        if (langs and lang not in langs) or (only_split and split != only_split):
            continue
        check_language(lang, allow_langs, where=f"file {path}")
        files = by_split.setdefault(split, {})
        if lang in files or lang.lower() in {x.lower() for x in files}:
            raise CorpusError(f"duplicate language code {lang!r} in split {split!r}: "
                              f"{files.get(lang, path)} and {path}")
        files[lang] = path
    if (only_split or "train") not in by_split:
        raise CorpusError(f"{root}: no {only_split or 'train'}.{{lang}} files found")
    found = list(langs) if langs else sorted(by_split[only_split or "train"])
    order, central, sup = condition_directions(condition, found, central, ordered=bool(langs))
    zero = [Direction(a, b) for a in order for b in order if a != b and Direction(a, b) not in sup]
    splits = []
    for split, files in by_split.items():
        missing = [lang for lang in order if lang not in files]
        if missing:
            raise CorpusError(f"split {split!r} has no file for {', '.join(missing)} "
                              f"(expected {', '.join(f'{split}.{m}' for m in missing)} in {root})")
        dirs = sup if split == "train" else sup + zero
        splits.append(_text_split(split, {lang: files[lang] for lang in order}, dirs))
    _check_unique_names(splits)
    return Corpus("multiway", str(root), order, central, condition, sup, zero, splits)


def _check_unique_names(splits: list[AlignedSplit]) -> None:
    seen: dict[tuple[str, Direction], str] = {}
    for s in splits:
        for d in s.directions:
            if (s.name, d) in seen:
                raise CorpusError(f"direction {d} of split {s.name!r} comes from two sources: "
                                  f"{seen[(s.name, d)]} and {s.label}")
            seen[(s.name, d)] = s.label


# ---------------------------------------------------------------------------------------------
# Pair corpora (OPUS-100 on-disk layout, Hugging Face parquet): each pair a-b with a train split
# is supervised in both directions; a pair with only a test split is zero-shot.

def _pair_corpus(fmt: str, path: str, pair_splits: dict[Direction, dict[str, AlignedSplit]],
                 condition: str | None, langs: list[str] | None) -> Corpus:
    sup: list[Direction] = []
    zero: list[Direction] = []
    for pair, splits in pair_splits.items():
        both = [pair, pair.reverse()]
        (sup if "train" in splits else zero).extend(both)
    if condition and condition != "all":
        _, _, wanted = condition_directions(condition, sorted({x for d in sup for x in (d.src, d.tgt)}), None)
        unknown = [str(d) for d in wanted if d not in sup]
        if unknown:
            raise CorpusError(f"--condition names directions without training data: {', '.join(unknown)}")
        zero += [d for d in sup if d not in wanted]
        sup = wanted
    languages = sorted({x for d in sup + zero for x in (d.src, d.tgt)})
    if langs:
        languages = [lang for lang in langs if lang in languages]
    # OPUS-100 is English-centric: the language in every supervised pair is the central one.
    common = set(languages)
    for d in sup:
        common &= {d.src, d.tgt}
    central = next(iter(common)) if len(common) == 1 and len(sup) > 2 else None
    if central:
        languages = [central] + [lang for lang in languages if lang != central]
    splits = []
    for pair, by_name in pair_splits.items():
        for s in by_name.values():
            s.directions = [d for d in s.directions if (d in sup if s.name == "train" else True)]
            if s.directions:
                splits.append(s)
    _check_unique_names(splits)
    return Corpus(fmt, path, languages, central, condition or "all", sup, zero, splits)


def _pair_dirs(base: Path, langs, allow_langs) -> Iterator[tuple[Direction, Path]]:
    for pair_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        try:
            pair = Direction.parse(pair_dir.name)
        except LanguageError as err:
            raise CorpusError(f"{pair_dir}: {err}") from None
        check_languages([pair.src, pair.tgt], allow_langs, where=f"directory {pair_dir}")
        if langs and not (pair.src in langs and pair.tgt in langs):
            continue
        yield pair, pair_dir


def _opus_base(root: Path) -> Path:
    for cand in (root, root / "v1.0", root / "opus-100-corpus" / "v1.0"):
        if (cand / "supervised").is_dir():
            return cand
    raise CorpusError(f"{root}: not an OPUS-100 tree (no v1.0/supervised/ directory found)")


def read_opus100(root: str | os.PathLike, langs: list[str] | None = None, condition: str | None = None,
                 allow_langs: frozenset[str] = frozenset()) -> Corpus:
    """``opus-100-corpus/v1.0/{supervised,zero-shot}/<a>-<b>/opus.<a>-<b>-<split>.<lang>``."""
    base = _opus_base(Path(root))
    if langs:
        check_languages(langs, allow_langs, where="--langs")
    pair_splits: dict[Direction, dict[str, AlignedSplit]] = {}
    for kind in ("supervised", "zero-shot"):
        if not (base / kind).is_dir():
            continue
        for pair, pair_dir in _pair_dirs(base / kind, langs, allow_langs):
            if pair in pair_splits or pair.reverse() in pair_splits:
                raise CorpusError(f"pair {pair} appears twice under {base}")
            found = {}
            for split in ("train", "dev", "test"):
                files = {x: pair_dir / f"opus.{pair}-{split}.{x}" for x in (pair.src, pair.tgt)}
                present = [p.exists() for p in files.values()]
                if any(present) and not all(present):
                    lost = [str(p) for p in files.values() if not p.exists()]
                    raise CorpusError(f"{pair_dir}: split {split!r} lacks {', '.join(lost)}")
                if all(present):
                    found[canonical_split(split)] = _text_split(split, files, [pair, pair.reverse()])
            if kind == "zero-shot":
                found.pop("train", None)
            if found:
                pair_splits[pair] = found
    if not any("train" in s for s in pair_splits.values()):
        raise CorpusError(f"{base}: no supervised pair with a train split"
                          + (f" among languages {', '.join(langs)}" if langs else ""))
    return _pair_corpus("opus100", str(root), pair_splits, condition, langs)


# ---------------------------------------------------------------------------------------------
# Hugging Face parquet: a `translation: struct<a: string, b: string>` column, read through
# `datasets` in streaming mode (never the whole corpus in memory).

def _hf_split(name: str, pair: Direction, open_stream: Callable[[], object], n_rows: int | None,
              label: str) -> AlignedSplit:
    langs = (pair.src, pair.tgt)

    def read(size: int):
        first, chunk = 1, {x: [] for x in langs}
        for i, row in enumerate(open_stream()):
            tr = row.get("translation") if isinstance(row, dict) else None
            if not isinstance(tr, dict) or set(tr) != set(langs):
                got = sorted(tr) if isinstance(tr, dict) else type(tr).__name__
                raise CorpusError(f"{label}: row {i + 1}: expected a 'translation' struct with "
                                  f"fields {list(langs)}, got {got}")
            for x in langs:
                text = tr[x]
                chunk[x].append("" if text is None else str(text).strip())
            if len(chunk[langs[0]]) == size:
                yield first, chunk
                first, chunk = first + size, {x: [] for x in langs}
        if chunk[langs[0]]:
            yield first, chunk

    split = AlignedSplit(canonical_split(name), langs, [pair, pair.reverse()], n_rows, label, read)
    if split.n_lines is None:  # a hub dataset without split sizes in its card: count once
        split.n_lines = sum(len(c[langs[0]]) for _, c in read(8192))
    return split


def _parquet_fields(files: list[Path]) -> None:
    import pyarrow.parquet as pq
    for f in files:
        schema = pq.read_schema(f)
        if "translation" not in schema.names:
            raise CorpusError(f"{f}: no 'translation' column (columns: {', '.join(schema.names)})")


def read_parquet_dir(root: str | os.PathLike, langs: list[str] | None = None, condition: str | None = None,
                     allow_langs: frozenset[str] = frozenset()) -> Corpus:
    """Local files in the Hugging Face ``Helsinki-NLP/opus-100`` layout:
    ``<a>-<b>/{train,validation,test}-*.parquet``."""
    import datasets
    import pyarrow.parquet as pq
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"{root}: not a directory")
    pair_splits: dict[Direction, dict[str, AlignedSplit]] = {}
    for pair, pair_dir in _pair_dirs(root, langs, allow_langs):
        groups: dict[str, list[Path]] = {}
        for f in sorted(pair_dir.glob("*.parquet")):
            groups.setdefault(f.name.split("-")[0].split(".")[0], []).append(f)
        found = {}
        for split, files in groups.items():
            _parquet_fields(files)
            n_rows = sum(pq.read_metadata(f).num_rows for f in files)

            def open_stream(files=files):
                return datasets.load_dataset("parquet", data_files=[str(f) for f in files],
                                             split="train", streaming=True)
            found[canonical_split(split)] = _hf_split(split, pair, open_stream, n_rows, f"{pair_dir}/{split}-*.parquet")
        if found:
            pair_splits[pair] = found
    if not any("train" in s for s in pair_splits.values()):
        raise CorpusError(f"{root}: no <a>-<b>/train-*.parquet files found")
    return _pair_corpus("parquet", str(root), pair_splits, condition, langs)


def read_hf_dataset(name: str, pairs: list[str] | None = None, langs: list[str] | None = None,
                    condition: str | None = None, allow_langs: frozenset[str] = frozenset()) -> Corpus:
    """A dataset on the Hugging Face hub (``Helsinki-NLP/opus-100``) or a local clone of one,
    one config per pair, streamed: ``load_dataset(name, pair, split=..., streaming=True)``."""
    import datasets
    pair_names = pairs or datasets.get_dataset_config_names(name)
    pair_splits: dict[Direction, dict[str, AlignedSplit]] = {}
    for pair_name in pair_names:
        try:
            pair = Direction.parse(pair_name)
        except LanguageError as err:
            raise CorpusError(f"{name}: config {pair_name!r}: {err}") from None
        check_languages([pair.src, pair.tgt], allow_langs, where=f"{name} config {pair_name}")
        if langs and not (pair.src in langs and pair.tgt in langs):
            continue
        found = {}
        for split in datasets.get_dataset_split_names(name, pair_name):
            stream = datasets.load_dataset(name, pair_name, split=split, streaming=True)
            info = getattr(stream, "info", None)
            sizes = getattr(info, "splits", None) or {}
            n_rows = sizes[split].num_examples if split in sizes else None
            found[canonical_split(split)] = _hf_split(
                split, pair, lambda pn=pair_name, sp=split: datasets.load_dataset(name, pn, split=sp, streaming=True),
                n_rows, f"{name}[{pair_name}/{split}]")
        if found:
            pair_splits[pair] = found
    if not any("train" in s for s in pair_splits.values()):
        raise CorpusError(f"{name}: no pair with a train split")
    return _pair_corpus("hf", name, pair_splits, condition, langs)


def detect_format(path: str) -> str:
    """``opus100``, ``parquet`` or ``multiway``, from a corpus directory's layout."""
    p = Path(path)
    if not p.exists():
        raise CorpusError(f"{path}: no such directory (for a Hugging Face hub dataset use --format hf)")
    if any((c / "supervised").is_dir() for c in (p, p / "v1.0", p / "opus-100-corpus" / "v1.0")):
        return "opus100"
    if next(p.glob("*/*.parquet"), None) is not None:
        return "parquet"
    return "multiway"

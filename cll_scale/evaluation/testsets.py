"""Test sets as ``{direction: (sources, references)}``: from a shard directory's dev/test splits
(they keep the raw text) or straight from a corpus (multi-way ``{split}.{lang}`` or OPUS-100)."""
from __future__ import annotations

from pathlib import Path

from cll_scale.data.corpora import canonical_split, detect_format, read_multiway, read_opus100, split_names
from cll_scale.data.manifest import Manifest


def pairs_from_shards(shard_dir: str | Path, split: str, manifest: Manifest | None = None
                      ) -> dict[str, tuple[list[str], list[str]]]:
    """A dev/test split's raw text, every direction; ``manifest``: the shards' as the command
    loaded it (read from ``shard_dir`` without)."""
    m = manifest or Manifest.load(shard_dir)
    if split not in m.splits:
        raise ValueError(f"{shard_dir}: no split {split!r} (has {', '.join(m.splits)})")
    out: dict[str, tuple[list[str], list[str]]] = {}
    for direction in m.splits[split].directions():
        table = m.read_direction(shard_dir, split, direction)
        if "src_text" not in table.column_names:
            raise ValueError(f"{shard_dir}: split {split!r} is a training split without raw text; evaluate a "
                             f"dev/test split")
        out[direction] = (table.column("src_text").to_pylist(), table.column("tgt_text").to_pylist())
    return out


def pairs_from_corpus(path: str, split: str, languages: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Raw test text straight from a corpus (multi-way ``{split}.{lang}`` or OPUS-100 layout)."""
    fmt = detect_format(path)
    if fmt == "multiway":
        # valid / val / dev name one split: take whichever the corpus has files for.
        split = next((n for n in split_names(split) if any((Path(path) / f"{n}.{x}").exists() for x in languages)),
                     split)
        langs = [x for x in languages if (Path(path) / f"{split}.{x}").exists()]
        if not langs:
            have = sorted({f.name.rsplit(".", 1)[0] for f in Path(path).iterdir() if f.is_file() and "." in f.name})
            raise ValueError(f"{path}: no split {split!r} for languages {', '.join(languages)} (no file "
                             f"{split}.<lang>); splits there: {', '.join(have) or 'none'}")
        every = ",".join(f"{a}-{b}" for a in langs for b in langs if a != b)
        corpus = read_multiway(path, every, langs=langs, only_split=split)     # no train.<lang> needed
    elif fmt == "opus100":
        corpus = read_opus100(path, langs=languages)
    else:
        raise ValueError(f"{path}: evaluate {fmt} data through its shards (--data)")
    out: dict[str, tuple[list[str], list[str]]] = {}
    for s in corpus.splits:
        if s.name not in (split, canonical_split(split)):
            continue
        texts = {x: [] for x in s.langs}
        for _, chunk in s.read_chunks(8192):
            for x, lines in chunk.items():
                texts[x] += lines
        for d in s.directions:
            keep = [i for i, (a, b) in enumerate(zip(texts[d.src], texts[d.tgt])) if a and b]
            out[str(d)] = ([texts[d.src][i] for i in keep], [texts[d.tgt][i] for i in keep])
    if not out:
        raise ValueError(f"{path}: no split {split!r} for languages {', '.join(languages)}")
    return out

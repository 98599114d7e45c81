"""``manifest.json``: what a shard directory holds, written by ``cll-shards build`` and read by
everything downstream (stream, trainer, evaluation). The schema is defined here, once.

A shard directory::

    manifest.json
    spm.model                      joint SentencePiece model, <2xx> tags as control symbols
    <split>/<src>-<tgt>.<k>.arrow  Arrow IPC files, one direction each, record batches of
                                   ``block_rows`` rows (the last one may be shorter)
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa

from cll_scale.core.outputs import json_text, write_atomic
from cll_scale.core.jsonfiles import read_json_object
from cll_scale.data.languages import Direction

SCHEMA_VERSION = 2             # 2: max_length (version 1 called it max_tokens; read through upgrade_manifest)
MANIFEST = "manifest.json"
SUPERVISED, ZERO_SHOT, UNSEEN = "supervised", "zero-shot", "unseen"     # Manifest.kind


# May go in v0.3.0: manifests of schema version 1 called the shards' length filter max_tokens.
MANIFEST_RENAMED = {"max_tokens": "max_length"}


def upgrade_manifest(d: dict) -> dict:
    """A shard manifest in schema version 2."""
    if d.get("schema_version") != 1:
        return dict(d)
    return {**{MANIFEST_RENAMED.get(k, k): v for k, v in d.items()}, "schema_version": 2}


class ManifestError(ValueError):
    """A shard directory is missing, damaged, or does not match its manifest."""


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Shard:
    file: str            # relative to the shard directory
    direction: Direction # written "src-tgt"
    rows: int
    src_tokens: int      # subword tokens, without tag and eos
    tgt_tokens: int
    bytes: int
    sha256: str

    def __post_init__(self):
        self.direction = Direction.parse(self.direction)


@dataclass
class SplitInfo:
    role: str                                    # "train", "valid" or "test"
    shards: list[Shard] = field(default_factory=list)
    # direction -> reason -> number of input lines not written (never dropped silently)
    filtered: dict[str, dict[str, int]] = field(default_factory=dict)

    def directions(self) -> list[Direction]:
        return sorted({s.direction for s in self.shards})

    def rows(self, direction: str | None = None) -> int:
        return sum(s.rows for s in self.shards if direction in (None, s.direction))


@dataclass
class TokenizerInfo:
    file: str
    sha256: str
    vocab_size: int
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int
    lang_tag_ids: dict[str, int]     # language -> id of its <2xx> control symbol


@dataclass
class Manifest:
    languages: list[str]
    central_language: str | None
    supervised: list[Direction]
    zero_shot: list[Direction]
    tokenizer: TokenizerInfo
    splits: dict[str, SplitInfo]
    block_rows: int
    max_length: int                 # training pairs longer than this many subwords were filtered out
    source: dict = field(default_factory=dict)
    created_by: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        self.supervised = [Direction.parse(d) for d in self.supervised]
        self.zero_shot = [Direction.parse(d) for d in self.zero_shot]

    # -- identity ---------------------------------------------------------------------------
    def lang_id(self, code: str) -> int:
        try:
            return self.languages.index(code)
        except ValueError:
            raise ManifestError(f"unknown language {code!r}; this data has "
                                f"{', '.join(self.languages)}") from None

    # -- reading shards: the one place that opens the Arrow files --------------------------------
    @staticmethod
    def open_shard(directory: str | os.PathLike, file: str) -> pa.RecordBatchFileReader:
        """One shard file: record batch k holds rows k·block_rows onwards. Read through plain file
        reads, not a memory map: mapped pages count as the reader's memory and a map was slower
        for the stream's block reads (bench_stream: 465K against 640K rows/s, +90 MB at 10×)."""
        return pa.ipc.open_file(pa.OSFile(str(Path(directory) / file)))

    def read_direction(self, directory: str | os.PathLike, split: str, direction: str | Direction,
                       columns: list[str] | None = None) -> pa.Table:
        """Every row of one direction of a split, its shards in order."""
        direction = str(direction)
        if split not in self.splits or direction not in self.splits[split].directions():
            have = ", ".join(self.splits[split].directions()) if split in self.splits else f"no split {split!r}"
            raise ManifestError(f"{directory}: no direction {direction} in split {split!r} ({have})")
        tables = []
        for shard in (s for s in self.splits[split].shards if s.direction == direction):
            table = self.open_shard(directory, shard.file).read_all()
            tables.append(table.select(columns) if columns else table)
        return pa.concat_tables(tables)

    def is_zero_shot(self, direction: str | Direction) -> bool:
        return str(direction) in self.zero_shot

    def kind(self, direction: str | Direction) -> str:
        """What the training data made of ``direction``: ``supervised`` (trained on), ``zero-shot``
        (declared, never trained on) or ``unseen``. The one place a direction's kind is decided."""
        name = str(direction)
        return SUPERVISED if name in self.supervised else ZERO_SHOT if name in self.zero_shot else UNSEEN

    # -- (de)serialisation ------------------------------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        d["directions"] = {"supervised": d.pop("supervised"), "zero_shot": d.pop("zero_shot")}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Manifest":
        d = upgrade_manifest(d)
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ManifestError(f"manifest schema version {version!r} is not supported "
                                f"(this cll-scale reads versions 1 and {SCHEMA_VERSION})")
        dirs = d.pop("directions")
        splits = {name: SplitInfo(role=s["role"], shards=[Shard(**x) for x in s["shards"]],
                                  filtered=s.get("filtered", {}))
                  for name, s in d.pop("splits").items()}
        return cls(supervised=dirs["supervised"], zero_shot=dirs["zero_shot"],
                   tokenizer=TokenizerInfo(**d.pop("tokenizer")), splits=splits, **d)

    def save(self, directory: str | os.PathLike) -> None:
        write_atomic(Path(directory) / MANIFEST, json_text(self.to_json(), indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Manifest":
        path = Path(directory) / MANIFEST
        if not path.is_file():
            raise ManifestError(f"{directory}: no {MANIFEST} (not a shard directory built by cll-shards, "
                                f"or an interrupted build)")
        try:
            d = read_json_object(path, "a shard directory's manifest")   # `[1, 2]` or `null` is no manifest
        except ValueError as err:
            raise ManifestError(f"{path}: damaged manifest ({err})") from None
        try:
            return cls.from_json(d)
        except (KeyError, TypeError, AttributeError) as err:
            raise ManifestError(f"{path}: damaged manifest ({type(err).__name__}: {err})") from None

    # -- integrity --------------------------------------------------------------------------
    def fingerprint(self, split: str) -> str:
        """One hash for a split's content (from the shards' sha256): tells a checkpoint whether
        it resumes on the data it was trained on."""
        shards = sorted((s.file, s.sha256) for s in self.splits[split].shards) if split in self.splits else []
        return hashlib.sha256(json_text(shards).encode()).hexdigest()


    def check_files(self, directory: str | os.PathLike, full: bool = True,
                    splits: list[str] | None = None, part: tuple[int, int] = (0, 1)) -> list[str]:
        """Return a list of problems (empty if all is well). ``full`` hashes every byte;
        otherwise only presence and sizes are checked (cheap enough for every start).

        ``part=(i, n)`` hashes only the tokenizer (``i == 0``) and every ``n``-th shard from the
        ``i``-th: the ``n`` processes of one node share the hashing of that node's files, each
        still checking every file's presence and size."""
        directory = Path(directory)
        i, n = part
        if not 0 <= i < n:
            raise ValueError(f"part {i} of {n}")
        problems = []
        tok = directory / self.tokenizer.file
        if not tok.is_file():
            problems.append(f"{tok}: tokenizer missing")
        elif full and i == 0 and sha256_file(tok) != self.tokenizer.sha256:
            problems.append(f"{tok}: sha256 differs from the manifest (tokenizer changed or damaged)")
        k = 0
        for name, split in self.splits.items():
            if splits is not None and name not in splits:
                continue
            for shard in split.shards:
                path = directory / shard.file
                mine, k = k % n == i, k + 1
                if not path.is_file():
                    problems.append(f"{path}: shard missing")
                elif path.stat().st_size != shard.bytes:
                    problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {shard.bytes} (truncated?)")
                elif full and mine and sha256_file(path) != shard.sha256:
                    problems.append(f"{path}: sha256 differs from the manifest (damaged shard)")
        return problems

    def verify(self, directory: str | os.PathLike, full: bool = True, splits: list[str] | None = None,
               part: tuple[int, int] = (0, 1)) -> None:
        problems = self.check_files(directory, full, splits, part)
        if problems:
            raise ManifestError("shard directory does not match its manifest:\n  " + "\n  ".join(problems))

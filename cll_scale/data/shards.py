"""``cll-shards build``: corpus → SentencePiece model + Arrow shards + manifest.

Everything is written into a hidden temporary directory beside the output and renamed into
place at the very end, so an interrupted or failed build never looks complete, and
``--overwrite`` replaces an old build only once the new one is whole.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import sentencepiece as spm
from tqdm.auto import tqdm

from cll_scale import __version__
from cll_scale.core.cli import non_negative_int
from cll_scale.core.clock import StageClock
from cll_scale.core.settings import REQUIRED, setting
from cll_scale.core.outputs import OutputError, atomic_dir, check_output
from cll_scale.data.corpora import Corpus, CorpusError
from cll_scale.data.languages import Direction, lang_tag
from cll_scale.data.manifest import MANIFEST, Manifest, ManifestError, Shard, SplitInfo, TokenizerInfo, sha256_file
from cll_scale.data.tokenizer import check_sentencepiece, train_sentencepiece

ID_LIST = pa.list_(pa.int32())


@dataclass
class BuildConfig:
    """What ``cll-shards build`` writes; the help texts are its flags (cll_scale.core.cli.add_config_arguments)."""
    out_dir: str = setting(REQUIRED, "output shard directory (must not exist unless --overwrite)", flag="--out")
    overwrite: bool = setting(False, "replace an existing output directory")
    spm_model: str | None = setting(None, "reuse this SentencePiece model instead of learning one")
    vocab_size: int = setting(8000, "SentencePiece vocabulary size")
    # on 200k lines, 2 threads: bpe 2-4 s, unigram 45-85 s
    model_type: str = setting("bpe", "SentencePiece model type", flag="--spm-type", choices=("bpe", "unigram"))
    spm_temperature: float = setting(5.0, "language balancing for the vocabulary")
    spm_sentences: int = setting(1_000_000, "sampled sentences to learn from")
    character_coverage: float = setting(0.9995, "SentencePiece character coverage")
    max_length: int = setting(256, "filter training pairs longer than this many subwords (counted)")
    block_rows: int = setting(1024, "rows per Arrow record batch: the unit of shuffling")
    shard_rows: int = setting(1_000_000, "rows per shard file at most")
    compression: str | None = setting("zstd", "Arrow IPC compression", choices=("zstd", "lz4", "none"))
    seed: int = setting(1, "seed of SentencePiece's sample", type=non_negative_int)
    threads: int = setting(2, "SentencePiece training threads")

    def __post_init__(self):
        if self.block_rows < 1 or self.shard_rows < self.block_rows:
            raise ValueError("need 1 <= block_rows <= shard_rows")
        if self.max_length < 1:
            raise ValueError("max_length must be >= 1")
        # SentencePiece's own refusals of these come back without a reason (or after reading the
        # whole corpus): each is checked here, with what it means.
        if not 0.0 < self.character_coverage <= 1.0:
            raise ValueError(f"--character-coverage {self.character_coverage:g}: the share of the text's characters "
                             f"the vocabulary covers, in (0, 1] (0.9995 for Latin scripts, 1.0 for small alphabets)")
        if self.threads < 1:
            raise ValueError(f"--threads {self.threads}: SentencePiece trains with at least 1 thread")
        if self.vocab_size < 1:
            raise ValueError(f"--vocab-size {self.vocab_size}: the number of subwords to learn, at least the 256 byte "
                             f"pieces, the 4 special ids and a tag per language plus the text's characters")
        if self.spm_sentences < 1 or not self.spm_temperature > 0:
            raise ValueError(f"--spm-sentences ({self.spm_sentences}) must be >= 1 and --spm-temperature "
                             f"({self.spm_temperature:g}) > 0")
        if self.compression in ("none", ""):
            self.compression = None


def split_role(name: str) -> str:
    return name if name in ("train", "valid") else "test"


class _DirectionWriter:
    """Writes one direction of one split as Arrow IPC files of ``block_rows``-row batches."""

    def __init__(self, root: Path, split: str, direction: Direction, cfg: BuildConfig, with_text: bool,
                 prefix: str = ""):
        self.root, self.split, self.direction, self.cfg, self.prefix = root, split, direction, cfg, prefix
        fields = [("line", pa.int64()), ("src_ids", ID_LIST), ("tgt_ids", ID_LIST)]
        if with_text:
            fields += [("src_text", pa.string()), ("tgt_text", pa.string())]
        self.schema = pa.schema(fields)
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.shards: list[Shard] = []
        self.writer = None
        self.rows_in_file = 0
        self.file_tokens = [0, 0]

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self.pending.append(batch)
            self.pending_rows += batch.num_rows
        while self.pending_rows >= self.cfg.block_rows:
            self._write_block(self.cfg.block_rows)

    def close(self) -> list[Shard]:
        if self.pending_rows:
            self._write_block(self.pending_rows)
        self._close_file()
        return self.shards

    def _write_block(self, n: int) -> None:
        if self.writer is None:
            rel = f"{self.split}/{self.prefix}{self.direction}.{len(self.shards):05d}.arrow"
            self.path = self.root / rel
            self.rel = rel
            self.path.parent.mkdir(parents=True, exist_ok=True)
            opts = pa.ipc.IpcWriteOptions(compression=self.cfg.compression)
            self.writer = pa.ipc.new_file(str(self.path), self.schema, options=opts)
        pending = pa.Table.from_batches(self.pending, schema=self.schema)
        block = pending.slice(0, n).combine_chunks().to_batches()[0]
        self.pending = pending.slice(n).to_batches()
        self.pending_rows -= n
        self.writer.write_batch(block)
        self.rows_in_file += n
        for i, name in enumerate(("src_ids", "tgt_ids")):
            offsets = block.column(name).offsets
            self.file_tokens[i] += offsets[-1].as_py() - offsets[0].as_py()
        if self.rows_in_file + self.cfg.block_rows > self.cfg.shard_rows:
            self._close_file()

    def _close_file(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        self.shards.append(Shard(file=self.rel, direction=str(self.direction), rows=self.rows_in_file,
                                 src_tokens=self.file_tokens[0], tgt_tokens=self.file_tokens[1],
                                 bytes=self.path.stat().st_size, sha256=sha256_file(self.path)))
        self.writer, self.rows_in_file, self.file_tokens = None, 0, [0, 0]


def id_lists(ids: list[list[int]]) -> pa.ListArray:
    """SentencePiece's id lists as an Arrow list array, through flat numpy buffers: measured on
    8,192 sentences, 4 ms against 226 ms for ``pa.array`` on the nested Python lists (whose
    per-integer conversion cost four times the encoding itself)."""
    lens = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    values = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


class _ChunkColumns:
    """One chunk of a split as Arrow columns per language, shared by the split's directions."""

    def __init__(self, first: int, chunk: dict[str, list[str]], encoded: dict[str, list[list[int]]],
                 langs: list[str], with_text: bool, max_length: int):
        self.n = len(next(iter(chunk.values())))
        self.lines = pa.array(np.arange(first, first + self.n, dtype=np.int64))
        self.ids = {x: id_lists(encoded[x]) for x in langs}
        self.texts = {x: pa.array(chunk[x], pa.string()) for x in langs} if with_text else None
        self.empty = {x: np.array([not t for t in chunk[x]], dtype=bool) for x in langs}
        self.long = {x: np.diff(self.ids[x].offsets.to_numpy()) > max_length for x in langs}

    def direction(self, d: Direction, schema: pa.Schema, counts: dict[str, int], drop_long: bool) -> pa.RecordBatch:
        """The rows of direction ``d`` without the empty ones (and the over-long ones if
        ``drop_long``), each counted in ``counts``."""
        is_empty = self.empty[d.src] | self.empty[d.tgt]
        is_long = (self.long[d.src] | self.long[d.tgt]) & ~is_empty if drop_long else np.zeros(self.n, bool)
        counts["empty"] += int(is_empty.sum())
        counts["too_long"] += int(is_long.sum())
        cols = [self.lines, self.ids[d.src], self.ids[d.tgt]]
        if self.texts is not None:
            cols += [self.texts[d.src], self.texts[d.tgt]]
        drop = is_empty | is_long
        if drop.any():
            keep = pa.array(np.flatnonzero(~drop))
            cols = [c.take(keep) for c in cols]
        return pa.record_batch(cols, schema=schema)


def _write_split(split, sp: spm.SentencePieceProcessor, root: Path, cfg: BuildConfig,
                 info: SplitInfo, clock: StageClock) -> None:
    """Encode one split and write each of its directions; ``clock`` gets the stages ``read`` (the
    corpus' reader), ``encode`` (SentencePiece), ``filter`` (id lists, empty and over-long rows,
    columns) and ``write`` (Arrow blocks, compression, files, their sha256)."""
    role = split_role(split.name)
    with_text = role != "train"
    writers = {d: _DirectionWriter(root, split.name, d, cfg, with_text) for d in split.directions}
    filtered = {str(d): info.filtered.setdefault(str(d), {"empty": 0, "too_long": 0}) for d in split.directions}
    bar = tqdm(total=split.n_lines, unit="lines", desc=f"{split.name} {'/'.join(split.langs)}", leave=False,
               disable=None)
    for first, chunk in clock.iterate("read", split.read_chunks(8192)):
        with clock.stage("encode"):
            encoded = {x: sp.encode(chunk[x], num_threads=cfg.threads) for x in split.langs}
        with clock.stage("filter"):
            columns = _ChunkColumns(first, chunk, encoded, split.langs, with_text, cfg.max_length)
        for d, writer in writers.items():
            with clock.stage("filter"):
                # Test sets keep over-long sentences (dropping them would change BLEU's test set);
                # translation truncates them with a warning instead.
                batch = columns.direction(d, writer.schema, filtered[str(d)], drop_long=role == "train")
            with clock.stage("write"):
                writer.add(batch)
        bar.update(columns.n)
    bar.close()
    with clock.stage("write"):
        for writer in writers.values():
            info.shards.extend(writer.close())


def shard_dir_strangers(path: Path) -> list[str] | None:
    """What in ``path`` a shard build did not write (``None``: no manifest, not a shard build).
    A build's files are its manifest, the tokenizer and the shards the manifest lists."""
    if not (path / MANIFEST).is_file():
        return None
    try:
        manifest = Manifest.load(path)
    except ManifestError as err:
        # Damaged, it cannot say which files are the build's: nothing is replaced, and the
        # refusal names the file rather than calling a build no shard directory.
        raise OutputError(f"--overwrite refused: {err}; so it is not known what in {path} the build "
                          f"wrote: remove it yourself or choose another --out") from None
    tokenizer = manifest.tokenizer.file      # SentencePiece writes its .vocab beside the model
    ours = {MANIFEST, tokenizer, str(Path(tokenizer).with_suffix(".vocab"))} | {s.file for split in manifest.splits.values() for s in split.shards}
    ours |= {str(Path(f).parent) for f in ours} - {"."}
    return sorted(rel for rel in (str(p.relative_to(path)) for p in path.rglob("*")) if rel not in ours)


# The build settings a manifest records, as (its key, BuildConfig's field, the flag that sets it).
RECORDED_SETTINGS = (("vocab_size", "vocab_size", "--vocab-size"), ("model_type", "model_type", "--spm-type"),
                     ("temperature", "spm_temperature", "--spm-temperature"),
                     ("sentences", "spm_sentences", "--spm-sentences"), ("seed", "seed", "--seed"))


def corpus_location(path: str) -> str:
    """A corpus as a manifest names it: a local folder by its absolute path (what a later reuse
    compares), anything else (a hub dataset's name) as given."""
    return os.path.realpath(path) if os.path.exists(path) else path


def kept_build(corpus: Corpus, cfg: BuildConfig) -> list[str] | None:
    """Whether ``cfg.out_dir`` already holds the build of ``corpus`` that ``cfg`` asks for: the one
    check of every command that reuses a shard directory by its name (``cll-shards build --reuse``,
    make quickstart, cll-repro, scripts/results.py). None: no build there. A build of another
    corpus, or of other languages, language order or directions (``square`` named the one-way
    4-cycle before 2026-12-05) is refused: it would train and report another condition under this
    one's name. Otherwise the build is kept, and the returned list names the settings it was built
    with that ``cfg`` would not use (for the caller to say so; empty: the same build)."""
    out = Path(cfg.out_dir)
    if not (out / MANIFEST).exists():
        return None
    have = Manifest.load(out)
    differ = []
    if have.languages != corpus.languages or have.central_language != corpus.central:
        differ.append(f"languages {','.join(have.languages)} (central {have.central_language or 'none'}), "
                      f"not {','.join(corpus.languages)} (central {corpus.central or 'none'})")
    for kind, built, wanted in (("supervised", have.supervised, corpus.supervised),
                                ("zero-shot", have.zero_shot, corpus.zero_shot)):
        if sorted(map(str, built)) != sorted(map(str, wanted)):
            differ.append(f"{kind} {','.join(map(str, built)) or 'none'}, not {','.join(map(str, wanted)) or 'none'}")
    source = have.source.get("path")
    if source is None or corpus_location(source) != corpus_location(corpus.path):
        differ.append(f"the corpus {source}, not {corpus.path}")
    if differ:
        raise ManifestError(f"{out} holds shards of another build ({'; '.join(differ)}): it cannot stand for "
                            f"condition {corpus.condition} of {corpus.path}; move it away, or build into another "
                            f"directory")
    spm = have.source.get("spm")
    if cfg.spm_model:
        settings = [] if spm == f"given: {cfg.spm_model}" else [f"the SentencePiece model {spm}"]
    else:
        spm = spm if isinstance(spm, dict) else {}
        settings = [f"{flag} {spm[key]}" for key, name, flag in RECORDED_SETTINGS
                    if key in spm and spm[key] != getattr(cfg, name)]
    settings += [f"{flag} {getattr(have, name)}" for name, flag in (("max_length", "--max-length"),
                                                                     ("block_rows", "--block-rows"))
                 if getattr(have, name) != getattr(cfg, name)]
    return settings


def build_shards(corpus: Corpus, cfg: BuildConfig, clock: StageClock | None = None) -> Manifest:
    """Build ``corpus`` into ``cfg.out_dir`` (see :func:`shard_output` for what is refused).

    ``clock`` (cll_scale.core.clock) gets the build's stages: SentencePiece's (``spm_read``,
    ``spm_sample``, ``spm_train``; none with a given model), the encode pass's (``read``,
    ``encode``, ``filter``, ``write``) and ``finish``, the rest of the build's wall time (checks,
    tokenizer hash, manifest, the rename into place)."""
    clock = clock or StageClock()
    with shard_output(cfg, corpus.path, clock) as tmp:
        return build_into(corpus, cfg, tmp, clock)


@contextlib.contextmanager
def shard_output(cfg: BuildConfig, input_path: str, clock: StageClock) -> Iterator[Path]:
    """The temporary directory a build writes, renamed to ``cfg.out_dir`` when the block succeeds.
    Refused before the block, so before a caller reads a large corpus in it: an existing output
    without ``overwrite``, or one that is not a shard build holding nothing else; an output
    overlapping the input; an output that cannot be written (named by ``--out`` as given).
    ``clock`` gets ``finish``: the block's wall time that no stage counted."""
    start, before = clock.timer(), clock.total()
    out = check_output(cfg.out_dir, inputs=[input_path], overwrite=cfg.overwrite, kind="shard directory",
                       strangers=shard_dir_strangers)
    made = [p for p in out.parents if not p.exists()]      # deepest first: the folders atomic_dir will make
    try:
        with atomic_dir(out, replace=True, name=f"--out {cfg.out_dir}") as tmp:
            yield tmp
    except BaseException:
        for folder in made:         # a corpus refused in the block leaves no empty folders behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    clock.add("finish", clock.timer() - start - (clock.total() - before))


def build_into(corpus: Corpus, cfg: BuildConfig, tmp: Path, clock: StageClock) -> Manifest:
    if cfg.spm_model:
        check_sentencepiece(cfg.spm_model, corpus.languages)
        shutil.copyfile(cfg.spm_model, tmp / "spm.model")
        model_path = tmp / "spm.model"
    else:
        model_path = train_sentencepiece(corpus, tmp / "spm", cfg.vocab_size, cfg.model_type,
                                         cfg.spm_temperature, cfg.spm_sentences,
                                         cfg.character_coverage, cfg.seed, cfg.threads, clock)
    sp = check_sentencepiece(model_path, corpus.languages)
    splits: dict[str, SplitInfo] = {}
    for split in corpus.splits:
        info = splits.setdefault(split.name, SplitInfo(role=split_role(split.name)))
        _write_split(split, sp, tmp, cfg, info, clock)
    for info in splits.values():
        info.shards.sort(key=lambda s: s.file)
    tokenizer = TokenizerInfo(
        file=model_path.name, sha256=sha256_file(model_path), vocab_size=sp.get_piece_size(),
        pad_id=sp.pad_id(), unk_id=sp.unk_id(), bos_id=sp.bos_id(), eos_id=sp.eos_id(),
        lang_tag_ids={x: sp.piece_to_id(lang_tag(x)) for x in corpus.languages})
    manifest = Manifest(
        languages=corpus.languages, central_language=corpus.central,
        supervised=[str(d) for d in corpus.supervised], zero_shot=[str(d) for d in corpus.zero_shot],
        tokenizer=tokenizer, splits=dict(sorted(splits.items())), block_rows=cfg.block_rows,
        max_length=cfg.max_length,
        source={"format": corpus.fmt, "path": corpus_location(corpus.path), "condition": corpus.condition,
                "spm": "given: " + str(cfg.spm_model) if cfg.spm_model else
                {"vocab_size": cfg.vocab_size, "model_type": cfg.model_type,
                 "temperature": cfg.spm_temperature, "sentences": cfg.spm_sentences, "seed": cfg.seed}},
        created_by=f"cll-scale {__version__}")
    if not manifest.splits.get("train") or not manifest.splits["train"].shards:
        raise CorpusError("no training pair survived filtering: nothing to write "
                          f"(filtered: {manifest.splits.get('train') and manifest.splits['train'].filtered})")
    manifest.save(tmp)
    return manifest


def write_direction(root: Path, split: str, direction: Direction, columns: dict[str, list], cfg: BuildConfig,
                    prefix: str = "") -> list[Shard]:
    """Write already-tokenised rows (``line``, ``src_ids``, ``tgt_ids`` [, texts]) of one
    direction as shards under ``root`` — for data made by the system itself (back-translation)."""
    writer = _DirectionWriter(Path(root), split, direction, cfg, with_text="src_text" in columns, prefix=prefix)
    arrays = {name: id_lists(columns[name]) if name.endswith("_ids") else pa.array(columns[name], field.type)
              for name, field in zip(writer.schema.names, writer.schema)}
    writer.add(pa.record_batch(list(arrays.values()), schema=writer.schema))
    return writer.close()


def link_shards(manifest: Manifest, sources: list[tuple[Path, list[Shard]]], out: Path, spm_model: Path) -> None:
    """Finish a shard directory in ``out`` (being built, not yet renamed into place) whose
    manifest lists shards of other directories: hard links where the file system allows (no
    copy, no extra disk), copies otherwise. ``sources`` pairs a directory with shards of it
    that ``manifest`` lists under the same file names."""
    for src_dir, shards in sources:
        for shard in shards:
            dst = out / shard.file
            if dst.exists():
                raise FileExistsError(f"{dst}: two sources provide the same shard file")
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src_dir / shard.file, dst)
            except OSError:
                shutil.copy2(src_dir / shard.file, dst)
    if Path(spm_model).resolve() != (out / manifest.tokenizer.file).resolve():
        shutil.copyfile(spm_model, out / manifest.tokenizer.file)
    manifest.verify(out, full=False)
    manifest.save(out)

"""Extend a trained joint SentencePiece BPE model to a new language (paper §4.4).

A BPE model is learned on the new language alone and its pieces are appended to the old model:
old pieces keep their ids (so a trained embedding table stays valid and only grows), and the new
pieces get scores below every old piece, so that SentencePiece's greedy BPE encoder still makes
all old merges first. That alone does not guarantee old-language text is segmented as before: once
no old merge is left, a new piece may join two old pieces the old model left apart. Such pieces are
found on sample text of the old languages (``keep_texts``) and dropped.
"""
from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

from cll_scale.core.outputs import write_atomic
from cll_scale.data.languages import check_language, lang_tag

NORMAL, CONTROL = pb.ModelProto.SentencePiece.NORMAL, pb.ModelProto.SentencePiece.CONTROL
# SentencePiece rejects a vocabulary the text cannot fill and names the largest size that works.
_TOO_HIGH = re.compile(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)")


class ExtendError(ValueError):
    """The model cannot be extended with this input."""


@dataclass(frozen=True)
class ExtendResult:
    old_size: int          # pieces in the old model; ids below this are unchanged
    new_size: int          # pieces in the extended model
    added: int             # learned pieces appended (the language tag not counted)
    dropped: list[str]     # learned pieces left out because they changed old-language segmentation
    tag_id: int            # id of the control symbol <2xx> for the new language


def extend_sentencepiece(old_model: str | os.PathLike, new_lang: str, new_texts: list[str],
                         out_path: str | os.PathLike, keep_texts: list[str], vocab_size: int = 2000,
                         seed: int = 1, threads: int = 1) -> ExtendResult:
    """Write to ``out_path`` the old model plus the control symbol ``<2new_lang>`` plus the pieces of
    a ``vocab_size`` BPE model learned on ``new_texts`` (bytes and specials included; smaller if the
    text cannot fill it) that the old model lacks, less those that would change how a text of
    ``keep_texts`` (old-language sample) is encoded: each encodes to the same ids as before."""
    check_language(new_lang, where="new language")
    texts = [t.replace("\n", " ").strip() for t in new_texts]
    texts = [t for t in texts if t]
    if not texts:
        raise ExtendError(f"no text to learn {new_lang!r} pieces from: every line is empty")
    old = _load(Path(old_model))
    tag = lang_tag(new_lang)
    old_ids = {p.piece: i for i, p in enumerate(old.pieces)}
    if tag in old_ids and old.pieces[old_ids[tag]].type != CONTROL:
        raise ExtendError(f"{old_model}: {tag} is a piece of the old model but not a control symbol")
    learned = _learn_bpe(texts, old, vocab_size, seed, threads)
    candidates = _below_old_scores(old, learned, skip=set(old_ids) | {tag})
    kept, dropped = _keep_old_segmentation(old, tag, candidates, keep_texts, threads)
    model = _assemble(old, tag, kept)
    write_atomic(out_path, model.SerializeToString())
    return ExtendResult(old_size=len(old.pieces), new_size=len(model.pieces), added=len(kept),
                        dropped=dropped, tag_id=old_ids.get(tag, len(old.pieces)))


def _load(path: Path) -> pb.ModelProto:
    model = pb.ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except OSError as err:
        raise ExtendError(f"{path}: cannot read the SentencePiece model ({err.strerror})") from None
    except Exception:  # protobuf's DecodeError has no stable import path across versions
        raise ExtendError(f"{path}: not a SentencePiece model") from None
    if not model.pieces:   # an empty file parses as an empty model
        raise ExtendError(f"{path}: not a SentencePiece model (no pieces)")
    if model.trainer_spec.model_type != pb.TrainerSpec.BPE:
        raise ExtendError(f"{path}: only a BPE model can be extended by appending pieces")
    return model


def _learn_bpe(texts: list[str], old: pb.ModelProto, vocab_size: int, seed: int, threads: int) -> pb.ModelProto:
    """A BPE model of the new language, cut into pieces the way the old model cuts text."""
    spec, norm = old.trainer_spec, old.normalizer_spec
    options = dict(
        model_type="bpe", character_coverage=spec.character_coverage, byte_fallback=spec.byte_fallback,
        normalization_rule_name=norm.name, add_dummy_prefix=norm.add_dummy_prefix,
        remove_extra_whitespaces=norm.remove_extra_whitespaces, split_by_whitespace=spec.split_by_whitespace,
        split_by_unicode_script=spec.split_by_unicode_script, split_by_number=spec.split_by_number,
        split_digits=spec.split_digits, treat_whitespace_as_suffix=spec.treat_whitespace_as_suffix,
        allow_whitespace_only_pieces=spec.allow_whitespace_only_pieces,
        max_sentencepiece_length=spec.max_sentencepiece_length, max_sentence_length=spec.max_sentence_length,
        input_sentence_size=0, shuffle_input_sentence=True, num_threads=threads, minloglevel=2)
    size = vocab_size
    for _ in range(3):   # the size SentencePiece names should work at once; never loop forever
        buf = io.BytesIO()
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=buf,
                                           vocab_size=size, **options)
        except RuntimeError as err:
            fits = _TOO_HIGH.search(str(err))
            if fits is None or int(fits.group(1)) >= size:
                # Its own message names trainer options (character_coverage…) that our commands
                # do not have: say what the user can change instead.
                advice = ("its text has more distinct characters than that: raise --vocab-size"
                          if "required_chars" in str(err) else "lower --vocab-size or give more lines (--max-pairs)")
                raise ExtendError(f"--vocab-size {vocab_size}: SentencePiece could not learn {size} pieces from "
                                  f"the new language's {len(texts)} training lines; {advice}") from None
            size = int(fits.group(1))
            continue
        learned = pb.ModelProto()
        learned.ParseFromString(buf.getvalue())
        return learned
    raise ExtendError(f"SentencePiece could not settle on a vocabulary size for {len(texts)} lines")


def _below_old_scores(old: pb.ModelProto, learned: pb.ModelProto, skip: set[str]) -> list[tuple[str, float]]:
    """The learned NORMAL pieces the old model lacks, rescored so that each ranks below every old
    piece (old merges win) while their order among themselves is kept (learned merge priority)."""
    floor = min((p.score for p in old.pieces if p.type == NORMAL), default=0.0)
    new = [p for p in learned.pieces if p.type == NORMAL and p.piece not in skip]
    if not new:
        return []
    top = max(p.score for p in new)
    return [(p.piece, floor - 1.0 + (p.score - top)) for p in new]


def _assemble(old: pb.ModelProto, tag: str, pieces: list[tuple[str, float]]) -> pb.ModelProto:
    model = pb.ModelProto()
    model.CopyFrom(old)
    if tag not in {p.piece for p in old.pieces}:
        model.pieces.add(piece=tag, score=0.0, type=CONTROL)
        model.trainer_spec.control_symbols.append(tag)
    for piece, score in pieces:
        model.pieces.add(piece=piece, score=score, type=NORMAL)
    model.trainer_spec.vocab_size = len(model.pieces)
    return model


def _keep_old_segmentation(old: pb.ModelProto, tag: str, candidates: list[tuple[str, float]],
                           keep_texts: list[str], threads: int) -> tuple[list[tuple[str, float]], list[str]]:
    """Drop candidates until every keep_text encodes as with the old model; return (kept, dropped)."""
    base = spm.SentencePieceProcessor(model_proto=old.SerializeToString())
    want = base.encode(list(keep_texts), num_threads=threads)
    # Old merges all happen before any new one, so a text whose segmentation did not change used
    # no new piece, and dropping pieces cannot change it later: only differing texts are re-encoded.
    todo = list(range(len(want)))
    kept, dropped = list(candidates), []
    while todo:
        model = _assemble(old, tag, kept)
        first_new = len(model.pieces) - len(kept)
        sp = spm.SentencePieceProcessor(model_proto=model.SerializeToString())
        got = sp.encode([keep_texts[i] for i in todo], num_threads=threads)
        changed = [(i, ids) for i, ids in zip(todo, got) if ids != want[i]]
        index = {piece: j for j, (piece, _) in enumerate(kept)}
        culprits: set[int] = set()
        for _, ids in changed:
            culprits |= _culprits(ids, first_new, index, sp)
        if changed and not culprits:  # cannot happen, by the argument above; never loop forever
            raise AssertionError(f"segmentation of {keep_texts[changed[0][0]]!r} changed without a new piece")
        dropped += [kept[j][0] for j in sorted(culprits)]
        kept = [c for j, c in enumerate(kept) if j not in culprits]
        todo = [i for i, _ in changed]
    return kept, dropped


def _culprits(ids: list[int], first_new: int, index: dict[str, int], sp: spm.SentencePieceProcessor) -> set[int]:
    """Positions in ``kept`` of the new pieces to blame for one changed segmentation."""
    direct = {i - first_new for i in ids if i >= first_new}
    if direct:
        return direct
    # A new piece can also be merged away into an old one. Every intermediate BPE symbol lies inside
    # one output piece, so the new pieces inside the output pieces cover it.
    inside = set()
    for piece in (sp.id_to_piece(i) for i in ids if not sp.is_byte(i)):
        for a in range(len(piece)):
            inside |= {index[piece[a:b]] for b in range(a + 1, len(piece) + 1) if piece[a:b] in index}
    return inside

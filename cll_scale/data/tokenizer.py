"""Joint SentencePiece model for all languages of a corpus.

Trained on *monolingual* text of the training splits, each language sampled with temperature
``T`` (share ∝ n_l^(1/T)) so that a large central language does not crowd the others out of the
vocabulary. Target-language tags ``<2xx>`` are declared as control symbols: never parsed from
text (user-defined symbols would be split off typed text and waste tokens), inserted by id,
dropped by ``decode``.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import sentencepiece as spm
from tqdm.auto import tqdm

from cll_scale.core.clock import StageClock
from cll_scale.data.corpora import Corpus, CorpusError
from cll_scale.data.languages import lang_tag

# Special ids fixed across every model we build: pad must exist (batches are padded) and sit at 0.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def language_sample_rates(counts: dict[str, int], total: int, temperature: float) -> dict[str, float]:
    """Copies per input line for each language so that language l gets ``total * q_l`` lines,
    ``q_l ∝ (n_l / N)^(1/T)``. A rate > 1 repeats lines of a small language."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    n = np.array([counts[x] for x in counts], dtype=np.float64)
    if n.sum() == 0:
        raise CorpusError("no training text to learn a SentencePiece model from")
    q = (n / n.sum()) ** (1.0 / temperature)
    q /= q.sum()
    return {x: float(total * q[i] / n[i]) if n[i] else 0.0 for i, x in enumerate(counts)}


def training_lines(corpus: Corpus) -> dict[str, int]:
    """Lines of training text per language of the corpus (what the sampling rates weigh)."""
    counts: dict[str, int] = {x: 0 for x in corpus.languages}
    for split in corpus.train_splits():
        for x in split.langs:
            if x in counts:
                counts[x] += split.n_lines or 0
    return counts


def train_sentencepiece(corpus: Corpus, out_prefix: str | os.PathLike, vocab_size: int = 8000,
                        model_type: str = "bpe", temperature: float = 5.0, sentences: int = 1_000_000,
                        character_coverage: float = 0.9995, seed: int = 1, threads: int = 2,
                        clock: StageClock | None = None) -> Path:
    """Learn ``{out_prefix}.model`` from the corpus' training splits; returns its path. ``clock``
    gets the stages ``spm_read`` (the corpus' reader), ``spm_sample`` and ``spm_train``."""
    clock = clock or StageClock()
    # What the vocabulary holds before any learned piece: refused now, not after the corpus is read.
    fixed = 256 + 4 + len(corpus.languages)
    if vocab_size <= fixed:
        raise CorpusError(f"--vocab-size {vocab_size} leaves no room for learned subwords: the 256 byte pieces "
                          f"(byte fallback), 4 special ids and {len(corpus.languages)} language tags take {fixed}; "
                          f"give more, e.g. {fixed + 500} for a small corpus, 8000 (the default) for a large one")
    counts = training_lines(corpus)
    total = min(sentences, sum(counts.values()))
    rates = language_sample_rates(counts, total, temperature)
    rng = np.random.default_rng(seed)
    out_prefix = Path(out_prefix)
    written = 0
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", dir=out_prefix.parent,
                                     delete=False) as text:
        try:
            bar = tqdm(total=sum(s.n_lines or 0 for s in corpus.train_splits()), unit="lines",
                       desc="sampling text for SentencePiece", leave=False, disable=None)
            for split in corpus.train_splits():
                for _, chunk in clock.iterate("spm_read", split.read_chunks(8192)):
                    with clock.stage("spm_sample"):
                        written += _write_sample(text, chunk, rates, rng)
                    bar.update(len(next(iter(chunk.values()))))
            bar.close()
            text.close()
            if written == 0:
                raise CorpusError("every training line is empty: nothing to learn a vocabulary from")
            spm.set_random_generator_seed(seed)
            with clock.stage("spm_train"):
                _train_or_explain(
                    input=text.name, model_prefix=str(out_prefix), vocab_size=vocab_size,
                    model_type=model_type, character_coverage=character_coverage,
                    pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                    control_symbols=[lang_tag(x) for x in corpus.languages],
                    # Unseen characters (emoji, rare scripts) become bytes instead of <unk>.
                    byte_fallback=True, input_sentence_size=0, shuffle_input_sentence=True,
                    num_threads=threads, minloglevel=2, max_sentence_length=1 << 14)
        finally:
            Path(text.name).unlink(missing_ok=True)
    return out_prefix.with_suffix(".model")


def _write_sample(text, chunk: dict[str, list[str]], rates: dict[str, float], rng: np.random.Generator) -> int:
    """Write each line of a chunk ``floor(rate)`` or ``ceil(rate)`` times (the fraction drawn),
    so a language's expected share of the sample is its rate; returns the lines written."""
    written = 0
    for x, lines in chunk.items():
        if x not in rates:
            continue
        rate = rates[x]
        copies = np.floor(rate) + (rng.random(len(lines)) < rate - np.floor(rate))
        for line, c in zip(lines, copies.astype(np.int64)):
            if line and c:
                text.write((line.replace("\n", " ") + "\n") * int(c))
                written += int(c)
    return written


def _train_or_explain(**kwargs) -> None:
    try:
        spm.SentencePieceTrainer.train(**kwargs)
    except RuntimeError as err:
        # SentencePiece reports as an internal error what is a setting problem for the user.
        msg = str(err).split("] ")[-1].strip() or str(err).strip() or type(err).__name__
        raise CorpusError(f"SentencePiece could not learn a vocabulary of {kwargs['vocab_size']}: {msg} "
                          f"(with byte fallback the vocabulary needs room for 256 byte pieces, "
                          f"the language tags and every character)") from None


def check_sentencepiece(model_path: str | os.PathLike, languages: list[str]) -> spm.SentencePieceProcessor:
    """Load a given model and check that it can serve these languages (tags and special ids)."""
    path = Path(model_path)
    if not path.is_file():
        raise CorpusError(f"--spm-model {path}: no such file")
    sp = spm.SentencePieceProcessor()
    try:
        sp.load(str(path))
    except (OSError, RuntimeError) as err:
        raise CorpusError(f"--spm-model {path}: not a SentencePiece model ({err})") from None
    missing = [lang_tag(x) for x in languages
               if sp.piece_to_id(lang_tag(x)) == sp.unk_id() or not sp.is_control(sp.piece_to_id(lang_tag(x)))]
    if missing:
        raise CorpusError(f"--spm-model {path}: no control symbol for {', '.join(missing)}; "
                          f"build a model with these tags (omit --spm-model)")
    if sp.pad_id() < 0:
        raise CorpusError(f"--spm-model {path}: the model has no pad id")
    return sp

"""The model's input, defined once. The source is the target language's tag, then the source
subwords, then ``</s>`` (paper §5.2: the tag ``<2xx>`` before the source tells the model what to
answer in; a recipe can train without it, ``data.add_lang_tag: false``). The target is its subwords
then ``</s>``; the decoder reads it shifted right behind ``<s>``.

The training stream builds whole batches of it at once (:func:`padded_rows`), the Translator, the
analyses and the demo one sentence at a time (:func:`source_ids`, :func:`target_ids`); a test
checks that the two agree.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def source_ids(ids: Sequence[int], eos: int, tag: int | None) -> list[int]:
    """One source sentence as the model reads it: ``[tag] ids </s>`` (no tag: ``ids </s>``)."""
    return ([] if tag is None else [tag]) + list(ids) + [eos]


def target_ids(ids: Sequence[int], eos: int) -> list[int]:
    """One target sentence as the model is trained to write it: ``ids </s>``."""
    return list(ids) + [eos]


def source_length(subwords: np.ndarray | int, tagged: bool) -> np.ndarray | int:
    """Positions a source of ``subwords`` takes: the subwords, ``</s>`` and the tag if any."""
    return subwords + (2 if tagged else 1)


def target_length(subwords: np.ndarray | int) -> np.ndarray | int:
    """Positions a target of ``subwords`` takes: the subwords and ``</s>``."""
    return subwords + 1


def padded_rows(starts: np.ndarray, lens: np.ndarray, vals: np.ndarray, width: int, pad: int,
                tags: np.ndarray | None, eos: int) -> np.ndarray:
    """(B, width) int64 matrix, row i = :func:`source_ids` of ``vals[starts[i]:starts[i]+lens[i]]``
    with ``tags[i]`` (or :func:`target_ids` without tags), right-padded: a batch built with a few
    vectorised gathers instead of a Python loop over sentences."""
    b = len(lens)
    out = np.full((b, width), pad, dtype=np.int64)
    off = 0 if tags is None else 1
    if tags is not None:
        out[:, 0] = tags
    total = int(lens.sum())
    if total:
        rows = np.repeat(np.arange(b), lens)
        first = np.cumsum(lens) - lens
        cols = np.arange(total) - np.repeat(first, lens)
        out[rows, cols + off] = vals[np.repeat(starts, lens) + cols]
    out[np.arange(b), lens + off] = eos
    return out

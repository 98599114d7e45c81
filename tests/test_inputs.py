"""The model's input has one owner (cll_scale.data.inputs): the training stream's batches and the
Translator's one-sentence encoding are the same sequence for the same sentence."""
import numpy as np
import pytest

from cll_scale.data.inputs import padded_rows, source_ids, source_length, target_ids, target_length
from cll_scale.data.manifest import Manifest
from cll_scale.data.stream import eval_batches
from cll_scale.evaluation.translator import Translator


@pytest.mark.parametrize("tagged", [True, False])
def test_a_padded_batch_holds_each_sentence_as_source_ids_writes_it(tagged):
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 9, size=7)
    vals = rng.integers(10, 99, size=int(lens.sum()) + 5)
    starts = np.cumsum(lens) - lens + 2                    # the sentences need not start at 0
    tags = rng.integers(4, 8, size=7) if tagged else None
    width = int(source_length(lens.max(), tagged)) + 2
    rows = padded_rows(starts, lens, vals, width, pad=1, tags=tags, eos=3)
    for i in range(7):
        ids = vals[starts[i]:starts[i] + lens[i]].tolist()
        want = source_ids(ids, 3, None if tags is None else int(tags[i])) if tagged else target_ids(ids, 3)
        assert len(want) == (source_length(lens[i], tagged) if tagged else target_length(lens[i]))
        assert rows[i].tolist() == want + [1] * (width - len(want))


def test_the_stream_and_the_translator_give_the_model_the_same_source(m30k_centered, tiny_export):
    """A validation batch's row for a sentence is what the Translator feeds the model for its text."""
    manifest = Manifest.load(m30k_centered)
    translator = Translator.load(tiny_export, "cpu")
    split = next(name for name in manifest.splits if name != "train")
    direction = "en-de"
    table = manifest.read_direction(m30k_centered, split, direction, ["src_text", "line"])
    text_of = dict(zip(table.column("line").to_pylist(), table.column("src_text").to_pylist()))
    batch = next(iter(eval_batches(m30k_centered, split, direction, batch_tokens=512, manifest=manifest)))
    checked = 0
    for row, line in zip(batch.src_tokens.tolist(), batch.lines.tolist()):
        encoded = translator.encode(text_of[line], "de")
        if len(encoded) > translator.max_src + 2:         # the Translator truncates what training never saw
            continue
        assert row[:len(encoded)] == encoded
        assert all(x == manifest.tokenizer.pad_id for x in row[len(encoded):])
        checked += 1
    assert checked >= 4

"""Beam search on hand-made log-probabilities (no model), then with the CLL model: cached
decoding equals uncached, and a mixed-target batch equals one-by-one decoding."""
import math

import torch

from cll_scale.evaluation.translator import ModelStepper
from cll_scale.model.config import PRESETS, ModelConfig
from cll_scale.model.decoding import DecodeConfig, beam_search
from cll_scale.model.model import CLLTransformer

BOS, EOS, V = 1, 2, 5


class TableStepper:
    """Log-probabilities from a table keyed by (sentence, prefix); unknown prefixes end."""

    def __init__(self, tables):
        self.tables = tables
        self.rows = [(s, ()) for s in range(len(tables))]

    def reorder(self, index):
        self.rows = [self.rows[i] for i in index.tolist()]

    def step(self, prev_tokens, t):
        out = torch.full((len(self.rows), V), -1e9)
        new_rows = []
        for r, ((sent, prefix), tok) in enumerate(zip(self.rows, prev_tokens[:, 0].tolist())):
            prefix = prefix + (tok,) if t else prefix
            probs = self.tables[sent].get(prefix, {EOS: 1.0})
            for token, p in probs.items():
                out[r, token] = math.log(p)
            new_rows.append((sent, prefix))
        self.rows = new_rows
        return out


# Greedy takes 3 (0.6) then eos (0.4): 0.24. Beam 2 also keeps 4 (0.4), then eos (0.9): 0.36.
TABLE = {(): {3: 0.6, 4: 0.4}, (3,): {EOS: 0.4, 3: 0.3, 4: 0.3}, (4,): {EOS: 0.9, 3: 0.05, 4: 0.05}}


def search(tables, beam, max_len=10, **kw):
    return beam_search(TableStepper(tables), len(tables), torch.full((len(tables),), max_len), BOS, EOS,
                       DecodeConfig(beam=beam, **kw))


def test_beam_finds_the_best_hypothesis_greedy_misses():
    greedy = search([TABLE], beam=1)[0]
    assert greedy[0].tokens == [3] and math.isclose(greedy[0].logprob, math.log(0.24), rel_tol=1e-6)
    beam = search([TABLE], beam=2)[0]
    assert beam[0].tokens == [4] and math.isclose(beam[0].logprob, math.log(0.36), rel_tol=1e-6)
    assert [h.tokens for h in beam] == [[4], [3]]
    assert math.isclose(beam[0].score, math.log(0.36) / 2, rel_tol=1e-6)    # length = tokens + eos


def test_sentences_of_a_batch_are_independent():
    other = {(): {3: 0.9, EOS: 0.1}, (3,): {3: 0.9, EOS: 0.1}, (3, 3): {EOS: 1.0}}
    out = search([TABLE, other], beam=2)
    assert out[0][0].tokens == [4] and out[1][0].tokens == [3, 3]


def test_length_limits():
    loop = {(): {3: 1.0}, (3,): {3: 1.0}, (3, 3): {3: 1.0}, (3, 3, 3): {3: 1.0}}
    out = search([loop], beam=2, max_len=3)[0]
    assert out[0].tokens == [3, 3]                     # eos forced at the limit
    early = {(): {EOS: 0.9, 3: 0.1}, (3,): {EOS: 1.0}}
    assert search([early], beam=1, min_len=1)[0][0].tokens == [3]
    assert search([early], beam=1, min_len=0)[0][0].tokens == []


def tiny_model():
    torch.manual_seed(0)
    cfg = ModelConfig(**PRESETS["tiny"], vocab_size=40, languages=["en", "de", "fr", "cs"], central_language="en",
                      variant="fcll", dropout=0.0)
    model = CLLTransformer(cfg).eval()
    with torch.no_grad():              # make LSLs matter, so that a mixed batch is a real test
        for slot in range(len(model.lsl)):
            for *_, t in model.lsl_views(slot):
                t.fill_(3.0)
    return model


def decode(model, src, langs, beam=3, cache=True):
    stepper = ModelStepper(model, src, langs, use_cache=cache)
    lens = (src != 0).sum(1) + 5
    with torch.no_grad():
        return [[(h.tokens, round(h.score, 4)) for h in hyps]
                for hyps in beam_search(stepper, len(src), lens, 2, 3, DecodeConfig(beam=beam))]


def test_cached_decoding_equals_uncached():
    model = tiny_model()
    src = torch.randint(4, 40, (5, 9), generator=torch.Generator().manual_seed(2))
    src[1, 6:] = 0
    langs = torch.tensor([1, 2, 3, 0, 1])
    assert decode(model, src, langs, cache=True) == decode(model, src, langs, cache=False)


def test_mixed_target_batch_equals_one_by_one():
    model = tiny_model()
    src = torch.randint(4, 40, (6, 8), generator=torch.Generator().manual_seed(3))
    langs = torch.tensor([3, 1, 0, 2, 1, 3])
    together = decode(model, src, langs)
    alone = [decode(model, src[i:i + 1], langs[i:i + 1])[0] for i in range(6)]
    assert together == alone
    same_src = src[:1].repeat(3, 1)                     # the target language changes the output
    outs = decode(model, same_src, torch.tensor([1, 2, 3]))
    assert len({tuple(o[0][0]) for o in outs}) > 1


def test_stepper_follows_any_row_order():
    """Beam search keeps rows grouped by sentence (encoder state shared by the beams); any other
    order falls back to one copy per row. Both must give what fresh, per-row decoding gives."""
    model = tiny_model()
    src = torch.randint(4, 40, (3, 7), generator=torch.Generator().manual_seed(4))
    langs = torch.tensor([1, 3, 2])
    first = torch.tensor([[2], [2], [2], [2], [2], [2]])
    second = torch.tensor([[5], [9], [7], [7], [11]])
    with torch.no_grad():
        s = ModelStepper(model, src, langs)
        s.reorder(torch.arange(3).repeat_interleave(2))               # grouped: 2 beams a sentence
        s.step(first, 0)
        s.reorder(torch.tensor([5, 0, 3, 3, 1]))                      # crosses sentences
        got = s.step(second, 1)
        rows = torch.tensor([2, 0, 1, 1, 0])                          # the sentence of each row
        ref = ModelStepper(model, src[rows], langs[rows], use_cache=False)
        ref.step(first[:5], 0)
        want = ref.step(second, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_beam_search_reads_the_device_only_every_sync_every_steps(monkeypatch):
    """On a GPU each host read of a tensor waits for the queue to drain. Between two looks
    (every ``sync_every`` steps) beam search and the model's stepper read nothing: counted by
    wrapping every reading call, as tests/sync_probe.py does for training. Hypotheses equal the
    look-every-step search's."""
    model = tiny_model()
    src = torch.randint(4, 40, (6, 8), generator=torch.Generator().manual_seed(5))
    langs = torch.tensor([3, 1, 0, 2, 1, 3])
    lens = torch.tensor([30, 9, 25, 14, 30, 20])
    reads = []

    def counting(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            reads.append(name)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, wrapper)

    class Recording(ModelStepper):
        def step(self, prev_tokens, t):
            at_step.append(len(reads))
            return super().step(prev_tokens, t)

    cfg = DecodeConfig(beam=3, min_len=2)
    with torch.no_grad():
        reference = beam_search(ModelStepper(model, src, langs), 6, lens, 2, 3, cfg, sync_every=1)
        for method in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero", "cpu", "numpy"):
            counting(torch.Tensor, method)
        for fn in ("equal", "nonzero", "unique", "unique_consecutive", "masked_select"):
            counting(torch, fn)
        at_step = []
        got = beam_search(Recording(model, src, langs), 6, lens, 2, 3, cfg, sync_every=4)
    monkeypatch.undo()
    steps = len(at_step)
    assert steps > 8
    between = [at_step[t + 1] - at_step[t] for t in range(steps - 1)]
    # After step t the host looks only when t + 1 is a multiple of 4 (dropping done sentences then
    # costs the stepper a few reads as well).
    assert all(n == 0 for t, n in enumerate(between) if (t + 1) % 4), between
    assert any(between), between
    same = lambda a, b: [[(h.tokens, round(h.score, 3)) for h in x] for x in a] == \
        [[(h.tokens, round(h.score, 3)) for h in x] for x in b]   # noqa: E731
    assert same(got, reference)

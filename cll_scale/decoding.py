"""Beam search over a step function. It knows nothing about CLL, languages or the model: the
caller's :class:`Stepper` turns the newest tokens into log-probabilities and reorders its own
state (cache, encoder output, target-language ids) when beams are reordered or sentences finish.
Greedy search is beam 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class DecodeConfig:
    # The help texts are the commands' flags (cll_scale.cli.add_config_arguments).
    beam: int = field(default=4, metadata={"help": "beam size (1: greedy)"})
    len_penalty: float = field(default=1.0, metadata={
        "help": "length penalty: a hypothesis scores sum log p / length ** len_penalty"})
    max_len_a: float = field(default=1.5, metadata={"help": "longest output = a · source length + b: a"})
    max_len_b: int = field(default=10, metadata={"help": "longest output = a · source length + b: b"})
    min_len: int = field(default=1, metadata={"help": "shortest output, in subwords before eos"})

    def __post_init__(self):
        import math
        if self.beam < 1:
            raise ValueError(f"beam must be >= 1, not {self.beam}")
        if not math.isfinite(self.len_penalty):
            raise ValueError(f"len_penalty must be a finite number, not {self.len_penalty}")
        if not (math.isfinite(self.max_len_a) and self.max_len_a >= 0) or self.max_len_b < 1:
            raise ValueError(f"max length = a * source length + b needs a >= 0 and b >= 1 "
                             f"(got a={self.max_len_a}, b={self.max_len_b}): otherwise every output is empty")
        if self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, not {self.min_len}")


class Stepper(Protocol):
    def step(self, prev_tokens: torch.Tensor, t: int) -> torch.Tensor:
        """(N, 1) newest tokens at position t -> (N, V) log-probabilities of the next one."""

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (N_new,) of every per-row state, in that order."""

    # Optional: ``reorder_beams(index)``, a cheaper :meth:`reorder` for the per-step case where
    # row ``r`` of the result comes from the same sentence as before (``index // beam == r // beam``).


@dataclass
class Hypothesis:
    tokens: list[int]          # without bos, without eos
    score: float               # length-normalised
    logprob: float


def beam_search(stepper: Stepper, batch_size: int, max_lens: torch.Tensor, bos: int, eos: int,
                cfg: DecodeConfig, device=None, sync_every: int | None = None) -> list[list[Hypothesis]]:
    """Return, per sentence, its hypotheses best first (at most ``cfg.beam``).

    Rows are ``sentence * beam + k``. A hypothesis finishes when eos is among the best ``beam``
    candidates of its sentence; a sentence is done with ``beam`` finished hypotheses (or no live
    candidate). Everything per step stays on the device: finished hypotheses are written into
    fixed buffers, and done sentences ride along with -inf scores. The host looks only every
    ``sync_every`` steps (default: 8 on a GPU, where each look waits for the queue to drain; 1
    on the CPU, where it costs nothing): it stops when every sentence is done and drops the done
    ones from the batch (the stepper is told through ``reorder``)."""
    k = cfg.beam
    device = torch.device(device) if device is not None else max_lens.device
    sync_every = sync_every or (1 if device.type == "cpu" else 8)
    max_lens = max_lens.to(device)
    if batch_size == 0:
        return []
    limit = int(max_lens.max())                                 # the one read before the loop
    reorder_beams = getattr(stepper, "reorder_beams", stepper.reorder)
    stepper.reorder(torch.arange(batch_size, device=device).repeat_interleave(k))
    scores = torch.full((batch_size, k), float("-inf"), device=device)
    scores[:, 0] = 0.0                                          # one live beam at the start
    tokens = torch.full((batch_size * k, 1), bos, dtype=torch.long, device=device)
    active = torch.arange(batch_size, device=device)            # original id of each live sentence
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    # Finished hypotheses per original sentence; slot k is scratch for candidates not kept.
    fin_tokens = torch.zeros((batch_size, k + 1, max(limit, 1)), dtype=torch.long, device=device)
    fin_len = torch.zeros((batch_size, k + 1), dtype=torch.long, device=device)
    fin_score = torch.full((batch_size, k + 1), float("-inf"), device=device)
    fin_logp = torch.full((batch_size, k + 1), float("-inf"), device=device)
    fin_count = torch.zeros(batch_size, dtype=torch.long, device=device)
    ranks = torch.arange(2 * k, device=device)
    # On the CPU a look costs nothing and most steps are below every limit and finish nothing: skip
    # a pass over the (rows × vocabulary) scores then, and the writes of finished hypotheses.
    look = sync_every == 1
    t = 0
    while t < limit:
        b = active.numel()
        lp = stepper.step(tokens[:, -1:], t).float()            # (b*k, V)
        v = lp.shape[-1]
        lp = lp.view(b, k, v)
        if t < cfg.min_len:
            lp[:, :, eos] = float("-inf")
        at_limit = (t + 1 >= max_lens[active])[:, None]         # (b, 1): must end now
        if not look or at_limit.any():
            eos_lp = lp[:, :, eos].clone()
            lp.masked_fill_(at_limit[:, :, None], float("-inf"))
            lp[:, :, eos] = torch.where(at_limit, eos_lp.clamp(min=-1e4), eos_lp)
        cand = (scores[:, :, None] + lp).view(b, k * v)
        top_scores, top_idx = cand.topk(min(2 * k, k * v), dim=1)      # (b, 2k)
        beam_idx, tok = top_idx // v, top_idx % v
        is_eos = tok == eos
        # Finished: eos among a sentence's best k candidates. The n-th of this step goes to slot
        # fin_count + n, those past k to the scratch slot.
        new_fin = is_eos & (ranks[:tok.shape[1]] < k) & torch.isfinite(top_scores)
        if not look or new_fin.any():
            slot = fin_count[active][:, None] + new_fin.long().cumsum(1) - 1
            slot = torch.where(new_fin & (slot < k), slot, k)
            sent = active[:, None].expand_as(slot)
            if t:
                hist = tokens.view(b, k, -1)[:, :, 1:]                 # (b, k, t) without bos
                fin_tokens[sent, slot, :t] = hist.gather(1, beam_idx[:, :, None].expand(-1, -1, t))
            fin_len[sent, slot] = t
            fin_logp[sent, slot] = top_scores
            fin_score[sent, slot] = top_scores / (t + 1) ** cfg.len_penalty
            fin_count[active] = (fin_count[active] + new_fin.sum(1)).clamp(max=k)
        # Continue with the best k non-eos candidates.
        cont_scores = top_scores.masked_fill(is_eos, float("-inf"))
        order = cont_scores.argsort(dim=1, descending=True, stable=True)[:, :k]
        new_scores = cont_scores.gather(1, order)
        done = done | (fin_count[active] >= k) | ~torch.isfinite(new_scores[:, 0])
        scores = new_scores.masked_fill(done[:, None], float("-inf"))
        index = (torch.arange(b, device=device)[:, None] * k + beam_idx.gather(1, order)).reshape(-1)
        tokens = torch.cat([tokens[index], tok.gather(1, order).reshape(-1, 1)], dim=1)
        t += 1
        if t >= limit:
            break
        if t % sync_every == 0:
            keep = (~done).nonzero(as_tuple=True)[0]           # the host's look
            if keep.numel() == 0:
                break
            if keep.numel() < b:
                rows = (keep[:, None] * k + torch.arange(k, device=device)).reshape(-1)
                tokens, scores, active, done = tokens[rows], scores[keep], active[keep], done[keep]
                stepper.reorder(index[rows])
                continue
        reorder_beams(index)
    count, lens = fin_count.tolist(), fin_len.tolist()
    toks, fscore, flogp = fin_tokens.tolist(), fin_score.tolist(), fin_logp.tolist()
    finished = []
    for s in range(batch_size):
        hyps = [Hypothesis(toks[s][j][:lens[s][j]], fscore[s][j], flogp[s][j]) for j in range(count[s])]
        hyps.sort(key=lambda h: h.score, reverse=True)
        finished.append(hyps)
    return finished

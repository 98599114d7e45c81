"""Beam search over a step function. It knows nothing about CLL, languages or the model: the
caller's :class:`Stepper` turns the newest tokens into log-probabilities and reorders its own
state (cache, encoder output, target-language ids) when beams are reordered or sentences finish.
Greedy search is beam 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from cll_scale.model.decode_config import DecodeConfig


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


class _Finished:
    """Finished hypotheses per original sentence, in fixed device buffers (slot ``k`` is scratch
    for candidates not kept), so that recording them never waits for the host."""

    def __init__(self, batch_size: int, k: int, limit: int, device):
        self.k = k
        self.tokens = torch.zeros((batch_size, k + 1, max(limit, 1)), dtype=torch.long, device=device)
        self.len = torch.zeros((batch_size, k + 1), dtype=torch.long, device=device)
        self.score = torch.full((batch_size, k + 1), float("-inf"), device=device)
        self.logp = torch.full((batch_size, k + 1), float("-inf"), device=device)
        self.count = torch.zeros(batch_size, dtype=torch.long, device=device)

    def record(self, new_fin, active, tokens, beam_idx, top_scores, t: int, len_penalty: float) -> None:
        """The n-th hypothesis finished at step ``t`` of a sentence goes to slot count + n, those
        past k to the scratch slot."""
        k, b = self.k, active.numel()
        slot = self.count[active][:, None] + new_fin.long().cumsum(1) - 1
        slot = torch.where(new_fin & (slot < k), slot, k)
        sent = active[:, None].expand_as(slot)
        if t:
            hist = tokens.view(b, k, -1)[:, :, 1:]                 # (b, k, t) without bos
            self.tokens[sent, slot, :t] = hist.gather(1, beam_idx[:, :, None].expand(-1, -1, t))
        self.len[sent, slot] = t
        self.logp[sent, slot] = top_scores
        self.score[sent, slot] = top_scores / (t + 1) ** len_penalty
        self.count[active] = (self.count[active] + new_fin.sum(1)).clamp(max=k)

    def hypotheses(self) -> list[list[Hypothesis]]:
        """Per sentence, best first (one read of the buffers)."""
        count, lens = self.count.tolist(), self.len.tolist()
        toks, fscore, flogp = self.tokens.tolist(), self.score.tolist(), self.logp.tolist()
        finished = []
        for s in range(len(count)):
            hyps = [Hypothesis(toks[s][j][:lens[s][j]], fscore[s][j], flogp[s][j]) for j in range(count[s])]
            hyps.sort(key=lambda h: h.score, reverse=True)
            finished.append(hyps)
        return finished


def _force_eos_at_limit(lp: torch.Tensor, at_limit: torch.Tensor, eos: int) -> None:
    """Rows at their length limit must end now: only eos stays possible (clamped to stay finite)."""
    eos_lp = lp[:, :, eos].clone()
    lp.masked_fill_(at_limit[:, :, None], float("-inf"))
    lp[:, :, eos] = torch.where(at_limit, eos_lp.clamp(min=-1e4), eos_lp)


def _start(batch_size: int, k: int, bos: int, device) -> tuple[torch.Tensor, ...]:
    """Scores (one live beam per sentence), bos tokens, the live sentences' ids, none done."""
    scores = torch.full((batch_size, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    tokens = torch.full((batch_size * k, 1), bos, dtype=torch.long, device=device)
    active = torch.arange(batch_size, device=device)            # original id of each live sentence
    return scores, tokens, active, torch.zeros(batch_size, dtype=torch.bool, device=device)


def _best_live(top_scores, is_eos, beam_idx, tok, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The best k candidates that do not end: their scores, the rows they continue (an index
    into the b·k rows) and their tokens as a new column."""
    cont_scores = top_scores.masked_fill(is_eos, float("-inf"))
    order = cont_scores.argsort(dim=1, descending=True, stable=True)[:, :k]
    b = top_scores.shape[0]
    index = (torch.arange(b, device=top_scores.device)[:, None] * k + beam_idx.gather(1, order)).reshape(-1)
    return cont_scores.gather(1, order), index, tok.gather(1, order).reshape(-1, 1)


def beam_search(stepper: Stepper, batch_size: int, max_lens: torch.Tensor, bos: int, eos: int,
                cfg: DecodeConfig, device=None, sync_every: int | None = None) -> list[list[Hypothesis]]:
    """Per sentence, its hypotheses best first (at most ``cfg.beam``). Rows are ``sentence * beam
    + k``. A hypothesis finishes when eos is among the best ``beam`` candidates of its sentence; a
    sentence is done with ``beam`` finished ones (or no live candidate). Per step everything stays
    on the device (done sentences ride along with -inf scores); the host looks every ``sync_every``
    steps (8 on a GPU, where a look drains the queue; 1 on the CPU), stops when all are done and
    drops the done ones from the batch (the stepper is told through ``reorder``)."""
    k = cfg.beam
    device = torch.device(device) if device is not None else max_lens.device
    sync_every = sync_every or (1 if device.type == "cpu" else 8)
    max_lens = max_lens.to(device)
    if batch_size == 0:
        return []
    limit = int(max_lens.max())                                 # the one read before the loop
    reorder_beams = getattr(stepper, "reorder_beams", stepper.reorder)
    stepper.reorder(torch.arange(batch_size, device=device).repeat_interleave(k))
    scores, tokens, active, done = _start(batch_size, k, bos, device)
    fin = _Finished(batch_size, k, limit, device)
    ranks = torch.arange(2 * k, device=device)
    # On the CPU a look costs nothing and most steps are below every limit and finish nothing: skip
    # a pass over the (rows × vocabulary) scores then, and the writes of finished hypotheses.
    look = sync_every == 1
    t = 0
    while t < limit:
        b = active.numel()
        lp = stepper.step(tokens[:, -1:], t).float()            # (b*k, V)
        lp = lp.view(b, k, v := lp.shape[-1])
        if t < cfg.min_len:
            lp[:, :, eos] = float("-inf")
        at_limit = (t + 1 >= max_lens[active])[:, None]         # (b, 1): must end now
        if not look or at_limit.any():
            _force_eos_at_limit(lp, at_limit, eos)
        cand = (scores[:, :, None] + lp).view(b, k * v)
        top_scores, top_idx = cand.topk(min(2 * k, k * v), dim=1)      # (b, 2k)
        beam_idx, tok = top_idx // v, top_idx % v
        is_eos = tok == eos
        # Finished: eos among a sentence's best k candidates.
        new_fin = is_eos & (ranks[:tok.shape[1]] < k) & torch.isfinite(top_scores)
        if not look or new_fin.any():
            fin.record(new_fin, active, tokens, beam_idx, top_scores, t, cfg.len_penalty)
        # Continue with the best k non-eos candidates.
        new_scores, index, next_tok = _best_live(top_scores, is_eos, beam_idx, tok, k)
        done = done | (fin.count[active] >= k) | ~torch.isfinite(new_scores[:, 0])
        scores = new_scores.masked_fill(done[:, None], float("-inf"))
        tokens = torch.cat([tokens[index], next_tok], dim=1)
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
    return fin.hypotheses()

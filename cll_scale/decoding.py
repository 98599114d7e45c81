"""Beam search over a step function. It knows nothing about CLL, languages or the model: the
caller's :class:`Stepper` turns the newest tokens into log-probabilities and reorders its own
state (cache, encoder output, target-language ids) when beams are reordered or sentences finish.
Greedy search is beam 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class DecodeConfig:
    beam: int = 4
    len_penalty: float = 1.0       # final score = sum log p / length ** len_penalty
    max_len_a: float = 1.5         # max output length = a * source length + b
    max_len_b: int = 10
    min_len: int = 1

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


@dataclass
class Hypothesis:
    tokens: list[int]          # without bos, without eos
    score: float               # length-normalised
    logprob: float


def beam_search(stepper: Stepper, batch_size: int, max_lens: torch.Tensor, bos: int, eos: int,
                cfg: DecodeConfig, device=None) -> list[list[Hypothesis]]:
    """Return, per sentence, its hypotheses best first (at most ``cfg.beam``).

    Rows are ``sentence * beam + k``; sentences that have ``beam`` finished hypotheses leave the
    batch (the stepper is told through ``reorder``)."""
    k = cfg.beam
    device = device or max_lens.device
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    active = torch.arange(batch_size, device=device)             # original ids of live sentences
    stepper.reorder(torch.arange(batch_size, device=device).repeat_interleave(k))
    scores = torch.full((batch_size, k), float("-inf"), device=device)
    scores[:, 0] = 0.0                                          # one live beam at the start
    tokens = torch.full((batch_size * k, 1), bos, dtype=torch.long, device=device)
    max_lens = max_lens.to(device)
    t = 0
    while active.numel():
        b = active.numel()
        lp = stepper.step(tokens[:, -1:], t).float()            # (b*k, V)
        v = lp.shape[-1]
        lp = lp.view(b, k, v)
        if t < cfg.min_len:
            lp[:, :, eos] = float("-inf")
        at_limit = (t + 1 >= max_lens[active])                  # must end now
        if at_limit.any():
            forced = torch.full_like(lp[at_limit], float("-inf"))
            forced[:, :, eos] = lp[at_limit][:, :, eos].clamp(min=-1e4)
            lp[at_limit] = forced
        cand = (scores[:, :, None] + lp).view(b, k * v)
        top_scores, top_idx = cand.topk(min(2 * k, k * v), dim=1)      # (b, 2k)
        beam_idx, tok = top_idx // v, top_idx % v
        is_eos = tok == eos
        # Finished hypotheses: eos among the best k candidates of a sentence.
        ranks = torch.arange(top_idx.shape[1], device=device).expand_as(tok)
        done_mask = is_eos & (ranks < k) & torch.isfinite(top_scores)
        if done_mask.any():
            rows, cols = done_mask.nonzero(as_tuple=True)
            length = t + 1
            hist = tokens.view(b, k, -1)
            for r, c in zip(rows.tolist(), cols.tolist()):       # at most k per sentence per step
                sent = int(active[r])
                if len(finished[sent]) < k:
                    seq = hist[r, beam_idx[r, c], 1:].tolist()
                    logp = float(top_scores[r, c])
                    finished[sent].append(Hypothesis(seq, logp / length ** cfg.len_penalty, logp))
        # Continue with the best k non-eos candidates.
        cont_scores = top_scores.masked_fill(is_eos, float("-inf"))
        order = cont_scores.argsort(dim=1, descending=True, stable=True)[:, :k]
        new_scores = cont_scores.gather(1, order)
        new_beam = beam_idx.gather(1, order)
        new_tok = tok.gather(1, order)
        still = torch.tensor([len(finished[int(s)]) < k for s in active.tolist()], device=device)
        still &= torch.isfinite(new_scores[:, 0])
        rows = (torch.arange(b, device=device)[:, None] * k + new_beam)       # (b, k) source rows
        keep = still.nonzero(as_tuple=True)[0]
        index = rows[keep].reshape(-1)
        tokens = torch.cat([tokens[index], new_tok[keep].reshape(-1, 1)], dim=1)
        scores = new_scores[keep]
        active = active[keep]
        if active.numel():
            stepper.reorder(index)
        t += 1
    for hyps in finished:
        hyps.sort(key=lambda h: h.score, reverse=True)
    return finished

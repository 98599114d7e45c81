"""The two ways a training step is skipped instead of ending the run, as small named policies.

* :class:`OutOfMemorySkip`: out of memory in the forward pass. This rank back-propagates a zero
  loss of one short row instead, so its gradient reductions still pair with the other ranks'
  (fairseq recovers the same way), and the step is marked not finite: every rank skips it.
  Out of memory in the backward pass cannot be skipped (reductions may be under way).
* :class:`NonFiniteSkip`: a step whose loss or gradients are not finite on some rank changes
  nothing (decided on the device by :class:`cll_scale.training.optim.GuardedAdamW`); this policy reports
  the skipped steps at log time and ends the run when too many come in a row.
"""
from __future__ import annotations

import sys

import torch

from cll_scale.core.errors import DeviceError
from cll_scale.model.model import projected_loss
from cll_scale.training.metrics import WindowSums


class OutOfMemory(DeviceError):
    """The device ran out of memory where the step cannot be skipped (the backward pass)."""


class OutOfMemorySkip:
    def __init__(self, rank: int, device: torch.device, pad_id: int):
        self.rank, self.device, self.pad_id = rank, device, pad_id

    def stand_in(self, engine, batch, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """After an out-of-memory forward pass of ``batch``: a zero (loss, nll) of its first row,
        cut to two tokens, with a graph through the same parameters."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"[cll-train] rank {self.rank}, step {step}: out of memory on a {batch.direction} "
              f"batch of {len(batch)} rows x {batch.src_tokens.shape[1]} source / "
              f"{batch.tgt_tokens.shape[1]} target tokens; the step is skipped on every rank",
              file=sys.stderr, flush=True)
        dev = batch.head(rows=1, tokens=2).to(self.device)
        model = engine.module
        features = engine(dev.src_tokens, model.shift_right(dev.tgt_tokens), dev.tgt_lang, lang_runs=dev.lang_runs,
                          features_only=True)
        loss, nll = projected_loss(features, model.embed.weight, dev.tgt_tokens, self.pad_id, 0.0)
        return loss * 0.0, nll * 0.0

    @staticmethod
    def in_backward(batch, step: int) -> OutOfMemory:
        return OutOfMemory(
            f"out of memory in the backward pass of step {step} ({batch.direction}, {len(batch)} rows x "
            f"{batch.tgt_tokens.shape[1]} target tokens): gradient reductions may already be under way, so "
            f"this step cannot be skipped; lower data.batch_tokens and --resume from the last checkpoint")


class NonFiniteSkip:
    def __init__(self, max_in_a_row: int, log):
        self.max_in_a_row, self.log = max_in_a_row, log

    def check(self, sums: WindowSums, step: int, last_checkpoint: str | None) -> None:
        """Report the window's skipped steps; too many in a row end the run (exit 5)."""
        for skipped in sums.skipped:
            self.log(f"step {skipped}: non-finite loss or gradients, or out of memory, on some rank; the step "
                     f"was skipped on every rank (weights and optimizer state unchanged)")
        if sums.in_a_row >= self.max_in_a_row:
            raise FloatingPointError(f"{sums.in_a_row} steps in a row skipped (non-finite or out of memory) up to "
                                     f"step {step}: training diverged or the batches do not fit; the last good "
                                     f"checkpoint is {last_checkpoint}")

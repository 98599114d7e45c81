"""The optimizer and learning-rate schedule of every training command (plain PyTorch).

A step whose loss or gradients are not finite on any rank must change nothing, and deciding that
on the host would stall the GPU at every step. :class:`GuardedAdamW` decides it on the device:
the verdict is all-reduced as a tensor and handed to the fused AdamW kernel as ``found_inf``
(the mechanism ``torch.amp.GradScaler`` uses), which then leaves the weights, both moments and the
step count untouched. Nothing here reads a device value on the host.
"""
from __future__ import annotations

import torch

from cll_scale.training.configs import OptimConfig, inverse_sqrt  # noqa: F401  (the section this module uses)


class GuardedAdamW(torch.optim.AdamW):
    """Fused AdamW that clips by the global gradient norm and skips a whole step, on every rank,
    when the step is not finite anywhere: all of it on the device.

    Before each step the trainer sets :attr:`loss_ok` (a 0-d bool tensor: every microbatch of the
    step had a finite loss on this rank). The step computes the global norm of the gradients it
    holds (``partitioned``: under ZeRO each rank holds its own slice, so squared norms are summed
    over ranks), clips by it, and skips the update if the norm or any rank's loss is not finite.
    One all-reduce carries both. :attr:`last_ok` and :attr:`grad_norm` stay on the device for
    the trainer's accounting; :attr:`steps_called` counts calls on the host, so a step that the
    engine dropped itself (DeepSpeed's fp16 overflow check) is visible without a device read."""

    def __init__(self, params, clip_norm: float = 0.0, partitioned: bool = False, **kw):
        super().__init__(params, fused=True, **kw)
        self.clip_norm, self.partitioned = clip_norm, partitioned
        self.loss_ok: torch.Tensor | None = None
        self.last_ok: torch.Tensor | None = None
        self.grad_norm: torch.Tensor | None = None
        self.steps_called = 0

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return super().step(closure)
        device = grads[0].device
        # One fused kernel for all norms (under ZeRO a handful of flat partitions): no loop over
        # parameters. NaN or inf anywhere makes the sum non-finite.
        sq = torch.stack(torch._foreach_norm(grads)).float().square().sum()
        bad = torch.zeros((), device=device) if self.loss_ok is None else (~self.loss_ok.to(device)).float()
        both = torch.stack([sq, bad])
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        if world > 1:
            torch.distributed.all_reduce(both)
        sq, bad = both[0] / (1 if self.partitioned else world), both[1]
        norm = sq.sqrt()
        ok = norm.isfinite() & (bad == 0)
        if self.clip_norm > 0:
            torch._foreach_mul_(grads, torch.clamp(self.clip_norm / (norm + 1e-6), max=1.0))
        self.found_inf = (~ok).float()            # read by the fused kernel, on the device
        self.last_ok, self.grad_norm = ok, norm
        self.steps_called += 1
        return super().step(closure)

"""The optimizer and learning-rate schedule of every training command (plain PyTorch).

A step whose loss or gradients are not finite on any rank must change nothing, and deciding that
on the host would stall the GPU at every step. :class:`GuardedAdamW` decides it on the device:
the verdict is all-reduced as a tensor and handed to the fused AdamW kernel as ``found_inf``
(the mechanism ``torch.amp.GradScaler`` uses), which then leaves the weights, both moments and the
step count untouched. Nothing here reads a device value on the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cll_scale.core.settings import setting


@dataclass
class OptimConfig:
    """The recipe's ``optim`` section: AdamW and its schedule (paper App. A defaults)."""
    # The help texts are cll-train's flags (cll_scale.run.recipe.add_recipe_arguments).
    lr: float = setting(7e-4, "peak learning rate")
    warmup_steps: int = setting(4000, "linear warm-up steps, then 1/sqrt(step) decay")
    schedule_offset: int = setting(0, "the schedule goes on as if this many steps were done (cll-extend "
                                   "continues pre-training's decay)")
    betas: tuple[float, float] = setting((0.9, 0.98), "AdamW's betas, e.g. [0.9, 0.98]")
    eps: float = setting(1e-8, "AdamW's epsilon")
    weight_decay: float = setting(0.0, "AdamW's decoupled weight decay")
    clip_norm: float = setting(1.0, "clip gradients to this global norm (0: no clipping)")

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optim.lr must be a positive number, not {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), e.g. [0.9, 0.98] or 0.9,0.98; not {list(self.betas)}")
        if not self.eps > 0 or self.weight_decay < 0 or self.clip_norm < 0 or self.warmup_steps < 0:
            raise ValueError("optim.eps must be > 0, and weight_decay, clip_norm, warmup_steps >= 0")

    def adamw_kwargs(self) -> dict:
        return dict(lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def scheduler(self, optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """Warm-up and inverse square root, shifted by ``schedule_offset``."""
        factor, offset = inverse_sqrt(self.warmup_steps), self.schedule_offset
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(step + offset))


def inverse_sqrt(warmup: int):
    """Linear warm-up to the peak, then ∝ 1/sqrt(step) (Vaswani et al. 2017; paper App. A)."""
    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))
    return factor


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

"""The training layer's recipe sections (``optim``, ``checkpoint``, ``valid``, ``log``), apart from
the components that use them (:mod:`~cll_scale.training.optim`, :mod:`~cll_scale.training.rundir`,
:mod:`~cll_scale.training.validator`, :mod:`~cll_scale.training.metrics`, which import torch), so
that ``cll-train`` builds its flags from them without importing torch: ``--help`` answers at once.
Each component's module names its section as its own."""
from __future__ import annotations

import math
from dataclasses import dataclass

from cll_scale.core.settings import setting

BEST_METRICS = ("", "valid_nll", "valid_bleu")


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
        import torch
        factor, offset = inverse_sqrt(self.warmup_steps), self.schedule_offset
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(step + offset))


def inverse_sqrt(warmup: int):
    """Linear warm-up to the peak, then ∝ 1/sqrt(step) (Vaswani et al. 2017; paper App. A)."""
    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))
    return factor


@dataclass
class CheckpointConfig:
    """The recipe's ``checkpoint`` section."""
    # The help texts are cll-train's flags (cll_scale.run.recipe.add_recipe_arguments).
    every: int = setting(1000, "save a checkpoint every this many steps")
    keep_last: int = setting(3, "complete checkpoints kept (older ones are deleted)")
    export: bool = setting(True, "write export/ at the end (and export-best/ on a new best validation score)")

    def __post_init__(self):
        if self.every < 1 or self.keep_last < 1:
            raise ValueError("checkpoint.every and checkpoint.keep_last must be >= 1")


@dataclass
class LogConfig:
    """The recipe's ``log`` section."""
    # The help texts are cll-train's flags (cll_scale.run.recipe.add_recipe_arguments).
    every: int = setting(50, "steps per metrics.jsonl line; also how often the host reads the device's metrics")
    peak_tflops: float = setting(0.0, "the device's dense bf16 peak in TFLOP/s that MFU is measured against (0: "
                                 "from the datasheet table by device name; no MFU where the name is not in it, "
                                 "as on a CPU)")
    tensorboard: bool = setting(False, "also write the training metrics as TensorBoard events under "
                                       "<run dir>/monitor/train (DeepSpeed's monitor; needs the tensorboard package)")
    wandb: bool = setting(False, "also send the training metrics to Weights & Biases (DeepSpeed's monitor; needs "
                                 "the wandb package)")

    def __post_init__(self):
        if self.every < 1 or self.peak_tflops < 0:
            raise ValueError("log.every must be >= 1 and log.peak_tflops >= 0")

    def dashboards(self) -> tuple[str, ...]:
        """The DeepSpeed monitors asked for, each checked to be installed: a run refuses to start
        rather than train for hours with its dashboard silently missing."""
        import importlib.util
        wanted = tuple(name for name in ("tensorboard", "wandb") if getattr(self, name))
        missing = [name for name in wanted if importlib.util.find_spec(name) is None]
        if missing:
            raise ValueError("; ".join(f"log.{name}: true needs the {name} package, which is not installed in this "
                                       f"Python (pip install {name}, or set log.{name}: false)" for name in missing))
        return wanted


@dataclass
class ValidConfig:
    """The recipe's ``valid`` section: validation during training and the model it selects."""
    # The help texts are cll-train's flags (cll_scale.run.recipe.add_recipe_arguments).
    every: int = setting(500, "validate every this many steps")
    max_batches: int = setting(0, "batches per direction at most (0: the whole split)")
    max_sentences: int = setting(0, "the first N sentences (dev-set lines) of each direction, split over the "
                                 "ranks (0: every sentence; OPUS-100: 200 of the 2,000 in each of 188 directions)")
    decode_sentences: int = setting(0, "also greedy-translate this many sentences per direction and log BLEU and "
                                    "the zero-shot off-target rate (0: no decoding)")
    best_metric: str = setting("valid_nll", "export-best/ follows this supervised metric: valid_nll (lower is "
                               "better), valid_bleu (needs decode_sentences), or '' for no selection")

    def __post_init__(self):
        if self.every < 1 or self.max_batches < 0 or self.max_sentences < 0 or self.decode_sentences < 0:
            raise ValueError("valid.every must be >= 1, valid.max_batches, max_sentences and decode_sentences >= 0")
        if self.best_metric not in BEST_METRICS:
            raise ValueError(f"valid.best_metric must be valid_nll, valid_bleu or empty, not {self.best_metric!r}")
        if self.best_metric == "valid_bleu" and not self.decode_sentences:
            # BLEU is only measured on decoded sentences: without any, no validation would ever
            # give a value, and export-best/ would silently never be written.
            raise ValueError("valid.best_metric valid_bleu needs valid.decode_sentences > 0 (BLEU is scored on "
                             "that many greedy translations per direction); set it, e.g. 200, or choose valid_nll")

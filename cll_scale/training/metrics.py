"""Training metrics kept on the device between log steps, and the run's ``metrics.jsonl``.

Every per-step number (loss, NLL, tokens, skipped steps) is added into device tensors; the host
reads them once per ``log.every`` steps in :meth:`MetricsWindow.flush`. That read is the
training loop's one device→host synchronisation in the steady state.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from cll_scale.core.hardware import peak_bf16_tflops
from cll_scale.core.jsonfiles import read_json_lines
from cll_scale.core.outputs import json_text, naming, write_atomic
from cll_scale.training.configs import LogConfig  # noqa: F401  (the section this module uses)


@dataclass
class TrainRecord:
    """One ``metrics.jsonl`` line of training (validation lines carry ``valid_*`` keys instead)."""
    step: int
    loss: float | None       # label-smoothed loss per target token over the window's applied steps
    nll: float | None        # (None when every step of the window was skipped)
    ppl: float | None
    lr: float
    tokens_per_s: float      # target tokens of kept steps over the window's training time, all ranks
    epoch: float
    grad_norm: float | None
    skipped: int             # steps of the window skipped on every rank (non-finite or out of memory)
    elapsed_s: float
    tokens_seen: int
    mfu: float | None = None # model FLOPs utilisation against LogConfig's peak (None: no peak known)


class MetricsWindow:
    """Device-side sums over the steps since the last log line."""

    def __init__(self, device: torch.device, capacity: int):
        """``capacity``: log.every, the most steps a window holds before it is flushed."""
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)       # loss, nll, tokens
        self.skip_flags = torch.zeros(capacity, dtype=torch.float32, device=device)
        self.consecutive = torch.zeros((), dtype=torch.float32, device=device)   # skipped in a row
        self.first_step, self.n = 0, 0
        self.seconds = self.flops = 0.0

    def add(self, step: int, loss: torch.Tensor, nll: torch.Tensor, tokens: int, ok: torch.Tensor,
            seconds: float, flops: float = 0.0) -> None:
        """One finished step (``tokens`` on this rank; ``flops``: the model FLOPs of all ranks, a
        host estimate from batch shapes): its sums count only if the step was applied on every
        rank (``ok``)."""
        if self.n == 0:
            self.first_step = step
        values = torch.stack([loss.double(), nll.double(), torch.full_like(loss, tokens, dtype=torch.float64)])
        # `tokens` enters as a fill value, not as a copied tensor (a copy would wait for the GPU);
        # `where`, not a product, so that a skipped step's NaN stays out of the sums.
        self.sums += torch.where(ok, values, 0.0)
        bad = 1.0 - ok.float()
        self.skip_flags[self.n] = bad
        self.consecutive.mul_(bad).add_(bad)      # +1 on a skipped step, back to 0 on a kept one
        self.n += 1
        self.seconds += seconds
        self.flops += flops

    def flush(self) -> "WindowSums":
        """Read the window (one sync) and reset it. Every rank calls it at the same step."""
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(self.sums)
        # One tensor, so one read: the sums (their order is __init__'s), the run of skipped steps,
        # and one skip flag per step of the window.
        values = torch.cat([self.sums, self.consecutive.double().reshape(1), self.skip_flags.double()]).tolist()
        loss, nll, tokens, in_a_row = values[:4]
        flags = values[4:4 + self.n]
        out = WindowSums(loss=loss, nll=nll, tokens=tokens, seconds=self.seconds, in_a_row=int(in_a_row),
                         skipped=[self.first_step + i for i, f in enumerate(flags) if f], flops=self.flops)
        self.sums.zero_()
        self.skip_flags.zero_()
        self.n, self.seconds, self.flops = 0, 0.0, 0.0
        return out

    @staticmethod
    def record(sums: "WindowSums", peak_flops: float | None = None, **fields) -> TrainRecord:
        """The log line; with no applied step in the window the loss is unknown (None), not 0.
        ``peak_flops``: the FLOP/s of all ranks together that MFU is measured against."""
        loss, nll = (sums.loss / sums.tokens, sums.nll / sums.tokens) if sums.tokens else (None, None)
        mfu = sums.flops / max(sums.seconds, 1e-9) / peak_flops if peak_flops else None
        return TrainRecord(loss=loss, nll=nll, ppl=None if nll is None else math.exp(min(nll, 50)),
                           tokens_per_s=sums.tokens / max(sums.seconds, 1e-9), skipped=len(sums.skipped),
                           mfu=mfu, **fields)


@dataclass
class WindowSums:
    """What a flushed window holds, summed over the ranks and the window's applied steps."""
    loss: float
    nll: float
    tokens: float             # target tokens
    seconds: float            # training time of the window (the ranks' mean time per step, summed)
    skipped: list[int]        # the steps skipped on every rank
    in_a_row: int             # steps skipped in a row up to the last one
    flops: float = 0.0        # model FLOPs of the window's steps, all ranks


def read_rows(path: Path, warn: bool = True) -> list[dict]:
    """Every line of a run's ``metrics.jsonl`` (none when the run has not logged yet); a torn last
    line is dropped, with a warning unless ``warn`` is off (a live run's log may end mid-write)
    (:func:`~cll_scale.core.jsonfiles.read_json_lines`)."""
    return read_json_lines(path, warn)


class MetricsLogger:
    """The run's one metrics sink: each :meth:`log` call writes a ``metrics.jsonl`` line (rank 0;
    every line is one JSON object with a ``step``) and the same numbers to DeepSpeed's monitor
    (``monitor``: a callable taking ``(tag, value, step)`` events, given by the engine's owner)."""

    def __init__(self, path: Path, rank: int, monitor=None):
        self.path, self.rank, self.monitor = path, rank, monitor

    def log(self, record: dict | TrainRecord, events: dict[str, float]) -> None:
        """Write ``record`` and send ``events`` (monitor tag -> value) at its step."""
        row = asdict(record) if isinstance(record, TrainRecord) else record
        if self.rank == 0:
            with naming(self.path), open(self.path, "a", encoding="utf-8") as f:
                f.write(json_text(row, non_finite_as_null=True) + "\n")
        if self.monitor is not None:
            self.monitor([(tag, value, row["step"]) for tag, value in events.items() if value is not None])

    def truncate_after(self, step: int) -> int:
        """Drop the records a killed run wrote after its last checkpoint (all of them when it left
        none, ``step`` 0): the run writes those steps again, and a curve must not show them twice.
        Returns how many lines were dropped."""
        if self.rank != 0:
            return 0
        rows = read_json_lines(self.path)
        kept = [row for row in rows if row.get("step", 0) <= step]
        # A torn last line goes too: the next record appended after it would share its line.
        if len(kept) < len(rows) or rows.torn:
            write_atomic(self.path, "".join(json_text(row, non_finite_as_null=True) + "\n" for row in kept))
        return len(rows) - len(kept)


def device_peak_tflops(cfg: LogConfig, device: torch.device) -> tuple[float | None, str]:
    """The dense bf16 peak MFU is measured against, and where it comes from: ``log.peak_tflops``,
    else the datasheet table by CUDA device name; None on a CPU or an unlisted device."""
    if cfg.peak_tflops:
        return cfg.peak_tflops, "log.peak_tflops"
    if device.type != "cuda":
        return None, "no peak for a CPU; set log.peak_tflops to log MFU"
    name = torch.cuda.get_device_name(device)
    peak = peak_bf16_tflops(name)
    return peak, (f"{name}, datasheet table; log.peak_tflops overrides" if peak
                  else f"{name} is not in the datasheet table; set log.peak_tflops to log MFU")

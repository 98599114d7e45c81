"""How far each training of a study has come, and the time left at this sitting's rate: a bar per
model in a terminal, a plain line a minute otherwise (the trainings' own bars are off there)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from cll_scale.repro.plan import Budget
from cll_scale.repro.records import last_train_row
from cll_scale.training.rundir import RunDir


class Progress:
    """How far the trainings cll-repro runs have come, for the person watching, read from each
    run's metrics.jsonl (no pipe to the trainings, whose output may go to their train.log). In a
    terminal with several trainings at once (each one's own bar is in its log): a bar per model with
    its time left. Not in a terminal (a training's own bar is off there): a plain line per model
    every ``every_s`` seconds. One training in a terminal shows its own bar, and this nothing."""

    def __init__(self, budget: Budget, parallel: int, stream=None, every_s: float = 60.0):
        self.budget, self.stream, self.every_s = budget, stream or sys.stderr, every_s
        self.tty = self.stream.isatty()
        self.active = parallel > 1 or not self.tty
        self.first: dict[str, tuple[int, float]] = {}     # name -> (step, elapsed_s) first seen this sitting
        self.bars: dict = {}
        self.last_line = time.monotonic()

    def left(self, name: str, step: int, elapsed: float) -> float | None:
        """Seconds to the budget, at the rate of this sitting's steps so far; None before two readings."""
        step0, elapsed0 = self.first.setdefault(name, (step, elapsed))
        if step < step0 or elapsed < elapsed0:
            # A resumed training drops the rows logged after its checkpoint, and the first reading
            # may have been one of them (read before the training started): a rate measured from
            # it would come out zero or negative ("under a minute left" for an hour), so the
            # sitting's rate is measured from here.
            self.first[name] = step0, elapsed0 = step, elapsed
        estimates = [self.budget.minutes * 60 - elapsed] if self.budget.minutes else []
        if self.budget.steps and step > step0:
            estimates.append((self.budget.steps - step) * (elapsed - elapsed0) / (step - step0))
        return max(min(estimates), 0.0) if estimates else None

    def show(self, running: list[tuple[str, Path]], ended: str | None = None) -> None:
        """A bar or line per running model; ``ended``: how the one given ended (:func:`outcome`)."""
        if not self.active:
            return
        now = time.monotonic()
        lines = not self.tty and (ended is not None or now - self.last_line >= self.every_s)
        for name, run_dir in running:
            row = last_train_row(RunDir(run_dir).metrics(warn=ended is not None))
            step, elapsed = row.get("step", 0), row.get("elapsed_s", 0.0)
            left = self.left(name, step, elapsed) if row else None
            eta = ended if ended is not None else "time left: measuring" if left is None else \
                f"about {left / 60:.0f} min left" if left >= 60 else "under a minute left"
            total = f"/{self.budget.steps:,}" if self.budget.steps else ""
            if self.tty:
                if name not in self.bars:
                    from tqdm.auto import tqdm
                    self.bars[name] = tqdm(total=self.budget.steps or None, desc=name, unit="step",
                                           position=len(self.bars), file=self.stream, dynamic_ncols=True)
                bar = self.bars[name]
                bar.n = step
                bar.set_postfix_str(eta, refresh=True)
            elif lines:
                print(f"[cll-repro] {name}: step {step:,}{total}, {eta}", file=self.stream, flush=True)
        if lines:
            self.last_line = now

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()

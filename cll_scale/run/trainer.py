"""The training loop of ``cll-train``: a :class:`Trainer` trains a run that
:func:`cll_scale.run.build.build_run` built (stream, model, engine, checkpointer, validator, metrics)
to its budget; a stop signal ends it at a step boundary with a checkpoint. The command line is
:mod:`cll_scale.train`, the dry run :mod:`cll_scale.run.dryrun`.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import asdict

import torch
from tqdm.auto import tqdm

from cll_scale.core import faults
from cll_scale.evaluation.plots import plot_training_curves
from cll_scale.model.model import train_flops
from cll_scale.run.build import Run, log
from cll_scale.training import collectives
from cll_scale.training.metrics import MetricsWindow, read_rows
from cll_scale.training.rundir import BEST_EXPORT
from cll_scale.training.skips import NonFiniteSkip, OutOfMemorySkip


class Interrupted(RuntimeError):
    """Training was asked to stop (SIGTERM, SIGUSR1) and checkpointed first: re-run to resume."""
    HINT = "the same command with --resume continues from there"

    def __init__(self, signum: int, step: int, hint: str = HINT):
        # signum 0: this rank got no signal, another one did (every rank stops at the same step)
        self.step, self.exit_code, self.hint = step, 128 + (signum or signal.SIGTERM), hint
        by = signal.Signals(signum).name if signum else "a stop signal to another rank"
        super().__init__(f"stopped by {by} at step {step}, after saving its checkpoint")


# Schedulers announce the end of a job with these: SIGTERM (SLURM at the time limit or on preemption,
# Kubernetes, the deepspeed launcher passing on its own SIGTERM) and SIGUSR1 (SLURM's --signal=USR1@T);
# SIGINT is Ctrl-C. Each ends the run after the current step with a checkpoint; a second Ctrl-C
# stops at once (during a long validation, say).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopSignals:
    """Within the block, a stop signal (:data:`STOP_SIGNALS`) is only noted (``signum``): the loop
    checkpoints and stops at the next step boundary, on every rank at the same step. A second
    Ctrl-C stops at once (during a long validation, say). Handlers live in the main thread; a
    Trainer run from another thread gets none."""

    def __init__(self, rank: int):
        self.rank, self.signum, self._previous = rank, 0, {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._noted) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _noted(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if signum == signal.SIGINT and self.rank == 0:
            print("\n[cll-train] Ctrl-C: stopping after this step with a checkpoint (again to stop at once)",
                  file=sys.stderr, flush=True)
        self.signum = signum


class Trainer:
    """Trains a :class:`~cll_scale.run.build.Run` to its budget.

    The loop reads no device value except at log steps (:class:`MetricsWindow`): skipping a
    non-finite step is decided on the device (:class:`GuardedAdamW`), and the per-step agreement
    between ranks (stop signal, budget) travels over a host-side group."""

    def __init__(self, run: Run, resume_hint: str = Interrupted.HINT):
        """``resume_hint``: how the command that runs this Trainer continues after a stop signal."""
        self.run, self.resume_hint = run, resume_hint
        self.cfg, self.engine, self.stream, self.state = run.cfg, run.engine, run.stream, run.state
        self.rank, self.world, self.device = run.rank, run.world, run.device
        self.stop = StopSignals(self.rank)
        self.window = MetricsWindow(self.device, self.cfg.log.every)
        self.oom = OutOfMemorySkip(self.rank, self.device, self.cfg.model.pad_id)
        self.non_finite = NonFiniteSkip(self.cfg.train.max_skips_in_a_row, lambda message: log(self.rank, message))

    def train(self) -> dict:
        """Train to the budget. A stop signal ends the run at the next step boundary with a
        checkpoint (``Interrupted``), so a preempted job loses at most one step."""
        try:
            with self.stop, self.run.matmuls():
                return self._train()
        finally:
            self.run.close()

    def _train(self) -> dict:
        bar = tqdm(total=self.cfg.train.max_steps or None, initial=self.state.step, disable=self.rank != 0 or None,
                   desc="train", unit="step", dynamic_ncols=True)
        last: dict = {}
        self.engine.train()
        while not self._budget_spent():
            stop, record = self.run_step()
            bar.update(1)
            if record:
                last = record
                bar.set_postfix(loss=record["loss"] and f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            if stop:      # before validation, which can outlast a scheduler's grace period (SLURM
                          # KillWait: 30 s); a validation due at this step is skipped
                bar.close()
                self.save()
                collectives.shutdown()      # every rank is here: the process is about to end
                raise Interrupted(self.stop.signum, self.state.step, self.resume_hint)
            if self.run.validator.due(self.state.step):
                last.update(self._validate_and_select())
            if self.run.checkpointer.due(self.state.step):
                self.save()
        bar.close()
        if self.run.validator.split is not None and not self.run.validator.due(self.state.step):
            last.update(self._validate_and_select())
        tag = self.save()
        if self.rank == 0:
            run_dir = self.run.run_dir
            plot_training_curves(read_rows(self.run.metrics.path), run_dir.name, run_dir / "curves.png")
        if self.cfg.checkpoint.export:
            self.run.export(tag, self.engine.get_lr()[0])
        collectives.barrier()
        return {"step": self.state.step, **last}

    def run_step(self) -> tuple[bool, dict | None]:
        """One step of the loop: train it, agree with the other ranks, account for it, and write the
        log record at ``log.every``. Returns (stop requested on some rank, the record if logged)."""
        t_step = time.perf_counter()
        loss, nll, tokens, ok, flops = self.train_step()
        st = self.state
        st.step += 1
        # Per-step agreement on host numbers: every rank stops at the same step, and the stop flag
        # rides along because launchers signal ranks one after another (deepspeed's waits up to
        # 30 s per rank) while every rank must checkpoint the same step.
        seconds, epoch, seen, all_flops, stop = collectives.host_all_reduce(
            [time.perf_counter() - t_step, self.stream.epoch, tokens, flops, float(bool(self.stop.signum))])
        st.elapsed += seconds / self.world
        st.epoch = epoch / self.world
        st.tokens_seen += int(seen)
        self.window.add(st.step, loss, nll, tokens, ok, seconds / self.world, all_flops)
        record = None
        if st.step % self.cfg.log.every == 0 or self._budget_spent():
            record = self._log_train()
        return bool(stop), record

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, float]:
        """One optimizer step of ``grad_accum`` microbatches. Returns the summed loss and NLL
        (device), the target tokens and model FLOPs (host) and whether the step was applied on
        every rank (device): nothing here waits for the device."""
        guard, zero = self.run.guard, torch.zeros((), dtype=torch.float32, device=self.device)
        loss_sum, nll_sum, ok = zero.clone(), zero.clone(), torch.ones((), dtype=torch.bool, device=self.device)
        tokens, flops, calls = 0, 0.0, guard.steps_called if guard else 0
        for _ in range(self.cfg.train.grad_accum):
            batch = next(self.stream)
            loss, nll, finite = self._forward_backward(batch)
            loss_sum += loss.detach().float()
            nll_sum += nll.float()
            tokens += batch.ntokens
            flops += train_flops(self.cfg.model, len(batch), batch.src_tokens.shape[1], batch.tgt_tokens.shape[1])
            ok = ok & finite
            if guard:
                guard.loss_ok = ok           # the optimizer adds the gradients' verdict
            self.engine.step()
        if guard:   # not called: DeepSpeed's own overflow check (fp16 configs) dropped the step
            ok = guard.last_ok if guard.steps_called > calls else torch.zeros_like(ok)
        return loss_sum, nll_sum, tokens, ok, flops

    def _forward_backward(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward and backward of one microbatch: (loss, nll, finite)."""
        eng, step = self.engine, self.state.step + 1
        try:
            dev = batch.to(self.device)
            if faults.hit("oom", step):
                raise torch.OutOfMemoryError("injected by CLL_FAULT")
            loss, nll = self.run.loss(dev)
            oom = False
        except torch.OutOfMemoryError:
            oom = True       # handled outside the except block, whose traceback holds the memory
        if oom:
            dev = None     # noqa: F841 (frees the failed pass's memory first)
            loss, nll = self.oom.stand_in(eng, batch, step)
        if self.run.touch_lsls:
            loss = loss + eng.module.lsl_zero()
        if faults.hit("nan", step):
            loss = loss * float("nan")
        finite = torch.zeros((), dtype=torch.bool, device=self.device) if oom else torch.isfinite(loss)
        try:
            eng.backward(loss / max(batch.ntokens, 1))   # per-token mean per microbatch; DeepSpeed
        except torch.OutOfMemoryError:                   # averages over accumulation and ranks
            raise self.oom.in_backward(batch, step) from None
        return loss, nll, finite

    def _budget_spent(self) -> bool:
        # Decided from all-reduced numbers only, so every rank stops at the same step.
        return self.cfg.train.budget_spent(self.state.step, self.state.epoch, self.state.elapsed)

    def _log_train(self) -> dict:
        sums = self.window.flush()      # the loop's one device read
        self.non_finite.check(sums, self.state.step, self.run.checkpointer.latest())
        guard = self.run.guard
        grad_norm = guard.grad_norm if guard else self.engine.get_global_grad_norm()
        record = self.window.record(sums, self.run.peak_flops, step=self.state.step, lr=self.engine.get_lr()[0],
                                    epoch=self.state.epoch, grad_norm=None if grad_norm is None else float(grad_norm),
                                    elapsed_s=self.state.elapsed, tokens_seen=self.state.tokens_seen)
        self.run.metrics.log(record, {f"Train/{k}": getattr(record, k) for k in TRAIN_EVENTS})
        return asdict(record)

    def _validate_and_select(self) -> dict:
        """Validate; on a new best of ``valid.best_metric`` save a checkpoint and export it to
        ``export-best/``."""
        result = self.run.validator.run(self.engine, self.state.step)     # only where there is a split
        scores = result.scores
        self.run.metrics.log(result.record, {f"Valid/{k}": v for k, v in scores.items()})
        log(self.rank, f"step {self.state.step}: valid nll {scores['valid_nll']:.3f}"
            + (f", zero-shot {scores['valid_zero_shot_nll']:.3f}" if "valid_zero_shot_nll" in scores else ""))
        if self.run.validator.is_new_best(scores):
            tag = self.save()
            if self.cfg.checkpoint.export:
                best = {"metric": self.cfg.valid.best_metric, "step": self.state.step}
                self.run.export(tag, self.engine.get_lr()[0], BEST_EXPORT, {"best": {**best, "value": scores[best["metric"]]}})
        return scores

    def save(self) -> str:
        return self.run.checkpointer.save(self.engine, self.state.step)


TRAIN_EVENTS = ("loss", "nll", "lr", "tokens_per_s", "mfu")    # monitor tags Train/<name>

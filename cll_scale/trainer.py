"""The training loop of ``cll-train``: a :class:`Trainer` builds a run from a recipe (manifest,
stream, model, DeepSpeed engine, checkpointer, validator) and trains it to its budget; a stop
signal ends it at a step boundary with a checkpoint. The command line is :mod:`cll_scale.train`,
the dry run :mod:`cll_scale.dryrun`.
"""
from __future__ import annotations

import fnmatch
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from cll_scale import engine as ds
from cll_scale import faults
from cll_scale.checkpointer import BEST_EXPORT, Checkpointer, git_commit
from cll_scale.cli import DeviceError
from cll_scale.config import LEGACY_MODEL, build_configs
from cll_scale.export import export_model_config, load_export
from cll_scale.manifest import Manifest
from cll_scale.metrics import MetricsLog, MetricsWindow
from cll_scale.model import CLLTransformer, label_smoothed_loss
from cll_scale.optim import GuardedAdamW, inverse_sqrt
from cll_scale.outputs import DirLock, check_apart, check_owner, json_text, write_atomic
from cll_scale.stream import ShardStream
from cll_scale.validator import Validator


class Interrupted(RuntimeError):
    """Training was asked to stop (SIGTERM, SIGUSR1) and checkpointed first: re-run to resume."""
    HINT = "the same command with --resume continues from there"

    def __init__(self, signum: int, step: int, hint: str = HINT):
        # signum 0: this rank got no signal, another one did (every rank stops at the same step)
        self.step, self.exit_code, self.hint = step, 128 + (signum or signal.SIGTERM), hint
        by = signal.Signals(signum).name if signum else "a stop signal to another rank"
        super().__init__(f"stopped by {by} at step {step}, after saving its checkpoint")


class OutOfMemory(DeviceError):
    """The device ran out of memory where the step cannot be skipped (the backward pass)."""


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


def local_part() -> tuple[int, int]:
    """This process's index among the processes of its node, and their number (torchrun says
    ``LOCAL_WORLD_SIZE``, DeepSpeed's launcher ``LOCAL_SIZE``; alone: ``(0, 1)``)."""
    size = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or os.environ.get("WORLD_SIZE", "1")
    return int(os.environ.get("LOCAL_RANK", 0)), max(1, int(size))


def set_threads() -> None:
    """One thread per rank when ranks share the CPU cores: measured on 2 cores, 20 steps of two
    ranks took 0.35 s with one thread each and 2.34 s with two."""
    if torch.cuda.is_available():
        return
    n = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(int(n) if n else max(1, (os.cpu_count() or 1) // local_part()[1]))


def frozen_names(names: list[str], patterns: list[str]) -> set[str]:
    """The parameter names that ``train.freeze`` globs select; a glob that selects nothing is an
    error, not a silent no-op (a typo would otherwise train what was meant to stay fixed)."""
    frozen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            raise ValueError(f"freeze pattern {pattern!r} matches no parameter (names look like "
                             f"{names[0]}, {names[-1]})")
        frozen.update(hits)
    return frozen


class Trainer:
    """Builds the run from a recipe and trains it; DeepSpeed only through :mod:`cll_scale.engine`.

    The loop reads no device value except at log steps (:class:`MetricsWindow`): skipping a
    non-finite step is decided on the device (:class:`GuardedAdamW`), and the per-step agreement
    between ranks (stop signal, budget) travels over a host-side group."""

    def __init__(self, recipe: dict, resume: bool = False, resume_hint: str = Interrupted.HINT):
        """``resume_hint``: how the command that runs this Trainer continues after a stop signal."""
        self.resume_hint = resume_hint
        set_threads()
        self.rank, self.world, _ = ds.init_distributed()
        data_dir = recipe.get("train", {}).get("data")
        if not data_dir:
            raise ValueError("no shard directory: set train.data in the recipe or pass --data")
        self.manifest = Manifest.load(data_dir)
        init_from = recipe.get("train", {}).get("init_from")
        if init_from:   # the architecture comes from the export; recipe model fields still override
            recipe = {**recipe, "model": {**export_model_config(init_from), **recipe.get("model", {})}}
        self.model_cfg, self.stream_cfg, self.cfg = build_configs(
            recipe, self.manifest.languages, self.manifest.central_language, self.manifest.tokenizer)
        if init_from and (self.model_cfg.languages != self.manifest.languages
                          or self.model_cfg.vocab_size != self.manifest.tokenizer.vocab_size):
            raise ValueError(f"{init_from} was built for languages {self.model_cfg.languages} and "
                             f"{self.model_cfg.vocab_size} subwords, {data_dir} has "
                             f"{self.manifest.languages} and {self.manifest.tokenizer.vocab_size}")
        if not (self.cfg.max_steps or self.cfg.max_minutes or self.cfg.max_epochs):
            raise ValueError("no budget: set --max-steps, --max-minutes and/or train.max_epochs")
        self.run_dir = Path(self.cfg.run_dir)
        if resume and not self.run_dir.is_dir():
            raise FileNotFoundError(f"--resume: {self.run_dir} does not exist, so there is nothing to resume; "
                                    "check --run-dir, or drop --resume to start a new run")
        check_owner(self.run_dir, "cll-train", "--run-dir")
        check_apart(self.run_dir, {"--data": data_dir, "train.init_from": init_from}, "--run-dir")
        # One process writes a run directory (rank 0 of the run holds the lock until train() ends).
        self.lock = ds.on_rank0(DirLock(self.run_dir, "training run").acquire, str(self.run_dir))
        try:
            self._build(recipe, resume, data_dir)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the run directory (train() does it when it ends)."""
        if self.lock is not None:
            self.lock.release()

    def _build(self, recipe: dict, resume: bool, data_dir: str) -> None:
        self.checkpointer = Checkpointer(self.run_dir, self.cfg.ckpt_every, self.cfg.keep_last, self.rank)
        if self.checkpointer.exists() and not resume:
            raise FileExistsError(f"{self.run_dir} already has checkpoints; pass --resume to continue "
                                  f"it, or choose another run directory")
        tag, universal = self.checkpointer.resumable_tag(self.world, self.log)
        if resume and not tag:
            self.log(f"warning: --resume, but {self.run_dir} holds no checkpoint yet: training starts at step 0")
        if tag:
            self._check_recorded_settings()
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        # The stream checks the shards first: a damaged one stops the run before anything starts
        # (the rank that finds it raises; the launcher then stops the others). The processes of
        # a node share the hashing of its files, so each byte is read once per node.
        self.stream = ShardStream(data_dir, self.stream_cfg, self.rank, self.world, verify_part=local_part())
        torch.manual_seed(self.cfg.seed)        # identical initial weights on every rank
        self.model = CLLTransformer(self.model_cfg)
        self.frozen = self._init_and_freeze(tag)
        # ZeRO-2 reduces gradients in buckets filled as parameters get theirs: ranks whose mixed
        # batches hold different target languages would fill different buckets, and their
        # collectives would not pair. A zero term gives every rank every LSL's gradient (zeros for
        # an absent language, which ZeRO-2's flat buffers hold for it anyway).
        self.touch_lsls = self.world > 1 and self.stream.mixed and len(self.model.lsl) > 0
        self.loss_fn = label_smoothed_loss
        if self.cfg.compile:
            backends = torch._dynamo.list_backends(exclude_tags=())
            if self.cfg.compile not in backends:
                raise ValueError(f"train.compile={self.cfg.compile!r} is not a torch.compile backend "
                                 f"({', '.join(backends)}; \"\" for none)")
            # Compiled in place (parameter names unchanged); the loss fuses log-softmax, gather and
            # sums, so the fp32 (tokens x vocabulary) log-probabilities are never written out.
            self.model.compile_blocks(self.cfg.compile)
            self.loss_fn = torch.compile(label_smoothed_loss, backend=self.cfg.compile, dynamic=True)
        self.data_fingerprint = self.manifest.fingerprint("train")
        ds_cfg = ds.make_ds_config(self.cfg.ds_config, self.cfg, self.world, self.run_dir, universal)
        self.optimizer = None             # set by _optimizer unless the DeepSpeed config brings its own
        self._ds_cfg = ds_cfg
        self.engine = ds.initialize(self.model, ds_cfg, self._optimizer, self._scheduler)
        # The client optimizer that decides skips on the device (None: DeepSpeed's own optimizer)
        self.guard = self.optimizer if isinstance(self.optimizer, GuardedAdamW) else None
        self.device = self.engine.device
        self.step, self.elapsed, self.tokens_seen = 0, 0.0, 0
        self.epoch = 0.0    # of the current train.data, averaged over ranks (the same on every rank)
        self.stop = StopSignals(self.rank)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", self.rank)
        torch.manual_seed(self.cfg.seed * 1000 + self.rank)   # dropout differs between ranks
        if tag:
            self._restore(tag, universal)
        dropped = self.metrics.truncate_after(self.step)
        if dropped and not tag:
            self.log(f"dropped {dropped} metrics.jsonl lines of an earlier attempt that left no checkpoint")
        self.validator = Validator(self.cfg, self.stream_cfg, self.manifest, self.rank, self.world, self.device,
                                   self.checkpointer.best_so_far(self.cfg.best_metric, self.step))
        self.window = MetricsWindow(self.device, self.cfg.log_every)
        if self.rank == 0:
            resolved = {"preset": recipe.get("preset", "small"), "model": self.model_cfg.to_json(),
                        "data": asdict(self.stream_cfg), "train": asdict(self.cfg)}
            write_atomic(self.run_dir / "config.json", json_text(resolved, indent=1))
            write_atomic(self.run_dir / "ds_config.json", json_text(ds_cfg, indent=1))
            (self.run_dir / "git.txt").write_text(git_commit() + "\n")
        if self.validator.split is None:
            self.log("the shards have no validation split: no validation, and no export-best/")

    # -- construction helpers -----------------------------------------------------------------
    def _check_recorded_settings(self) -> None:
        """A resume must rebuild the model the run trained: other settings (another preset, other
        shards' vocabulary or languages) are refused before anything is loaded."""
        path = self.run_dir / "config.json"
        if not path.is_file():
            return
        recorded = {**LEGACY_MODEL, **json.loads(path.read_text()).get("model", {})}
        now = self.model_cfg.to_json()
        diff = [f"model.{k}={recorded[k]!r} (now {now[k]!r})" for k in sorted(now)
                if k in recorded and recorded[k] != now[k] and k != "languages"]
        if recorded.get("languages", now["languages"]) != now["languages"]:
            diff.append(f"languages {recorded['languages']} (now {now['languages']})")
        if diff:
            raise ValueError(f"--resume: {self.run_dir} was trained with " + ", ".join(diff)
                             + "; resume with the run's own settings, or train into another --run-dir")

    def _init_and_freeze(self, tag: str | None) -> dict[str, torch.Tensor]:
        """Start from ``init_from`` (unless a checkpoint takes over) and freeze the parameters
        matching ``freeze``. Returns the frozen tensors as ``init_from`` has them: under bf16
        DeepSpeed keeps no fp32 master copy of a parameter it does not train, so exports take them
        from here."""
        cfg = self.cfg
        # A resumed run takes its weights from the checkpoint: the export is read only for the
        # values of frozen parameters.
        needed = cfg.init_from and (not tag or cfg.freeze)
        init = load_export(cfg.init_from)[0].state_dict() if needed else None
        if init is not None and not tag:
            self.model.load_state_dict(init, strict=True)
        frozen = frozen_names([n for n, _ in self.model.named_parameters()], cfg.freeze)
        for name, param in self.model.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
        if frozen:
            self.log(f"{len(frozen)} parameter tensors frozen")
        # Without init_from the checkpoint's consolidated copy is all there is.
        return {n: init[n].clone() for n in frozen} if init is not None else {}

    def _optimizer(self, model):
        self.optimizer = GuardedAdamW([p for p in model.parameters() if p.requires_grad],
                                      clip_norm=self.cfg.clip_norm, partitioned=ds.zero_stage(self._ds_cfg) > 0,
                                      lr=self.cfg.lr, betas=self.cfg.betas, eps=self.cfg.eps,
                                      weight_decay=self.cfg.weight_decay)
        return self.optimizer

    def _scheduler(self, optimizer):
        factor, offset = inverse_sqrt(self.cfg.warmup_steps), self.cfg.schedule_offset
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(step + offset))

    def _restore(self, tag: str, universal: bool) -> None:
        client = self.checkpointer.restore(self.engine, tag)
        self.step, self.elapsed = int(client["step"]), float(client["elapsed"])
        self.tokens_seen = int(client.get("tokens_seen", 0))
        streams, rngs = client["streams"], client["rng"]
        if client.get("data", self.data_fingerprint) != self.data_fingerprint:
            if not self.cfg.new_data:
                raise ValueError(f"the training shards of {self.cfg.data} are not the ones "
                                 f"{self.checkpointer.dir / tag} was trained on; to continue this run on new "
                                 f"data pass --set train.new_data=true (the data stream then starts afresh)")
            self.log(f"continuing {self.checkpointer.dir / tag} on new data ({self.cfg.data}): weights, "
                     f"optimizer and schedule carry on, the data stream starts afresh")
        elif len(streams) == self.world and not universal:
            self.stream.load_state_dict(streams[self.rank])
            torch.set_rng_state(rngs[self.rank])
        else:   # another world size: slices differ, so each direction restarts its current pool
            self.stream.load_state_dict(streams[0], strict_world=False)
        self.epoch = ds.host_all_reduce([self.stream.epoch])[0] / self.world
        self.log(f"resumed from {self.checkpointer.dir / tag} at step {self.step}"
                 + (" (universal checkpoint, world size changed)" if universal else ""))

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> dict:
        """Train to the budget. A stop signal ends the run at the next step boundary with a
        checkpoint (``Interrupted``), so a preempted job loses at most one step."""
        try:
            with self.stop:
                return self._train()
        finally:
            self.close()

    def _train(self) -> dict:
        cfg = self.cfg
        bar = tqdm(total=cfg.max_steps or None, initial=self.step, disable=self.rank != 0 or None,
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
                ds.shutdown()      # every rank is here: the process is about to end
                raise Interrupted(self.stop.signum, self.step, self.resume_hint)
            if self.validator.due(self.step):
                last.update(self._validate_and_select())
            if self.checkpointer.due(self.step):
                self.save()
        bar.close()
        if self.validator.split is not None and not self.validator.due(self.step):
            last.update(self._validate_and_select())
        tag = self.save()
        if self.rank == 0:
            from cll_scale.plots import plot_training_curves
            plot_training_curves(self.metrics.path, self.run_dir / "curves.png")
        if cfg.export:
            self.export(tag)
        ds.barrier()
        return {"step": self.step, **last}

    def run_step(self) -> tuple[bool, dict | None]:
        """One step of the loop: train it, agree with the other ranks, account for it, and write the
        log record at ``log_every``. Returns (stop requested on some rank, the record if logged)."""
        t_step = time.perf_counter()
        loss, nll, tokens, ok = self.train_step()
        self.step += 1
        # Per-step agreement on host numbers: every rank stops at the same step, and the stop flag
        # rides along because launchers signal ranks one after another (deepspeed's waits up to
        # 30 s per rank) while every rank must checkpoint the same step.
        seconds, epoch, seen, stop = ds.host_all_reduce(
            [time.perf_counter() - t_step, self.stream.epoch, tokens, float(bool(self.stop.signum))])
        self.elapsed += seconds / self.world
        self.epoch = epoch / self.world
        self.tokens_seen += int(seen)
        self.window.add(self.step, loss, nll, tokens, ok, seconds / self.world)
        record = None
        if self.step % self.cfg.log_every == 0 or self._budget_spent():
            record = self._log_train()
        return bool(stop), record

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """One optimizer step of ``grad_accum`` microbatches. Returns the summed loss and NLL
        (device), the target tokens (host) and whether the step was applied on every rank
        (device): nothing here waits for the device."""
        eng = self.engine
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        ok = torch.ones((), dtype=torch.bool, device=self.device)
        tokens = 0
        calls = self.guard.steps_called if self.guard else 0
        for _ in range(self.cfg.grad_accum):
            batch = next(self.stream)
            loss, nll, finite = self._forward_backward(batch)
            loss_sum += loss.detach().float()
            nll_sum += nll.float()
            tokens += batch.ntokens
            ok = ok & finite
            if self.guard:
                self.guard.loss_ok = ok           # the optimizer adds the gradients' verdict
            eng.step()
        if self.guard:
            # Not called: DeepSpeed's own overflow check (fp16 configs) dropped the step.
            ok = self.guard.last_ok if self.guard.steps_called > calls else torch.zeros_like(ok)
        return loss_sum, nll_sum, tokens, ok

    def _forward_backward(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward and backward of one microbatch: (loss, nll, finite). Out of memory in the
        forward pass skips the step on every rank: this rank back-propagates a zero loss of one
        short row of the same target language instead, so its gradient reductions still pair
        with the other ranks' (fairseq recovers the same way)."""
        eng, model = self.engine, self.engine.module
        try:
            dev = batch.to(self.device)
            if faults.hit("oom", self.step + 1):
                raise torch.OutOfMemoryError("injected by CLL_FAULT")
            logits = eng(dev.src_tokens, model.shift_right(dev.tgt_tokens), dev.tgt_lang, lang_runs=dev.lang_runs)
            loss, nll = self.loss_fn(logits, dev.tgt_tokens, self.model_cfg.pad_id, self.cfg.label_smoothing)
            oom = False
        except torch.OutOfMemoryError:
            oom = True       # handled below, outside the except block, whose traceback holds the memory
        if oom:
            dev = logits = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"[cll-train] rank {self.rank}, step {self.step + 1}: out of memory on a {batch.direction} "
                  f"batch of {len(batch)} rows x {batch.src_tokens.shape[1]} source / "
                  f"{batch.tgt_tokens.shape[1]} target tokens; the step is skipped on every rank",
                  file=sys.stderr, flush=True)
            dev = batch.head(rows=1, tokens=2).to(self.device)
            logits = eng(dev.src_tokens, model.shift_right(dev.tgt_tokens), dev.tgt_lang, lang_runs=dev.lang_runs)
            loss, nll = label_smoothed_loss(logits, dev.tgt_tokens, self.model_cfg.pad_id, 0.0)
            loss, nll = loss * 0.0, nll * 0.0
        if self.touch_lsls:
            loss = loss + model.lsl_zero()
        if faults.hit("nan", self.step + 1):
            loss = loss * float("nan")
        finite = torch.zeros((), dtype=torch.bool, device=self.device) if oom else torch.isfinite(loss)
        try:
            # Per-token mean per microbatch; DeepSpeed averages over accumulation and ranks.
            eng.backward(loss / max(batch.ntokens, 1))
        except torch.OutOfMemoryError:
            raise OutOfMemory(
                f"out of memory in the backward pass of step {self.step + 1} ({batch.direction}, {len(batch)} rows x "
                f"{batch.tgt_tokens.shape[1]} target tokens): gradient reductions may already be under way, so "
                f"this step cannot be skipped; lower data.max_tokens and --resume from the last checkpoint") from None
        return loss, nll, finite

    def _budget_spent(self) -> bool:
        # Decided from all-reduced numbers only, so every rank stops at the same step.
        return self.cfg.budget_spent(self.step, self.epoch, self.elapsed)

    # -- logging, validation, checkpoints, export -----------------------------------------------------
    def _log_train(self) -> dict:
        sums = self.window.flush()      # the loop's one device read
        for step in sums.skipped:
            self.log(f"step {step}: non-finite loss or gradients, or out of memory, on some rank; the step was "
                     f"skipped on every rank (weights and optimizer state unchanged)")
        if sums.in_a_row >= self.cfg.max_skips_in_a_row:
            raise FloatingPointError(f"{sums.in_a_row} steps in a row skipped (non-finite or out of memory) up to step "
                                     f"{self.step}: training diverged or the batches do not fit; the last good "
                                     f"checkpoint is {self.checkpointer.latest()}")
        grad_norm = self.guard.grad_norm if self.guard else self.engine.get_global_grad_norm()
        record = self.window.record(sums, step=self.step, lr=self.engine.get_lr()[0], epoch=self.epoch,
                                    grad_norm=None if grad_norm is None else float(grad_norm),
                                    elapsed_s=self.elapsed, tokens_seen=self.tokens_seen)
        self.metrics.write(record)
        ds.monitor_events(self.engine, [("Train/loss", record.loss, self.step), ("Train/nll", record.nll, self.step),
                                        ("Train/lr", record.lr, self.step),
                                        ("Train/tokens_per_s", record.tokens_per_s, self.step)])
        return asdict(record)

    def _validate_and_select(self) -> dict:
        """Validate; on a new best of ``best_metric`` save a checkpoint and export it to
        ``export-best/``."""
        out, record = self.validator.run(self.engine, self.step)
        if not record:
            return out
        self.metrics.write(record)
        ds.monitor_events(self.engine, [(f"Valid/{k}", v, self.step) for k, v in out.items()])
        self.log(f"step {self.step}: valid nll {out['valid_nll']:.3f}"
                 + (f", zero-shot {out['valid_zero_shot_nll']:.3f}" if "valid_zero_shot_nll" in out else ""))
        if self.validator.is_new_best(out):
            tag = self.save()
            if self.cfg.export:
                metric = self.cfg.best_metric
                self.export(tag, BEST_EXPORT, {"best": {"metric": metric, "value": out[metric], "step": self.step}})
        return out

    def save(self) -> str:
        def client_state() -> dict:
            return {"step": self.step, "elapsed": self.elapsed, "tokens_seen": self.tokens_seen,
                    "data": self.data_fingerprint, "streams": ds.all_gather_object(self.stream.state_dict()),
                    "rng": ds.all_gather_object(torch.get_rng_state())}
        return self.checkpointer.save(self.engine, self.step, client_state)

    def export(self, tag: str, name: str = "export", info: dict | None = None) -> None:
        path = self.checkpointer.export(tag, self.frozen, self.model_cfg, self.cfg.data,
                                        {"step": self.step, "lr": self.engine.get_lr()[0],
                                         "lang_tag": self.stream_cfg.add_lang_tag, **(info or {})}, name)
        if path is not None:
            self.log(f"exported {path}" + (f" ({info})" if info else ""))

    def log(self, message: str) -> None:
        if self.rank == 0:
            tqdm.write(f"[cll-train] {message}", file=sys.stderr)

"""``cll-train``: train a CLL Transformer with DeepSpeed ZeRO-2.

    cll-train --recipe recipes/multi30k_centered_fcll.yaml                     # one process
    deepspeed --num_gpus 2 -m cll_scale.train --recipe R                        # 2 ranks
    deepspeed --num_nodes N --num_gpus G --hostfile H -m cll_scale.train --recipe R
    cll-train --recipe R --resume                                               # continue

The recipe gives the preset, ``model``, ``data`` (stream) and ``train`` sections; ``--set
section.key=value`` overrides any field. The run directory receives the resolved config, the
DeepSpeed config, the git commit, metrics (JSON lines and DeepSpeed's monitor), checkpoints,
the training-curve PNG and ``export/``.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from cll_scale import engine as ds
from cll_scale.config import PRESETS, apply_overrides, build_configs, load_recipe
from cll_scale.export import export_model_config, load_export, write_export
from cll_scale.manifest import Manifest
from cll_scale.outputs import write_atomic
from cll_scale.model import CLLTransformer, label_smoothed_loss
from cll_scale.stream import ShardStream, eval_batches

MAX_CONSECUTIVE_SKIPS = 50
BEST_EXPORT = "export-best"     # the checkpoint chosen on validation (TrainConfig.best_metric)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous one is untouched."""


class Interrupted(RuntimeError):
    """Training was asked to stop (SIGTERM, SIGUSR1) and checkpointed first: re-run to resume."""

    def __init__(self, signum: int, step: int):
        # signum 0: this rank got no signal, another one did (every rank stops at the same step)
        self.step, self.exit_code = step, 128 + (signum or signal.SIGTERM)
        by = signal.Signals(signum).name if signum else "a stop signal to another rank"
        super().__init__(f"stopped by {by} at step {step}, after saving its checkpoint")


# Schedulers announce the end of a job with these: SIGTERM (SLURM at the time limit or on preemption,
# Kubernetes, the deepspeed launcher passing on its own SIGTERM) and SIGUSR1 (SLURM's --signal=USR1@T).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def inverse_sqrt(warmup: int):
    """Linear warm-up to the peak, then ∝ 1/sqrt(step) (Vaswani et al. 2017; paper App. A)."""
    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))
    return factor


def set_threads() -> None:
    """One thread per rank when ranks share the CPU cores (ECOSYSTEM.md: 7× faster than two)."""
    if torch.cuda.is_available():
        return
    n = os.environ.get("OMP_NUM_THREADS")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    torch.set_num_threads(int(n) if n else max(1, (os.cpu_count() or 1) // max(1, local_world)))


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
        return head + (" (uncommitted changes)" if dirty.strip() else "") if head else "unknown"
    except OSError:
        return "unknown"


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
    """The loop and its bookkeeping; DeepSpeed only through :mod:`cll_scale.engine`."""

    def __init__(self, recipe: dict, resume: bool = False):
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
        self.ckpt_dir = self.run_dir / "checkpoints"
        tag = ds.latest_tag(self.ckpt_dir)
        if tag and not resume:
            raise FileExistsError(f"{self.run_dir} already has checkpoints; pass --resume to continue "
                                  f"it, or choose another run directory")
        universal = bool(tag) and ds.checkpoint_world_size(self.ckpt_dir, tag) != self.world
        if universal:
            tag = ds.convert_to_universal(self.ckpt_dir, tag)
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        # The stream checks the shards first: a damaged one stops the run before anything starts.
        self.stream = ShardStream(data_dir, self.stream_cfg, self.rank, self.world)
        torch.manual_seed(self.cfg.seed)        # identical initial weights on every rank
        self.model = CLLTransformer(self.model_cfg)
        self.frozen = self._init_and_freeze(tag)
        self.data_fingerprint = self.manifest.fingerprint("train")
        ds_cfg = ds.make_ds_config(self.cfg.ds_config, self.cfg, self.world, self.run_dir, universal)
        self.engine = ds.initialize(self.model, ds_cfg, self._optimizer, self._scheduler)
        self.device = self.engine.device
        self.step, self.elapsed, self.tokens_seen = 0, 0.0, 0
        self.epoch = 0.0    # of the current train.data, averaged over ranks (the same on every rank)
        self._faults_done: set[str] = set()
        self._saved = (None, None)       # (step, tag) of the newest checkpoint this process wrote
        torch.manual_seed(self.cfg.seed * 1000 + self.rank)   # dropout differs between ranks
        if tag:
            self._restore(tag, universal)
        self.best = self._best_so_far()
        if self.rank == 0:
            resolved = {"preset": recipe.get("preset", "small"), "model": self.model_cfg.to_json(),
                        "data": asdict(self.stream_cfg), "train": asdict(self.cfg)}
            write_atomic(self.run_dir / "config.json", json.dumps(resolved, indent=1))
            write_atomic(self.run_dir / "ds_config.json", json.dumps(ds_cfg, indent=1))
            (self.run_dir / "git.txt").write_text(git_commit() + "\n")
        self.metrics_path = self.run_dir / "metrics.jsonl"

    # -- construction helpers -----------------------------------------------------------------
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
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=self.cfg.lr,
                                 betas=self.cfg.betas, eps=self.cfg.eps, weight_decay=self.cfg.weight_decay)

    def _scheduler(self, optimizer):
        factor, offset = inverse_sqrt(self.cfg.warmup_steps), self.cfg.schedule_offset
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(step + offset))

    def _restore(self, tag: str, universal: bool) -> None:
        client = ds.load_checkpoint(self.engine, self.ckpt_dir, tag)
        self.step, self.elapsed = int(client["step"]), float(client["elapsed"])
        self.tokens_seen = int(client.get("tokens_seen", 0))
        streams, rngs = client["streams"], client["rng"]
        if client.get("data", self.data_fingerprint) != self.data_fingerprint:
            if not self.cfg.new_data:
                raise ValueError(f"the training shards of {self.cfg.data} are not the ones {self.ckpt_dir / tag} "
                                 f"was trained on; to continue this run on new data pass "
                                 f"--set train.new_data=true (the data stream then starts afresh)")
            self.log(f"continuing {self.ckpt_dir / tag} on new data ({self.cfg.data}): weights, optimizer "
                     f"and schedule carry on, the data stream starts afresh")
        elif len(streams) == self.world and not universal:
            self.stream.load_state_dict(streams[self.rank])
            torch.set_rng_state(rngs[self.rank])
        else:   # another world size: slices differ, so each direction restarts its current pool
            self.stream.load_state_dict(streams[0], strict_world=False)
        self.epoch = ds.all_reduce_sum([self.stream.epoch], self.device)[0] / self.world
        self._truncate_metrics()
        self.log(f"resumed from {self.ckpt_dir / tag} at step {self.step}"
                 + (" (universal checkpoint, world size changed)" if universal else ""))

    def _truncate_metrics(self) -> None:
        """Drop the records a killed run wrote after its last checkpoint: the resumed run writes
        those steps again, and a curve must not show them twice."""
        path = self.run_dir / "metrics.jsonl"
        if self.rank != 0 or not path.exists():
            return
        kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= self.step]
        write_atomic(path, "".join(line + "\n" for line in kept))

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> dict:
        """Train to the budget. A stop signal ends the run at the next step boundary with a
        checkpoint (``Interrupted``), so a preempted job loses at most one step."""
        self._stop_signal = 0
        if threading.current_thread() is not threading.main_thread():   # handlers live in the main thread
            return self._train()
        previous = {sig: signal.signal(sig, self._on_stop_signal) for sig in STOP_SIGNALS}
        try:
            return self._train()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_stop_signal(self, signum, frame) -> None:
        self._stop_signal = signum

    def _train(self) -> dict:
        cfg, eng = self.cfg, self.engine
        bar = tqdm(total=cfg.max_steps or None, initial=self.step, disable=self.rank != 0 or None,
                   desc="train", unit="step", dynamic_ncols=True)
        window = {"loss": 0.0, "nll": 0.0, "tokens": 0.0, "skipped": 0, "seconds": 0.0}
        last = {}
        eng.train()
        while not self._budget_spent():
            t_step = time.perf_counter()
            loss_sum, nll_sum, ntok = self._train_step(window)
            self.step += 1
            # The stop flag rides on the step's all-reduce: launchers signal ranks one after another
            # (deepspeed's waits up to 30 s per rank), and every rank must checkpoint the same step.
            sums = ds.all_reduce_sum([loss_sum, nll_sum, ntok, time.perf_counter() - t_step, self.stream.epoch,
                                      float(bool(self._stop_signal))], self.device)
            self.epoch = sums[4] / self.world
            self.elapsed += sums[3] / self.world
            window["seconds"] += sums[3] / self.world
            self.tokens_seen += int(sums[2])
            window["loss"] += sums[0]
            window["nll"] += sums[1]
            window["tokens"] += sums[2]
            bar.update(1)
            if self.step % cfg.log_every == 0 or self._budget_spent():
                last = self._log_train(window)
                bar.set_postfix(loss=f"{last['loss']:.3f}", tok_s=f"{last['tokens_per_s']:.0f}")
                window.update(loss=0.0, nll=0.0, tokens=0.0, skipped=0, seconds=0.0)
            if sums[5]:   # before validation, which can outlast a scheduler's grace period (SLURM
                          # KillWait: 30 s); a validation due at this step is skipped
                bar.close()
                self.save()
                ds.shutdown()      # every rank is here: the process is about to end
                raise Interrupted(self._stop_signal, self.step)
            if self.step % cfg.valid_every == 0:
                last.update(self._validate_and_select())
            if self.step % cfg.ckpt_every == 0:
                self.save()
        bar.close()
        if self.step % cfg.valid_every:
            last.update(self._validate_and_select())
        tag = self.save()
        if self.rank == 0:
            from cll_scale.plots import plot_training_curves
            plot_training_curves(self.metrics_path, self.run_dir / "curves.png")
        if cfg.export:
            self.export(tag)
        ds.barrier()
        return {"step": self.step, **last}

    def _best_so_far(self) -> float | None:
        info = self.run_dir / BEST_EXPORT / "export.json"
        if self.cfg.best_metric and info.exists():
            best = json.loads(info.read_text()).get("best", {})
            if best.get("metric") == self.cfg.best_metric and best.get("step", 0) <= self.step:
                return float(best["value"])
        return None

    def _validate_and_select(self) -> dict:
        """Validate; on a new best of ``best_metric`` save a checkpoint and export it to
        ``export-best/``. Only supervised directions count: a zero-shot study must not pick its
        model with parallel data it claims not to have."""
        out = self.validate()
        metric = self.cfg.best_metric
        if metric and metric in out:
            value = float(out[metric])
            lower_is_better = metric.endswith("nll")
            if self.best is None or (value < self.best if lower_is_better else value > self.best):
                self.best = value
                tag = self.save()
                if self.cfg.export:
                    self.export(tag, BEST_EXPORT, {"best": {"metric": metric, "value": value, "step": self.step}})
        return out

    def _budget_spent(self) -> bool:
        # Decided from all-reduced numbers only, so every rank stops at the same step.
        return bool((self.cfg.max_steps and self.step >= self.cfg.max_steps)
                    or (self.cfg.max_epochs and self.epoch >= self.cfg.max_epochs)
                    or (self.cfg.max_minutes and self.elapsed >= self.cfg.max_minutes * 60))

    def _train_step(self, window: dict) -> tuple[float, float, float]:
        """One optimizer step = ``grad_accum`` microbatches with a finite loss."""
        eng, model = self.engine, self.engine.module
        done = skips = 0
        loss_sum = nll_sum = ntok = 0.0
        while done < self.cfg.grad_accum:
            batch = next(self.stream).to(self.device)
            logits = eng(batch.src_tokens, model.shift_right(batch.tgt_tokens), batch.tgt_lang)
            loss, nll = label_smoothed_loss(logits, batch.tgt_tokens, self.model_cfg.pad_id,
                                            self.cfg.label_smoothing)
            loss = self._inject_fault(loss)
            # Per-token mean per microbatch; DeepSpeed averages over accumulation and ranks.
            mean = loss / batch.ntokens
            if not ds.all_finite(mean):
                skips += 1
                window["skipped"] += 1
                self.log(f"step {self.step + 1}: non-finite loss on {batch.direction}; microbatch skipped")
                if skips >= MAX_CONSECUTIVE_SKIPS:
                    raise FloatingPointError(f"{skips} consecutive non-finite losses: training diverged")
                continue
            eng.backward(mean)
            eng.step()
            done += 1
            loss_sum += float(loss.detach())
            nll_sum += float(nll)
            ntok += batch.ntokens
        return loss_sum, nll_sum, ntok

    def _fault(self, kind: str, step: int) -> bool:
        """Test hook, ``CLL_FAULT=<kind>@<step>`` (once per process): ``nan`` makes the first
        microbatch of that step non-finite; ``crash_in_save`` kills the process in the middle of
        that step's checkpoint save."""
        spec = os.environ.get("CLL_FAULT", "")
        name, _, at = spec.partition("@")
        hit = name == kind and at.isdigit() and int(at) == step and kind not in self._faults_done
        if hit:
            self._faults_done.add(kind)
        return hit

    def _inject_fault(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * float("nan") if self._fault("nan", self.step + 1) else loss   # step being computed

    # -- validation, logging, checkpoints, export ----------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict:
        """Loss per direction of the validation split, supervised and zero-shot averaged apart."""
        split = "valid" if "valid" in self.manifest.splits else None
        if split is None:
            return {}
        self.engine.eval()
        per_dir = {}
        for direction in self.manifest.splits[split].directions():
            sums = [0.0, 0.0]
            for i, batch in enumerate(eval_batches(self.cfg.data, split, direction, self.stream_cfg.max_tokens,
                                                   self.rank, self.world, self.stream_cfg.add_lang_tag)):
                if self.cfg.valid_max_batches and i >= self.cfg.valid_max_batches:
                    break
                batch = batch.to(self.device)
                logits = self.engine(batch.src_tokens, self.engine.module.shift_right(batch.tgt_tokens), batch.tgt_lang)
                _, nll = label_smoothed_loss(logits, batch.tgt_tokens, self.model_cfg.pad_id, 0.0)
                sums[0] += float(nll)
                sums[1] += batch.ntokens
            nll, tokens = ds.all_reduce_sum(sums, self.device)
            per_dir[direction] = nll / max(tokens, 1)
        sup = [v for d, v in per_dir.items() if not self.manifest.is_zero_shot(d)]
        zero = [v for d, v in per_dir.items() if self.manifest.is_zero_shot(d)]
        out = {"valid_nll": sum(sup) / max(len(sup), 1)}
        if zero:
            out["valid_zero_shot_nll"] = sum(zero) / len(zero)
        record = {"step": self.step, **out, "valid_by_direction": per_dir}
        if self.cfg.valid_decode_sentences:
            decoded = self._validate_decoding(split)
            out.update(decoded.pop("averages"))
            record.update(out, valid_decoding=decoded)
        self.engine.train()
        self._write_metrics(record)
        ds.monitor_events(self.engine, [(f"Valid/{k}", v, self.step) for k, v in out.items()])
        self.log(f"step {self.step}: valid nll {out['valid_nll']:.3f}"
                 + (f", zero-shot {out['valid_zero_shot_nll']:.3f}" if zero else ""))
        return out

    def _validate_decoding(self, split: str) -> dict:
        """Greedy translations of the first validation sentences of every direction on rank 0:
        BLEU and off-target rate over training show when (and whether) zero-shot collapses."""
        result = {"averages": {}}
        if self.rank == 0:
            from cll_scale.decoding import DecodeConfig
            from cll_scale.evaluate import evaluate_model, pairs_from_shards
            from cll_scale.translate import TranslateConfig, Translator
            tr = Translator.from_model(self.engine.module, self.manifest,
                                       Path(self.cfg.data) / self.manifest.tokenizer.file,
                                       TranslateConfig(DecodeConfig(beam=1)))
            report = evaluate_model(tr, pairs_from_shards(self.cfg.data, split),
                                    max_sentences=self.cfg.valid_decode_sentences, log=lambda s: None)
            for kind, key in (("supervised", "valid_bleu"), ("zero-shot", "valid_zero_shot_bleu")):
                if kind in report["averages"]:
                    result["averages"][key] = report["averages"][kind]["bleu"]
            if "zero-shot" in report["averages"]:
                z = report["averages"]["zero-shot"]
                result["averages"]["valid_zero_shot_offtarget"] = z["off_target_restricted"]
                result["averages"]["valid_zero_shot_code_switch"] = z["code_switch"]
            result["by_direction"] = {d["direction"]: {k: d[k] for k in ("bleu", "off_target_restricted")}
                                      for d in report["directions"]}
        shared = ds.all_gather_object(result)[0]     # every rank logs the same numbers
        return shared

    def _log_train(self, w: dict) -> dict:
        dt = w["seconds"]     # training steps only: validation and checkpoints are not counted
        tokens = max(w["tokens"], 1.0)
        rec = {"step": self.step, "loss": w["loss"] / tokens, "nll": w["nll"] / tokens,
               "ppl": math.exp(min(w["nll"] / tokens, 50)), "lr": self.engine.get_lr()[0],
               "tokens_per_s": w["tokens"] / max(dt, 1e-9), "epoch": self.stream.epoch,
               "grad_norm": _float(self.engine.get_global_grad_norm()), "skipped": w["skipped"],
               "elapsed_s": self.elapsed, "tokens_seen": self.tokens_seen}
        self._write_metrics(rec)
        ds.monitor_events(self.engine, [("Train/loss", rec["loss"], self.step), ("Train/nll", rec["nll"], self.step),
                                        ("Train/lr", rec["lr"], self.step),
                                        ("Train/tokens_per_s", rec["tokens_per_s"], self.step)])
        return rec

    def _write_metrics(self, record: dict) -> None:
        if self.rank == 0:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def save(self) -> str:
        if self._saved[0] == self.step:      # validation already saved this step
            return self._saved[1]
        if ds.latest_tag(self.ckpt_dir) == ds.tag_for(self.step):   # resumed with the budget spent:
            return ds.tag_for(self.step)                             # never rewrite the latest
        state = {"step": self.step, "elapsed": self.elapsed, "tokens_seen": self.tokens_seen,
                 "data": self.data_fingerprint,
                 "streams": ds.all_gather_object(self.stream.state_dict()),
                 "rng": ds.all_gather_object(torch.get_rng_state())}
        fault = "crash_in_save" if self._fault("crash_in_save", self.step) else ""
        try:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            tag = ds.save_checkpoint(self.engine, self.ckpt_dir, self.step, state, self.cfg.keep_last, fault)
        except (OSError, RuntimeError) as err:   # disk full, quota, unwritable directory (torch.save
            # reports a failed write as a RuntimeError from its zip writer)
            previous = ds.latest_tag(self.ckpt_dir)
            raise CheckpointError(f"saving the step {self.step} checkpoint in {self.ckpt_dir} failed ({err}); "
                                  + (f"the previous checkpoint {previous} is intact and --resume continues "
                                     f"from it" if previous else "no earlier checkpoint exists")) from None
        self._saved = (self.step, tag)
        return tag

    def export(self, tag: str, name: str = "export", info: dict | None = None) -> None:
        if self.rank == 0:
            weights = {**ds.consolidated_state_dict(self.ckpt_dir, tag), **self.frozen}
            write_export(self.run_dir / name, weights, self.model_cfg, self.cfg.data,
                         {"step": self.step, "run_dir": str(self.run_dir), "checkpoint": tag,
                          "lr": self.engine.get_lr()[0], "git": git_commit(), **(info or {})})
            self.log(f"exported {self.run_dir / name}" + (f" ({info})" if info else ""))

    def log(self, message: str) -> None:
        if self.rank == 0:
            tqdm.write(f"[cll-train] {message}", file=sys.stderr)


def _float(x) -> float | None:
    if x is None:
        return None
    return float(x.item() if torch.is_tensor(x) else x)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cll-train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", help="YAML or JSON recipe (sections: preset, model, data, train)")
    p.add_argument("--data", help="shard directory (train.data)")
    p.add_argument("--run-dir", help="run directory (train.run_dir)")
    p.add_argument("--preset", choices=sorted(PRESETS))
    p.add_argument("--variant", choices=("baseline", "residual", "sd", "fcll"))
    p.add_argument("--ds-config", help="a ds_configs/*.json (engine settings), or 'auto'")
    p.add_argument("--max-steps", type=int)
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a recipe field, e.g. --set train.lr=5e-4 --set model.lsl_dim=512")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by the launcher
    return p


def recipe_from_args(args) -> dict:
    recipe = load_recipe(args.recipe) if args.recipe else {}
    if args.preset:
        recipe["preset"] = args.preset
    for key, value in (("data", args.data), ("run_dir", args.run_dir), ("ds_config", args.ds_config),
                       ("max_steps", args.max_steps), ("max_minutes", args.max_minutes)):
        if value is not None:
            recipe.setdefault("train", {})[key] = value
    if args.variant:
        recipe.setdefault("model", {})["variant"] = args.variant
    return apply_overrides(recipe, args.set)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        recipe = recipe_from_args(args)
        result = Trainer(recipe, resume=args.resume).train()
        ds.shutdown()
    except (ValueError, FileExistsError, FileNotFoundError, CheckpointError) as err:   # ManifestError is a ValueError
        print(f"cll-train: error: {err}", file=sys.stderr)
        return 2
    except Interrupted as stop:
        print(f"cll-train: {stop}; the same command with --resume continues from there", file=sys.stderr)
        return stop.exit_code
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

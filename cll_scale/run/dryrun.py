"""``cll-train --dry-run``: build the run of a recipe in a temporary directory, time a burst of
real steps, and say what a step, an epoch and the budget cost, writing nothing to the run
directory."""
from __future__ import annotations

import tempfile
import time
from dataclasses import replace

import torch

from cll_scale.data.stream import ShardStream
from cll_scale.run.build import build_run
from cll_scale.run.trainer import Trainer
from cll_scale.training import collectives
from cll_scale.training.precision import precision as precision_of


DRY_RUN_WARMUP = 2          # steps before the timed burst (first-call allocations, caches)
DRY_RUN_SAMPLE = 256        # microbatches per rank drawn from a second stream for rows and tokens per step


def dry_run(recipe: dict, steps: int) -> dict:
    """Build the run of ``recipe`` (manifest, stream, model, DeepSpeed engine) in a temporary run
    directory, train ``DRY_RUN_WARMUP`` + ``steps`` steps, and return what a step and an epoch
    cost. The recipe's run directory is never touched: the checkpoints, metrics and config the
    Trainer writes go to the temporary one, which is removed, lock and all, on the way out."""
    with tempfile.TemporaryDirectory(prefix="cll-dry-run-") as tmp:
        recipe = {**recipe, "train": {**recipe.get("train", {}), "run_dir": tmp},
                  "checkpoint": {**recipe.get("checkpoint", {}), "export": False}}
        run = build_run(recipe)
        try:
            with run.matmuls():
                return _dry_run_figures(Trainer(run), steps)
        finally:
            run.close()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _dry_run_figures(t: Trainer, steps: int) -> dict:
    """Time a burst of real steps; rows and target tokens per step come from a second stream with
    the same settings (``DRY_RUN_SAMPLE`` microbatches), since a burst of a few length-bucketed
    batches says little about the average. An epoch is the trainer's: every row of the split once."""
    t.engine.train()
    for _ in range(DRY_RUN_WARMUP):
        t.run_step()
    _sync(t.device)
    start, tokens0 = time.perf_counter(), t.state.tokens_seen
    for _ in range(steps):
        t.run_step()
    _sync(t.device)
    seconds = collectives.host_all_reduce([time.perf_counter() - start], "max")[0] / max(steps, 1)
    cfg, run = t.cfg, t.run
    sample = ShardStream(cfg.train.shards, replace(cfg.data, verify="none"), t.rank, t.world, manifest=run.manifest)
    batches = [next(sample) for _ in range(DRY_RUN_SAMPLE)]
    rows, tokens = collectives.host_all_reduce([sum(len(b) for b in batches), sum(b.ntokens for b in batches)])
    rows_per_step = rows / DRY_RUN_SAMPLE * cfg.train.grad_accum
    tokens_per_step = tokens / DRY_RUN_SAMPLE * cfg.train.grad_accum
    split = run.manifest.splits[cfg.data.split]
    shards = [s for s in split.shards if s.direction in t.stream.directions]
    epoch_rows = sum(s.rows for s in shards)
    epoch_tokens = sum(s.tgt_tokens + s.rows for s in shards)     # + eos, as the loss counts them
    steps_per_epoch = epoch_rows / rows_per_step
    params = list(run.model.parameters())
    budget = [x for x in (cfg.train.max_steps, cfg.train.max_epochs * steps_per_epoch,
                          cfg.train.max_minutes * 60 / seconds) if x]
    return {
        "world_size": t.world, "precision": precision_of(run.ds_config),
        "parameters": sum(p.numel() for p in params), "tensors": len(params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "languages": len(run.manifest.languages), "directions": len(t.stream.directions),
        "max_tokens_per_microbatch": cfg.data.batch_tokens, "grad_accum": cfg.train.grad_accum,
        "rows_per_step": rows_per_step, "tokens_per_step": tokens_per_step,
        "epoch_rows": epoch_rows, "epoch_target_tokens": epoch_tokens, "steps_per_epoch": steps_per_epoch,
        "warmup_steps": DRY_RUN_WARMUP, "timed_steps": steps, "seconds_per_step": seconds,
        "burst_tokens_per_step": (t.state.tokens_seen - tokens0) / max(steps, 1),
        "seconds_per_epoch": steps_per_epoch * seconds,
        "budget_steps": min(budget) if budget else None,
        "budget_seconds": min(budget) * seconds if budget else None,
    }


def format_dry_run(r: dict, run_dir: str) -> str:
    def span(s: float) -> str:
        return f"{s / 86400:.1f} days" if s > 2 * 86400 else f"{s / 3600:.1f} h" if s > 2 * 3600 else f"{s / 60:.1f} min"
    lines = [
        f"dry run: {r['world_size']} rank(s), {r['precision']}, {r['languages']} languages, {r['directions']} directions",
        f"parameters        {r['parameters']:,} in {r['tensors']} tensors ({r['trainable_parameters']:,} trained)",
        f"tokens per step   {r['tokens_per_step']:,.0f} target tokens, {r['rows_per_step']:,.1f} rows "
        f"({r['max_tokens_per_microbatch']:,} padded tokens x {r['grad_accum']} microbatch(es) x {r['world_size']} rank(s))",
        f"epoch             {r['epoch_rows']:,} rows, {r['epoch_target_tokens']:,} target tokens -> "
        f"{r['steps_per_epoch']:,.0f} steps per epoch",
        f"time              {r['seconds_per_step']:.3f} s per step ({r['timed_steps']} steps after "
        f"{r['warmup_steps']} warm-up) -> {span(r['seconds_per_epoch'])} per epoch",
    ]
    if r["budget_steps"]:
        lines.append(f"budget            {r['budget_steps']:,.0f} steps = {r['budget_steps'] / r['steps_per_epoch']:.2f} "
                     f"epochs, about {span(r['budget_seconds'])}")
    lines.append(f"nothing written to {run_dir} (the dry run trained in a temporary directory)")
    return "\n".join(lines)

"""Every DeepSpeed call of cll-scale lives in this module.

The same code runs in one CPU process (no launcher), under ``deepspeed --num_gpus N`` on CPU
(gloo, one thread per rank) and on multi-node GPU clusters (NCCL, bf16/fp16).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from cll_scale.training import collectives
from cll_scale.training.precision import read_ds_config, resolve_ds_config


def init_distributed() -> tuple[int, int, int]:
    """Join (or, without a launcher, create) the process group. Returns (rank, world, local rank).

    Without a launcher DeepSpeed would try MPI discovery (and fail without mpi4py): set a
    one-process world.
    """
    import deepspeed
    from deepspeed.utils import logger
    logger.setLevel(logging.WARNING)   # DeepSpeed's INFO lines would drown the run's own log
    if "RANK" not in os.environ:
        collectives.one_process_world()
    if not torch.cuda.is_available():
        # On CPU DeepSpeed's comm backend JIT-compiles a shared-memory all-reduce kernel
        # (70-110 s on 2 cores) that only its inference path uses; training talks through
        # gloo. Marking the op unavailable (DeepSpeed keeps this dict for such edits) skips it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
    collectives.open_host_group()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), local


def device() -> torch.device:
    from deepspeed.accelerator import get_accelerator
    return torch.device(get_accelerator().current_device_name())


def make_ds_config(path: str | Path, optim, grad_accum: int, world_size: int, run_dir: str | Path,
                   load_universal: bool = False, dashboards: tuple[str, ...] = ()) -> dict:
    """Engine settings from ``ds_configs/*.json`` plus the recipe's (``optim``: an
    :class:`~cll_scale.training.optim.OptimConfig`; ``grad_accum``: ``train.grad_accum``) — the one place
    where batch size, accumulation and clipping meet. ``dashboards``: DeepSpeed monitors switched on
    besides those the file enables (``tensorboard``, ``wandb``: ``log.tensorboard``, ``log.wandb``).

    A microbatch is one token-budget batch from the stream, so DeepSpeed's "micro batch" is 1;
    the global batch is then ``1 × grad_accum × world_size`` microbatches, checked here.
    """
    auto = str(path) == "auto"
    path, why = resolve_ds_config(path, agree=collectives.ranks_agree if torch.distributed.is_initialized() else None)
    if auto and (not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0):
        print(f"[cll-scale] ds_config auto: {path.name} ({why})", file=sys.stderr, flush=True)
    cfg = read_ds_config(path)
    owned = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "gradient_clipping", "scheduler"}
    clash = owned & set(cfg)
    if clash:
        raise ValueError(f"{path}: {sorted(clash)} are training settings (the recipe's train and optim), "
                         f"not engine settings")
    micro, accum = 1, grad_accum
    # Our client optimizer (GuardedAdamW) clips on the device; DeepSpeed's clipping reads the norm
    # on the host every step (0.19.8: is_invalid_grad_norm), and under ZeRO-2 its norm is a Python
    # loop over every parameter, so both are switched off when the client optimizer is in charge.
    client = "optimizer" not in cfg
    cfg.update(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum,
               gradient_clipping=0.0 if client else optim.clip_norm)
    if client and zero_stage(cfg) == 2:
        cfg["zero_optimization"]["compute_grad_norm"] = False
    # Deliberately no train_batch_size: it would pin the world size and break resuming on
    # another one (DeepSpeed asserts the product); it derives it and we check it here.
    if micro * accum * world_size < 1:
        raise ValueError("micro-batch × accumulation × world size must be >= 1")
    if "optimizer" in cfg:   # DeepSpeed's own optimizer (e.g. for CPU offload): our settings
        cfg["optimizer"]["params"] = {**optim.adamw_kwargs(), "betas": list(optim.betas)}
        if cfg.get("bf16", {}).get("enabled"):
            # Our skip-on-non-finite guard lives in the client optimizer (GuardedAdamW); without it
            # DeepSpeed's own check (one host sync per step) must keep a bad step out.
            cfg["bf16"]["check_grad_overflow"] = True
    for monitor in dashboards:     # TensorBoard's events go beside the CSV monitor's, under train/
        cfg[monitor] = {**({"job_name": "train"} if monitor == "tensorboard" else {}), **cfg.get(monitor, {}),
                        "enabled": True}
    for monitor in ("csv_monitor", "tensorboard"):     # wandb keeps its files in its own place
        if cfg.get(monitor, {}).get("enabled"):
            cfg[monitor]["output_path"] = str(Path(run_dir) / "monitor") + "/"
    if load_universal:
        cfg.setdefault("checkpoint", {})["load_universal"] = True
    return cfg


def zero_stage(ds_config: dict) -> int:
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def initialize(model: torch.nn.Module, ds_config: dict, optimizer_factory, scheduler_factory):
    """``deepspeed.initialize``: a client torch AdamW (no JIT-compiled op) unless the config
    names DeepSpeed's optimizer."""
    import deepspeed
    optimizer = None if "optimizer" in ds_config else optimizer_factory(model)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config,
                                           lr_scheduler=scheduler_factory,
                                           model_parameters=[p for p in model.parameters() if p.requires_grad])
    return engine


def monitor_events(engine, events: list[tuple[str, float, int]]) -> None:
    if getattr(engine, "monitor", None) is not None and engine.monitor.enabled and engine.global_rank == 0:
        engine.monitor.write_events(events)


# -- checkpoints (DeepSpeed's save and load; the commit protocol is cll_scale.training.checkpointer's) -----

def save_checkpoint(engine, ckpt_dir: Path, tag: str, client_state: dict) -> None:
    """Every rank writes its part of ``tag`` (ZeRO shards the optimizer); DeepSpeed's own
    ``latest`` is not written: :class:`cll_scale.training.checkpointer.Checkpointer` commits."""
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    torch.distributed.barrier()


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """DeepSpeed's universal checkpoint conversion (to resume at another world size); rank 0
    converts, the others wait. Returns the universal tag."""
    out_tag = f"{tag}_universal"
    if torch.distributed.get_rank() == 0 and not (ckpt_dir / out_tag / "zero").is_dir():
        tmp = ckpt_dir / f".{out_tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                        "--input_folder", str(ckpt_dir / tag), "--output_folder", str(tmp),
                        "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"],
                       check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(ckpt_dir / out_tag, ignore_errors=True)
        os.replace(tmp, ckpt_dir / out_tag)
    torch.distributed.barrier()
    return out_tag


def load_checkpoint(engine, ckpt_dir: Path, tag: str) -> dict:
    path, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    if path is None:
        raise RuntimeError(f"could not load checkpoint {ckpt_dir / tag}")
    return client_state or {}


def consolidated_state_dict(ckpt_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    """fp32 weights gathered from a ZeRO checkpoint (any world size)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)



"""The precision a run trains in: the engine settings files (``ds_configs/``), what
``train.ds_config: auto`` stands for on this machine (bf16 on a GPU; on a CPU only where bf16
matmuls are faster than fp32, :func:`cll_scale.core.hardware.cpu_bf16_speedup`), and the precision
a run's engine settings name. No DeepSpeed here: ``cll-repro`` asks the same questions without
starting an engine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from cll_scale.core.jsonfiles import read_json_object
from cll_scale.core.resources import shipped

DS_CONFIGS = shipped("ds_configs")


def default_ds_config(agree: Callable[[bool], bool] | None = None) -> tuple[Path, str]:
    """The engine settings ``auto`` stands for, and why: bf16 on a GPU; on a CPU bf16 only where
    a short matmul probe finds it faster than fp32. ``agree``: in a process group, the rule that
    makes every rank take the same choice (bf16 only if it is faster on all of them)."""
    import torch        # here, not at the top: cll-repro's --help reads PRECISIONS without torch

    from cll_scale.core.hardware import cpu_bf16_speedup
    if torch.cuda.is_available():
        return DS_CONFIGS / "gpu_bf16.json", "a CUDA device is present"
    speedup = cpu_bf16_speedup()
    faster = speedup > 1.1
    if agree is not None:                      # every rank must run the same engine settings
        faster = agree(faster)
    name = "cpu_bf16.json" if faster else "cpu_fp32.json"
    return DS_CONFIGS / name, (f"bf16 matmuls run {speedup:.2f}x as fast as fp32 on this CPU"
                               + ("" if faster == (speedup > 1.1) else "; not on every rank's"))


def resolve_ds_config(path: str | Path, agree: Callable[[bool], bool] | None = None) -> tuple[Path, str]:
    """The engine settings file a ``train.ds_config`` value names (a path, or a name in
    ``ds_configs/``), and why; ``auto``: :func:`default_ds_config`'s choice for this machine."""
    if str(path) == "auto":
        return default_ds_config(agree)
    path = Path(path)
    if not path.is_file() and (DS_CONFIGS / path).is_file():
        path = DS_CONFIGS / path
    return path, "named by the recipe"


def read_ds_config(path: Path) -> dict:
    """The engine settings a ``train.ds_config`` file holds; one that is not a JSON object (a
    recipe given as ``--ds-config``, a damaged file) is refused naming it."""
    return read_json_object(path, "train.ds_config (--ds-config) names DeepSpeed's engine settings as JSON, "
                                  "e.g. ds_configs/cpu_fp32.json (a recipe goes to --recipe)")


PRECISIONS = ("auto", "bf16", "fp32")


def ds_config_of(precision: str) -> str:
    """The engine settings file that trains in ``precision`` on this machine (``auto``: the
    machine's choice, :func:`default_ds_config`). bf16 on a CPU without avx512_bf16 or AMX runs
    its matmuls in fp32 on bf16 values (:class:`Bf16MatmulsInFp32`), at about 0.9x fp32's speed."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto":
        return "auto"
    import torch
    return "gpu_bf16.json" if precision == "bf16" and torch.cuda.is_available() else f"cpu_{precision}.json"


def precision(cfg: dict) -> str:
    """The precision engine settings train in: bf16, fp16 or fp32."""
    return next((p for p in ("bf16", "fp16") if cfg.get(p, {}).get("enabled")), "fp32")


def trained_precision(run_dir: Path) -> str | None:
    """The precision a run trains in (its ``ds_config.json``, which a record keeps too); None
    before it started."""
    path = Path(run_dir) / "ds_config.json"
    return precision(read_ds_config(path)) if path.is_file() else None



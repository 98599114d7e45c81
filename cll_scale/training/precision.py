"""The precision a run trains in, and the machine facts that choose it: engine settings files
(``ds_configs/``), what ``train.ds_config: auto`` stands for on this machine (bf16 on a GPU; on a
CPU only where bf16 matmuls are faster than fp32, which a short probe measures and caches), and
how a report names the hardware; and, on a CPU without bf16 matmul instructions, bf16 training's
matmuls in fp32 (:func:`matmul_mode`). No DeepSpeed here: ``cll-repro`` asks the same questions
without starting an engine.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from cll_scale.run.recipe import TrainConfig, apply_overrides, load_recipe
from cll_scale.core.outputs import json_text, write_atomic

ROOT = Path(__file__).resolve().parents[2]
DS_CONFIGS = ROOT / "ds_configs"


def hardware() -> str:
    """The machine in one line, as reports and records name it."""
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    model, flags = cpu_model_and_flags()
    return f"{os.cpu_count()} CPU cores ({model}, {flags or 'no AVX-512'}), no GPU"


def cpu_model_and_flags() -> tuple[str, str]:
    """This CPU's model name, and which of the instruction sets that decide bf16's speed it has
    (avx512_bf16, amx_bf16, avx512f; space-separated, empty for none). Two machines that both call
    themselves "AMD EPYC" can differ threefold in a `small` step on that alone."""
    import platform
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.processor())
    return model, " ".join(sorted({f for f in ("avx512_bf16", "amx_bf16", "avx512f") if f in info.split()}))


def cpu_bf16_speedup(threads: int | None = None) -> float:
    """bf16 ÷ fp32 matmul throughput on this CPU (> 1: bf16 is faster), cached per CPU model,
    instruction set, torch version and thread count. Without avx512_bf16 or AMX, bf16 is emulated
    and was measured here at a quarter of fp32's speed (with avx512f) and at 0.02x (an AMD EPYC
    without AVX-512); with avx512_bf16, at about twice. Read once per process: the matmul mode
    asks it for every translated batch."""
    return _bf16_speedup(threads or torch.get_num_threads())


@functools.lru_cache(maxsize=None)
def _bf16_speedup(threads: int) -> float:
    import hashlib
    import time
    model, flags = cpu_model_and_flags()
    key = hashlib.sha256(f"{model}|{flags}|{torch.__version__}|{threads}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cll-scale" / f"cpu-bf16-{key}.json"
    try:
        return float(json.loads(cache.read_text())["speedup"])
    except (OSError, ValueError, KeyError):
        pass
    a = torch.randn(512, 1024)
    b = torch.randn(1024, 1024)

    def best(dtype) -> float:
        x, y = a.to(dtype), b.to(dtype)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            torch.mm(x, y)
            times.append(time.perf_counter() - t)
        return min(times[1:])
    speedup = best(torch.float32) / best(torch.bfloat16)
    try:
        write_atomic(cache, json_text({"speedup": speedup, "cpu": model, "flags": flags, "threads": threads}))
    except OSError:
        pass
    return speedup


def default_ds_config(agree: Callable[[bool], bool] | None = None) -> tuple[Path, str]:
    """The engine settings ``auto`` stands for, and why: bf16 on a GPU; on a CPU bf16 only where
    a short matmul probe finds it faster than fp32. ``agree``: in a process group, the rule that
    makes every rank take the same choice (bf16 only if it is faster on all of them)."""
    if torch.cuda.is_available():
        return DS_CONFIGS / "gpu_bf16.json", "a CUDA device is present"
    speedup = cpu_bf16_speedup()
    faster = speedup > 1.1
    if agree is not None:                      # every rank must run the same engine settings
        faster = agree(faster)
    name = "cpu_bf16.json" if faster else "cpu_fp32.json"
    return DS_CONFIGS / name, (f"bf16 matmuls run {speedup:.2f}x as fast as fp32 on this CPU"
                               + ("" if faster == (speedup > 1.1) else "; not on every rank's"))


# The matmuls of our model and of attention's weights path (F.linear, @), and their spellings.
MATMULS = frozenset({F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
                     torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.baddbmm})


class Bf16MatmulsInFp32(TorchFunctionMode):
    """Within the block, a matmul with a bf16 operand runs in fp32 on the same (bf16-valued)
    operands, and its result is rounded to bf16: what bf16 matmul units compute (avx512_bf16,
    AMX, tensor cores: bf16 products are exact in fp32, sums are fp32, one rounding at the end),
    so a run trains in bf16 all the same; only the order of the fp32 sums differs, as it does
    between any two machines. Autograd records the casts, so the backward matmuls run in fp32
    too. Why: without those instructions torch's bf16 matmul is a scalar loop, measured at 0.01x
    fp32 on a 2-core AMD EPYC without AVX-512 (a bf16 `small` step 56 target tokens/s against
    1,130 in this mode and 1,300 in fp32). Other ops stay bf16, attention's fused kernel among them
    (it sums in fp32 itself; they are cheap either way)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MATMULS and any(_is_bf16(a) for a in (*args, *kwargs.values())):
            if "out" in kwargs:
                raise TypeError(f"{func.__name__}(out=...) has no bf16-in-fp32 form")
            up = [a.float() if _is_bf16(a) else a for a in args]
            return func(*up, **{k: v.float() if _is_bf16(v) else v for k, v in kwargs.items()}).to(torch.bfloat16)
        return func(*args, **kwargs)


def _is_bf16(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16


def emulates_bf16(dtype: str, device: torch.device) -> bool:
    """Whether a model in ``dtype`` (bf16, fp16, fp32: :func:`precision`) on ``device`` runs its
    matmuls in fp32: bf16 on a CPU whose own bf16 matmuls are slower than fp32 (the cached probe,
    :func:`cpu_bf16_speedup`)."""
    return device.type == "cpu" and dtype == "bf16" and cpu_bf16_speedup() < 1.0


def matmul_mode(dtype: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The block a model's passes run in (training, the dry run, translation):
    :class:`Bf16MatmulsInFp32` where :func:`emulates_bf16`, nothing otherwise (GPUs, CPUs with
    avx512_bf16 or AMX, fp32)."""
    return Bf16MatmulsInFp32() if emulates_bf16(dtype, device) else contextlib.nullcontext()


def resolve_ds_config(path: str | Path, agree: Callable[[bool], bool] | None = None) -> tuple[Path, str]:
    """The engine settings file a ``train.ds_config`` value names (a path, or a name in
    ``ds_configs/``), and why; ``auto``: :func:`default_ds_config`'s choice for this machine."""
    if str(path) == "auto":
        return default_ds_config(agree)
    path = Path(path)
    if not path.is_file() and (DS_CONFIGS / path).is_file():
        path = DS_CONFIGS / path
    return path, "named by the recipe"


PRECISIONS = ("auto", "bf16", "fp32")


def ds_config_of(precision: str) -> str:
    """The engine settings file that trains in ``precision`` on this machine (``auto``: the
    machine's choice, :func:`default_ds_config`). bf16 on a CPU without avx512_bf16 or AMX runs
    its matmuls in fp32 on bf16 values (:class:`Bf16MatmulsInFp32`), at about 0.9x fp32's speed."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto":
        return "auto"
    return "gpu_bf16.json" if precision == "bf16" and torch.cuda.is_available() else f"cpu_{precision}.json"


def precision(cfg: dict) -> str:
    """The precision engine settings train in: bf16, fp16 or fp32."""
    return next((p for p in ("bf16", "fp16") if cfg.get(p, {}).get("enabled")), "fp32")


def trained_precision(run_dir: Path) -> str | None:
    """The precision a run trains in (its ``ds_config.json``, which a record keeps too); None
    before it started."""
    path = Path(run_dir) / "ds_config.json"
    return precision(json.loads(path.read_text())) if path.is_file() else None


def planned_precision(recipe: Path, overrides: list[str], asked: str = "auto") -> tuple[str, str]:
    """The precision cll-train trains (or resumes) a recipe in on this machine, and why, named
    where it comes from: ``asked`` (cll-repro's ``--precision``, which decides over the recipe as
    it does for the trainings cll-repro starts), an override of ``train.ds_config`` (``--set``),
    the recipe, or ``auto``'s choice for this machine."""
    if asked != "auto":
        path, _ = resolve_ds_config(ds_config_of(asked))
        return precision(json.loads(path.read_text())), f"--precision {asked}"
    train = apply_overrides(load_recipe(recipe), overrides).get("train", {})
    value = train.get("ds_config", TrainConfig.ds_config)
    path, why = resolve_ds_config(value)
    if str(value) != "auto" and any(o.partition("=")[0].strip() == "train.ds_config" for o in overrides):
        why = f"--set train.ds_config={value}"
    return precision(json.loads(path.read_text())), why


# Dense bf16 peaks of the datasheets (TFLOP/s, without sparsity), for MFU: SXM boards; a name not
# here needs --peak-tflops. H100 and H200 share the compute die, hence the peak.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def peak_bf16_tflops(device_name: str) -> float | None:
    """The table's peak for a CUDA device name (``torch.cuda.get_device_name()``, e.g. "NVIDIA
    H200"); None when the name is not in it."""
    words = re.split(r"[^A-Z0-9]+", device_name.upper())
    return next((tf for key, tf in PEAK_BF16_TFLOPS.items() if key in words), None)

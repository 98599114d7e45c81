"""What machine this is: its name in reports and records, the CPU's bf16 instructions and a probe
of bf16's matmul speed (cached), the datasheet peaks MFU is measured against, and the memory
that can be allocated now (what sizes are checked against before anything is allocated)."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from pathlib import Path

import torch

from cll_scale.core.outputs import json_text, write_atomic


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
    # The instruction sets the kernels may use, not only those the CPU has: capped ones (the
    # stand-in of a CPU without bf16 units, docs/usage.md) would otherwise read a cache that the
    # uncapped CPU wrote, and the reverse.
    isa = "|".join([torch.backends.cpu.get_cpu_capability(),
                    *(os.environ.get(k, "") for k in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"))])
    key = hashlib.sha256(f"{model}|{flags}|{isa}|{torch.__version__}|{threads}".encode()).hexdigest()[:16]
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


# Dense bf16 peaks of the datasheets (TFLOP/s, without sparsity), for MFU: SXM boards; a name not
# here needs --peak-tflops. H100 and H200 share the compute die, hence the peak.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def peak_bf16_tflops(device_name: str) -> float | None:
    """The table's peak for a CUDA device name (``torch.cuda.get_device_name()``, e.g. "NVIDIA
    H200"); None when the name is not in it."""
    words = re.split(r"[^A-Z0-9]+", device_name.upper())
    return next((tf for key, tf in PEAK_BF16_TFLOPS.items() if key in words), None)


def available_memory(device: str | torch.device = "cpu") -> int:
    """Bytes that can be allocated now: a CUDA device's free memory, else the host's
    ``MemAvailable`` (free pages where /proc is absent)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def size_text(n: float) -> str:
    """Bytes as people read them: ``512.0 MiB``, ``14.6 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")

"""bf16 on a CPU without bf16 matmul instructions: the model's matmuls in fp32 on bf16 values
(:func:`matmul_mode`), for training and translation alike. On such a CPU native bf16 matmuls are
emulated and run at a fraction of fp32's speed (:func:`cll_scale.core.hardware.cpu_bf16_speedup`)."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from cll_scale.core.hardware import cpu_bf16_speedup


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

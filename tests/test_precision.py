"""The machine facts that choose a run's precision, and MFU's peak (cll_scale/training/precision.py)."""
import contextlib
import json

import pytest
import torch
import torch.nn.functional as F

from cll_scale.core import faults
from cll_scale.core.hardware import PEAK_BF16_TFLOPS, cpu_bf16_speedup, peak_bf16_tflops
from cll_scale.model.bf16 import Bf16MatmulsInFp32, emulates_bf16
from cll_scale.training.precision import DS_CONFIGS, precision, resolve_ds_config


def test_peak_table_reads_device_names_by_word():
    """torch's CUDA device names carry the board in one word among others; an A10 is not an
    A100, and an unknown board has no peak (the bench then asks for --peak-tflops)."""
    assert peak_bf16_tflops("NVIDIA H200") == peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == PEAK_BF16_TFLOPS["A100"] == 312.0
    assert peak_bf16_tflops("NVIDIA A10") == 125.0
    assert peak_bf16_tflops("Tesla T4") is None


def test_the_bf16_probe_cache_is_kept_apart_for_capped_instruction_sets(tmp_path, monkeypatch):
    """The stand-in of a CPU without bf16 units caps the kernels' instruction sets on a CPU that
    has them (ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY): its probe must not
    land in the uncapped CPU's cache entry, or every later run there would take bf16 for slow."""
    from cll_scale.core import hardware
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for isa in ("", "AVX2"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        hardware._bf16_speedup.cache_clear()
        hardware.cpu_bf16_speedup(1)
    hardware._bf16_speedup.cache_clear()
    assert len(list((tmp_path / "cll-scale").glob("cpu-bf16-*.json"))) == 2


def test_named_ds_configs_resolve_and_say_their_precision():
    assert resolve_ds_config("cpu_bf16.json") == (DS_CONFIGS / "cpu_bf16.json", "named by the recipe")
    assert precision(json.loads((DS_CONFIGS / "cpu_bf16.json").read_text())) == "bf16"
    assert precision(json.loads((DS_CONFIGS / "cpu_fp32.json").read_text())) == "fp32"
    path, why = resolve_ds_config("auto", agree=lambda faster: False)     # another rank lacks fast bf16
    assert path.name in ("gpu_bf16.json", "cpu_fp32.json") and why


def test_bf16_matmuls_in_fp32_compute_what_bf16_matmuls_compute():
    """Forward and backward of F.linear and @ on bf16 tensors, in torch's own bf16 kernels and in
    the fp32 mode: bf16 results either way, equal but for the order of the fp32 sums (at most a
    few elements one bf16 step apart). fp32 tensors pass through untouched."""
    torch.manual_seed(0)
    x = torch.randn(64, 96, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(48, 96, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(48, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(64, 48, dtype=torch.bfloat16)

    def forward_backward(mode):
        for t in (x, w, b):
            t.grad = None
        with mode:
            y = F.linear(x, w, b)
            z = y @ w
        torch.autograd.backward([y, z], [g, torch.ones_like(z)])
        return [t.detach() for t in (y, z, x.grad, w.grad, b.grad)]

    for own, emulated in zip(forward_backward(contextlib.nullcontext()), forward_backward(Bf16MatmulsInFp32())):
        assert own.dtype == emulated.dtype == torch.bfloat16
        assert (own != emulated).float().mean() < 0.01
        torch.testing.assert_close(emulated.float(), own.float(), rtol=2 ** -7, atol=1e-3)
    exact = F.linear(x.detach().float(), w.detach().float())       # not rounded to bf16: differs
    with Bf16MatmulsInFp32():
        assert not torch.equal(F.linear(x, w).float(), exact)
        assert torch.equal(F.linear(x.detach().float(), w.detach().float()), exact)


def test_only_bf16_runs_on_a_slow_bf16_cpu_emulate_it():
    assert not emulates_bf16("fp32", torch.device("cpu")) and not emulates_bf16("bf16", torch.device("cuda"))
    assert emulates_bf16("bf16", torch.device("cpu")) == (cpu_bf16_speedup() < 1.0)
    assert emulates_bf16(precision(json.loads((DS_CONFIGS / "cpu_bf16.json").read_text())), torch.device("cpu")) == \
        emulates_bf16("bf16", torch.device("cpu"))


@pytest.mark.parametrize("spec, rank, hits", [
    ("nan@3", "0", {("nan", 3)}), ("nan@3x2", "0", {("nan", 3), ("nan", 4)}), ("oom@2", "0", {("oom", 2)}),
    ("nan@3", "1", {("nan", 3)}), ("", "0", set())])
def test_faults_fire_where_asked_once_per_step(monkeypatch, spec, rank, hits):
    monkeypatch.setenv("CLL_FAULT", spec)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(faults, "_fired", set())
    asked = {(kind, step) for kind in ("nan", "oom", "crash_in_save") for step in range(1, 7) if faults.hit(kind, step)}
    assert asked == hits
    assert not any(faults.hit(kind, step) for kind, step in hits)        # once each
    monkeypatch.setenv("CLL_FAULT_RANK", "5")                             # another rank's fault
    monkeypatch.setattr(faults, "_fired", set())
    assert not any(faults.hit(kind, step) for kind, step in hits)
    monkeypatch.setenv("CLL_FAULT", "kill_at_swap")
    assert faults.hit("kill_at_swap") and not faults.hit("nan", 3)

"""The machine facts that choose a run's precision, and MFU's peak (cll_scale/precision.py)."""
import json

import pytest

from cll_scale import faults
from cll_scale.precision import DS_CONFIGS, PEAK_BF16_TFLOPS, peak_bf16_tflops, precision, resolve_ds_config


def test_peak_table_reads_device_names_by_word():
    """torch's CUDA device names carry the board in one word among others; an A10 is not an
    A100, and an unknown board has no peak (the bench then asks for --peak-tflops)."""
    assert peak_bf16_tflops("NVIDIA H200") == peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == PEAK_BF16_TFLOPS["A100"] == 312.0
    assert peak_bf16_tflops("NVIDIA A10") == 125.0
    assert peak_bf16_tflops("Tesla T4") is None


@pytest.mark.slow
def test_named_ds_configs_resolve_and_say_their_precision():
    assert resolve_ds_config("cpu_bf16.json") == (DS_CONFIGS / "cpu_bf16.json", "named by the recipe")
    assert precision(json.loads((DS_CONFIGS / "cpu_bf16.json").read_text())) == "bf16"
    assert precision(json.loads((DS_CONFIGS / "cpu_fp32.json").read_text())) == "fp32"
    path, why = resolve_ds_config("auto", agree=lambda faster: False)     # another rank lacks fast bf16
    assert path.name in ("gpu_bf16.json", "cpu_fp32.json") and why


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

"""The metrics of a run: one logger writes metrics.jsonl and the monitor, MFU comes from the
device's peak (stated, overridable), and the window's sums are named."""
import json

import pytest
import torch

from cll_scale.model.config import PRESETS, ModelConfig
from cll_scale.model.model import train_flops
from cll_scale.training.metrics import LogConfig, MetricsLogger, MetricsWindow, device_peak_tflops
from tests.conftest import run_cli


def test_mfu_is_model_flops_over_time_over_the_peak():
    cpu = torch.device("cpu")
    window = MetricsWindow(cpu, capacity=4)
    ok = torch.ones((), dtype=torch.bool)
    for step in (1, 2):
        window.add(step, torch.tensor(6.0), torch.tensor(4.0), 3, ok, seconds=0.5, flops=2e12)
    sums = window.flush()
    assert (sums.flops, sums.seconds, sums.tokens, sums.skipped) == (4e12, 1.0, 6.0, [])
    record = MetricsWindow.record(sums, 8e12, step=2, lr=1e-3, epoch=0.1, grad_norm=None, elapsed_s=1.0,
                                  tokens_seen=6)
    assert record.mfu == 0.5 and record.loss == 2.0 and record.tokens_per_s == 6.0
    assert MetricsWindow.record(sums, None, step=2, lr=1e-3, epoch=0.1, grad_norm=None, elapsed_s=1.0,
                                tokens_seen=6).mfu is None


def test_the_peak_is_the_setting_or_none_on_a_cpu():
    cpu = torch.device("cpu")
    assert device_peak_tflops(LogConfig(peak_tflops=500.0), cpu) == (500.0, "log.peak_tflops")
    peak, why = device_peak_tflops(LogConfig(), cpu)
    assert peak is None and "log.peak_tflops" in why


def test_one_log_call_writes_the_line_and_the_monitor(tmp_path):
    events = []
    logger = MetricsLogger(tmp_path / "metrics.jsonl", rank=0, monitor=events.extend)
    logger.log({"step": 5, "valid_nll": 2.5, "valid_bleu": None}, {"Valid/valid_nll": 2.5, "Valid/valid_bleu": None})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 5, "valid_nll": 2.5, "valid_bleu": None}
    assert events == [("Valid/valid_nll", 2.5, 5)]          # an unknown value is not sent
    MetricsLogger(tmp_path / "other.jsonl", rank=1, monitor=None).log({"step": 1}, {})
    assert not (tmp_path / "other.jsonl").exists()          # rank 0 writes


def test_train_flops_counts_the_lsls_of_cll_layers_only():
    base = ModelConfig(**PRESETS["small"], variant="baseline", languages=["de", "fr"])
    fcll = ModelConfig(**PRESETS["small"], variant="fcll", languages=["de", "fr"])
    extra = train_flops(fcll, 8, 20, 21) - train_flops(base, 8, 20, 21)
    assert extra == 3.0 * fcll.decoder_layers * 2 * 8 * 21 * 2 * fcll.d_model * fcll.lsl_dim


def installed(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


@pytest.mark.skipif(not installed("tensorboard"), reason="the tensorboard package is not installed here")
def test_log_tensorboard_writes_an_event_file_through_deepspeeds_monitor(m30k_centered, tmp_path, capsys):
    from cll_scale.train import main as train_main
    from tests.test_train import common
    run_dir = tmp_path / "run"
    code, _, err = run_cli(train_main, common(m30k_centered, run_dir, 3, "--set", "log.tensorboard=true"), capsys)
    assert code == 0, err
    events = list((run_dir / "monitor" / "train").glob("events.out.tfevents.*"))
    assert len(events) == 1 and b"Train/loss" in events[0].read_bytes()
    assert json.loads((run_dir / "ds_config.json").read_text())["tensorboard"]["enabled"] is True


@pytest.mark.parametrize("dashboard", ["tensorboard", "wandb"])
def test_a_dashboard_whose_package_is_missing_is_refused_before_the_run_starts(m30k_centered, tmp_path, capsys,
                                                                               dashboard):
    if installed(dashboard):
        pytest.skip(f"{dashboard} is installed here")
    from cll_scale.core.errors import EXIT_INPUT
    from cll_scale.train import main as train_main
    from tests.test_train import common
    run_dir = tmp_path / "run"
    code, _, err = run_cli(train_main, common(m30k_centered, run_dir, 3, "--set", f"log.{dashboard}=true"), capsys)
    assert code == EXIT_INPUT and f"log.{dashboard}: true needs the {dashboard} package" in err, err
    assert "Traceback" not in err and not run_dir.exists()

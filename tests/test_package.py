"""cll-scale installed from its wheel, used from outside any checkout: the engine settings and the
recipes travel inside the package (cll_scale.core.resources), so `--ds-config auto` and
cll-repro's recipes are found without the source tree."""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from tests.conftest import ROOT

WHEEL_SOURCES = ("setup.py", "pyproject.toml", "README.md", "cll_scale", "data_tools", "demo", "ds_configs", "recipes")


@pytest.mark.integration
def test_the_wheel_installed_in_a_fresh_venv_trains_from_outside_the_checkout(m30k_centered, tmp_path):
    src = tmp_path / "src"            # the sources a wheel is built from, outside the checkout
    src.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("cll_scale-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    # The dependencies come from this environment, appended after the fresh venv's own packages
    # (a .pth in a directory that a .pth adds is not read, so the checkout's editable finder is not)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import cll_scale.core.resources as r; "
                            "print(r.shipped('ds_configs')); print(r.shipped('recipes'))"],
                           cwd=away, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert all(p.startswith(site) and "_shipped" in p for p in where), where
    res = subprocess.run([str(venv / "bin" / "cll-train"), "--data", str(m30k_centered), "--preset", "tiny",
                          "--run-dir", str(away / "run"), "--max-steps", "2", "--ds-config", "auto",
                          "--set", "valid.every=1000", "--set", "data.batch_tokens=512"],
                         cwd=away, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (away / "run" / "export" / "export.json").is_file()
    assert "ds_config auto: cpu_" in res.stderr and (away / "run" / "ds_config.json").is_file()
    helped = subprocess.run([str(venv / "bin" / "cll-repro"), "--help"], cwd=away, env=env, capture_output=True,
                            text=True, timeout=300)
    assert helped.returncode == 0 and "--condition" in helped.stdout

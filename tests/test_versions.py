"""Versions in every record and export, and the lock file the set-up installs from."""
from __future__ import annotations

import ast
import json
import platform
import re

import deepspeed
import langdetect  # noqa: F401  (installed: the versions name it)
import sacrebleu
import torch

from cll_scale.core.hardware import hardware
from cll_scale.core.versions import versions
from tests.conftest import ROOT


def test_versions_name_python_the_packages_and_the_machine():
    v = versions()
    assert v["python"] == platform.python_version()
    assert v["torch"] == torch.__version__ and v["deepspeed"] == deepspeed.__version__
    assert v["sacrebleu"] == sacrebleu.__version__ and v["hardware"] == hardware()
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", v["langdetect"]) and re.fullmatch(r"\d+\.\d+\.\d+\S*", v["lingua"])
    try:
        import transformers
        assert v["transformers"] == transformers.__version__
    except ImportError:
        assert "transformers" not in v


def test_a_trained_run_and_its_export_record_the_versions(tiny_export):
    recorded = json.loads((tiny_export.parent / "versions.json").read_text())
    assert recorded == json.loads((tiny_export / "export.json").read_text())["versions"] == versions()


def _setup_requirements() -> list[str]:
    """The package names setup.py asks for (install_requires and every extra)."""
    call = next(n for n in ast.walk(ast.parse((ROOT / "setup.py").read_text())) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
    specs = kw["install_requires"] + [x for extra in kw["extras_require"].values() for x in extra]
    return [re.split(r"[<>=!~\[ ]", s, maxsplit=1)[0] for s in specs]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_lock_pins_every_package_the_set_up_installs_but_torch():
    lines = [x for x in (ROOT / "requirements.lock").read_text().splitlines() if x and not x.startswith("#")]
    pins = {}
    for line in lines:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[^=\s]+", line), f"not an exact pin: {line!r}"
        name, version = line.split("==")
        pins[_norm(name)] = version
    assert "torch" not in pins         # the set-up picks the CPU or CUDA build itself
    missing = [p for p in _setup_requirements() if _norm(p) != "torch" and _norm(p) not in pins]
    assert not missing, f"requirements.lock lacks {missing}: rewrite it (scripts/setup_env.sh --write-lock)"
    script = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert 'LOCK=${CLL_LOCK-requirements.lock}' in script and '-c "$LOCK"' in script

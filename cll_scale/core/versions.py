"""The software and machine a result was made with, as records and exports name them: Python,
torch, DeepSpeed, sacreBLEU, langdetect, lingua and transformers (when installed), and the CPU
or GPU. Read from the installed packages' metadata, so nothing here imports them."""
from __future__ import annotations

import platform
from importlib import metadata

from cll_scale.core.hardware import hardware

# Our name -> the distribution's. transformers is optional (the dev extra): absent, it is left out.
PACKAGES = {"torch": "torch", "deepspeed": "deepspeed", "sacrebleu": "sacrebleu", "langdetect": "langdetect",
            "lingua": "lingua-language-detector", "transformers": "transformers"}
OPTIONAL = {"transformers"}


def versions() -> dict[str, str]:
    """``{"python": "3.12.3", "torch": "2.13.0+cpu", ..., "hardware": "2 CPU cores (...)"}``; a
    required package that is missing reads "not installed"."""
    out = {"python": platform.python_version()}
    for name, dist in PACKAGES.items():
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            if name not in OPTIONAL:
                out[name] = "not installed"
    out["hardware"] = hardware()
    return out

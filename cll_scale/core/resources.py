"""Where the files the package ships beside its code are: the engine settings (``ds_configs/``) and
the recipes (``recipes/``). A wheel carries them inside the package (``cll_scale/_shipped/``,
copied there by setup.py's build step); a source checkout keeps them at its top, beside the
package. Every reader finds them here, so an installed cll-scale works from any directory."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
SHIPPED = ("ds_configs", "recipes")


def shipped(name: str) -> Path:
    """The directory of ``name`` (one of :data:`SHIPPED`): the installed package's copy, else the
    checkout's."""
    if name not in SHIPPED:
        raise ValueError(f"cll-scale ships {', '.join(SHIPPED)}, not {name!r}")
    inside = PACKAGE / "_shipped" / name
    return inside if inside.is_dir() else PACKAGE.parent / name

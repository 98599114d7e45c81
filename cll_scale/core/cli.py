"""What every console script shares besides its error path (:mod:`cll_scale.core.errors`): the
debug flag, the device rule, the echo of the command, and the flags made from a config's fields.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
from pathlib import Path

from cll_scale.core.compat import OLD_FLAGS
from cll_scale.core.errors import DeviceError
from cll_scale.core.settings import field_default


def plain_text(doc: str) -> str:
    """A module docstring as ``--help`` shows it: reStructuredText's markup taken out (a role such
    as :class:`a.b.C` becomes ``C``, a module role keeps the dotted path; double backquotes go)."""
    doc = re.sub(r":(?:func|class|meth|attr|data|exc|obj):`~?(?:[\w.]+\.)?([\w]+)`", r"\1", doc)
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)
    return doc.replace("``", "")


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback too")


def pick_device(requested: str | None) -> str:
    """One device rule for every command: CUDA when present, ``--device`` to override."""
    import torch
    if requested in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = requested.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device {requested}: no CUDA device is available here (torch {torch.__version__}"
                          f"{'' if torch.version.cuda else ', a CPU-only build'}); use --device cpu")
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {requested}: expected cpu, cuda, cuda:N or auto")
    return requested


def echo_command(prog: str, argv: list[str] | None) -> str:
    """The command as the user typed it: under ``deepspeed`` the launcher's ``--local_rank=N`` is
    left out and the rank count is given instead."""
    argv = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--local_rank=")]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ranks = f" ({world} ranks)" if world > 1 else ""
    return f"`{prog} {' '.join(shlex.quote(a) for a in argv)}`{ranks}"


def print_tables(prog: str, argv: list[str] | None, tables: dict[str, str]) -> None:
    """The closing output of the commands that end in an evaluation: the command, then a table per split."""
    print(f"Command: {echo_command(prog, argv)}\n")
    for split, table in tables.items():
        print(f"## {split}\n\n{table}")


def parse_models(specs: list[str]) -> dict[str, str]:
    """``--model NAME=EXPORT_DIR`` (or a bare directory, named after its parent) → {name: path}."""
    models = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        name, path = (name, path) if eq else (Path(spec).parent.name or spec, spec)
        if name in models:
            raise ValueError(f"--model name {name!r} given twice")
        models[name] = path
    return models


def add_config_arguments(p: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One flag per field of the dataclass ``cls`` that carries ``metadata={"help": ...}``
    (fairseq's way): ``--max-len-a`` for ``max_len_a`` (or the metadata's ``flag``), its default
    and type from the field, so each default and help text is written once, in the config. A field
    without a default is a required flag; a list field reads comma-separated values; a switch
    that is off by default is a plain flag; other metadata keys (``type``, ``choices``,
    ``metavar``) go to ``add_argument``."""
    own = cls.__dict__.get("__annotations__", {})      # the class's own fields first, inherited ones after
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):
        if "help" not in f.metadata or f.name in skip:
            continue
        kw = {k: v for k, v in f.metadata.items() if k not in ("help", "flag")}
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else field_default(f)
        flags = flags_of(f.metadata.get("flag", "--" + f.name.replace("_", "-")))
        if default is False:
            p.add_argument(*flags, dest=f.name, action="store_true", help=f.metadata["help"])
            continue
        if "type" not in kw:
            kw["type"] = (csv_list if isinstance(default, list) else finite_float if isinstance(default, float)
                          else int if isinstance(default, int) and not isinstance(default, bool) else str)
        shown = ",".join(default) if isinstance(default, list) else default
        help_text = f.metadata["help"] + ("" if required or shown in ("", None) else f" (default: {shown})")
        p.add_argument(*flags, dest=f.name, required=required, default=default, help=help_text, **kw)


def flags_of(flag: str) -> list[str]:
    """A flag and the old names it is still read by (:data:`cll_scale.core.compat.OLD_FLAGS`)."""
    return [flag, *OLD_FLAGS.get(flag, ())]


def config_from_args(cls, args: argparse.Namespace, **values):
    """``cls`` from the flags :func:`add_config_arguments` added (and ``values`` for the rest)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{**{k: v for k, v in vars(args).items() if k in names}, **values})


def csv_list(text: str) -> list[str]:
    """``"de, fr,,cs"`` → ``["de", "fr", "cs"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; expected 0 or more")
    return value


def finite_float(text: str) -> float:
    """A float flag: ``nan`` and ``inf`` parse as floats but are never a setting."""
    import math
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: expected a finite number")
    return value


def non_negative_float(text: str) -> float:
    import math
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a number >= 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected 1 or more")
    return value



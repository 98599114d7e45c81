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

from collections.abc import Callable

from cll_scale.core.compat import OLD_FLAGS, notice
from cll_scale.core.errors import DeviceError
from cll_scale.core.settings import coerce_number, field_default


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


# The one form of --model in every command: an export directory, optionally named (the name
# heads the tables and figures of the commands that compare models; a bare directory is named
# after its parent, the run directory).
MODEL_METAVAR = "[NAME=]EXPORT_DIR"


def model_spec(spec: str) -> tuple[str, str]:
    """``--model [NAME=]EXPORT_DIR`` → (name, path)."""
    name, eq, path = spec.partition("=")
    return (name, path) if eq and name and "/" not in name else (Path(spec).parent.name or spec, spec)


def export_dir(spec: str) -> str:
    """The path of a ``--model [NAME=]EXPORT_DIR`` where a command takes one model (the name is not used)."""
    return model_spec(spec)[1]


def add_model_argument(p: argparse.ArgumentParser, help: str, several: bool = False) -> None:
    """``--model [NAME=]EXPORT_DIR``, repeatable where the command compares models."""
    if several:
        p.add_argument("--model", action="append", required=True, metavar=MODEL_METAVAR, help=help)
    else:
        p.add_argument("--model", required=True, type=export_dir, metavar=MODEL_METAVAR, help=help)


def parse_models(specs: list[str]) -> dict[str, str]:
    """Repeated ``--model [NAME=]EXPORT_DIR`` → {name: path}."""
    models = {}
    for spec in specs:
        name, path = model_spec(spec)
        if name in models:
            raise ValueError(f"--model name {name!r} given twice")
        models[name] = path
    return models


def add_device_argument(p: argparse.ArgumentParser) -> None:
    """``--device``, the same in every command that takes one (:func:`pick_device`)."""
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (CUDA when present) (default: auto)")


def add_lsl_argument(p: argparse.ArgumentParser, help: str) -> None:
    """The one name of the LSL switch: ``--ablate-lsl`` (paper Tables 9-10 switch the LSLs off)."""
    p.add_argument("--ablate-lsl", action="store_true", help=help)


def add_config_arguments(p, cls, skip: tuple[str, ...] = (), section: str | None = None,
                         shown: dict[str, str] | None = None) -> None:
    """The package's one flag generator: a flag per field of the dataclass ``cls`` made with
    :func:`cll_scale.core.settings.setting`, its help and default written once, in the config.

    The flag is the field's name with hyphens (``--max-len-a``), or ``--SECTION.name`` for a recipe
    section (``--optim.warmup_steps``: the recipe's key as written), or the short name the setting
    declares (``flag="--data"``); the other spellings are read as hidden aliases that print one
    warning line. A command's own config (no ``section``) gets its typed value here: a number
    through :func:`cll_scale.core.settings.coerce_number`, a list from comma-separated text, a
    switch that is off by default as a plain flag, a setting without a default as a required flag.
    A recipe section's value stays the text typed (``default`` None: not given), read later by the
    recipe layer exactly as ``--set`` reads it, through the same coercion. ``shown`` replaces the
    default a help text names (the model's sizes come from the preset)."""
    own = cls.__dict__.get("__annotations__", {})      # the class's own fields first, inherited ones after
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.name not in own):
        if "help" not in f.metadata or f.name in skip:
            continue
        kw = {k: v for k, v in f.metadata.items() if k not in ("help", "flag")}
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else field_default(f)
        name = f"--{section}.{f.name}" if section else "--" + f.name.replace("_", "-")
        flag = f.metadata.get("flag", name)
        dest = f"{section}.{f.name}" if section else f.name
        aliases = [a for a in dict.fromkeys([name, name.replace("_", "-"), *OLD_FLAGS.get(flag, ())]) if a != flag]
        text = (shown or {}).get(f.name, default_text(default))
        notes = [f"one of {', '.join(kw['choices'])}"] if section and "choices" in kw else []
        notes += [] if required or text is None else [f"default: {text}"]
        help_text = f.metadata["help"] + (f" ({'; '.join(notes)})" if notes else "")
        if section:
            kw.update(default=None, metavar="VALUE")
        elif default is False:
            kw.update(action="store_true")
        elif isinstance(default, bool):
            raise TypeError(f"{cls.__name__}.{f.name}: a switch that is on by default would need a --no- flag, "
                            "which no command's config has")
        else:
            kw.setdefault("type", value_type(flag, default, f.type))
            kw.update(default=default, required=required)
        p.add_argument(flag, dest=dest, help=help_text, **kw)
        for alias in aliases:
            add_alias(p, alias, flag, dest=dest, **{k: v for k, v in kw.items() if k != "required"})


def default_text(value) -> str | None:
    """A default as a recipe or a command line writes it (None: nothing worth showing)."""
    if value is None or value == "" or value == [] or value == ():
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def value_type(flag: str, default, annotation) -> Callable[[str], object]:
    """How a command's own setting reads its text: the one coercion of numbers
    (:func:`cll_scale.core.settings.coerce_number`), a list from comma-separated text, a string as typed."""
    names = {part.strip() for part in getattr(annotation, "__name__", str(annotation)).split("|")} - {"None"}
    kind = {"int": int, "float": float}.get(next(iter(names)) if len(names) == 1 else "")
    if isinstance(default, list) or any(n.startswith("list[") for n in names):
        return csv_list
    if kind is None:
        return str

    def read(text: str):
        try:
            return coerce_number(flag, text, kind)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    read.__name__ = kind.__name__            # argparse names the type in its error line
    return read


def add_alias(p, old: str, flag: str, **kw) -> None:
    """``old``: another spelling of ``flag`` that scripts may still use, read as ``flag`` (same
    destination and type), hidden from ``--help``, with one warning line a process."""
    # the class argparse resolves an action's name to ("store", "store_true"), as add_argument does
    base = p._registry_get("action", kw.pop("action", "store"), None)

    class Alias(base):
        def __call__(self, parser, namespace, values, option_string=None):
            notice(f"{old} is now {flag} (read as such; the old spelling will go)")
            super().__call__(parser, namespace, values, option_string)
    p.add_argument(old, action=Alias, help=argparse.SUPPRESS, **kw)


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




def seed_list(text: str) -> list[int]:
    """``--seeds 1,2,3``: distinct positive seeds."""
    seeds = [positive_int(x) for x in csv_list(text)]
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: expected distinct positive seeds, e.g. 1,2,3")
    return seeds

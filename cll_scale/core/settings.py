"""The bottom of the package: how a component declares its settings, and how a value is checked.

Each component owns its recipe section as a dataclass beside it (``StreamConfig`` in
:mod:`cll_scale.data.stream`, ``OptimConfig`` in :mod:`cll_scale.training.optim`, ...), its fields
made with :func:`setting`, whose help text becomes the flag's. The recipe layer
(:mod:`cll_scale.run.recipe`) gathers the sections; this module imports nothing of the package.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import field


# The default of a setting that has none: a command's required flag (``--model``, ``--out``).
REQUIRED = dataclasses.MISSING


def setting(default, help: str, **meta):
    """A field whose help text (and ``meta``: choices, flag, type) is its flag's: the one way every
    config declares a setting (:func:`cll_scale.core.cli.add_config_arguments` makes the flags)."""
    if default is REQUIRED:
        return field(metadata={"help": help, **meta})
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


def coerce_number(name: str, value, kind: type):
    """The config boundary of every numeric setting: a count is a whole number, a float is finite
    (NaN would pass every ``<``/``>`` check and reach config.json as invalid JSON), a switch is a
    boolean. YAML reads ``7e-4`` as a string and ``1e3`` as a float, so both convert here."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, not {value!r}")
        return value
    try:
        number = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None:
        raise ValueError(f"{name}: {value!r} is not a{'n integer' if kind is int else ' number'}")
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    if kind is int:
        if number != int(number):
            raise ValueError(f"{name} must be a whole number, not {value!r}")
        return int(value) if isinstance(value, int) else int(number)
    return number


def default_of(cls: type, name: str):
    """The default of the setting ``name`` of the config class ``cls``."""
    return field_default(next(f for f in dataclasses.fields(cls) if f.name == name))


def field_default(f: dataclasses.Field):
    """A dataclass field's default, from its factory if it has one."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default

"""The one seam for fault injection: the reliability tests (docs/reliability.md) make a run fail
at a chosen point through the environment, and production code asks :func:`hit` there; nothing
else passes faults around. Off unless ``CLL_FAULT`` is set.

    CLL_FAULT=<kind>@<step>[x<count>]    at those training steps (CLL_FAULT_RANK: on that rank only)
    CLL_FAULT=<kind>                     at every point of that kind

The points: ``nan`` (the step's loss is made non-finite), ``oom`` (its forward pass raises
out-of-memory), ``crash_in_save`` (the process dies with that step's checkpoint files written,
before the commit), ``kill_at_swap`` (an atomic directory swap dies after the exchange, before
the clean-up).
"""
from __future__ import annotations

import os

_fired: set[tuple[str, int]] = set()


def _asked(kind: str, step: int | None) -> bool:
    name, _, at = os.environ.get("CLL_FAULT", "").partition("@")
    if name != kind:
        return False
    if not at:
        return True
    if os.environ.get("CLL_FAULT_RANK", os.environ.get("RANK", "0")) != os.environ.get("RANK", "0"):
        return False
    first, _, count = at.partition("x")
    if step is None or not first.isdigit():
        return False
    return int(first) <= step < int(first) + (int(count) if count.isdigit() else 1)


def hit(kind: str, step: int | None = None) -> bool:
    """Whether the fault ``kind`` is asked for here (at ``step``); a step's fault fires once."""
    if not _asked(kind, step):
        return False
    if step is not None:
        if (kind, step) in _fired:
            return False
        _fired.add((kind, step))
    return True


def crash() -> None:
    """Die at once, as a killed process does: no clean-up, no flush."""
    os._exit(137)

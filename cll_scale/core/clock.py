"""Seconds per stage of a shard build, so that a user who builds OPUS-100 at full size sees where
the hours go (``cll-shards build`` prints them; bench/bench_opus_shape.py tables and extrapolates
them).

The stages do not overlap and the build's last stage is the rest of its wall time, so the stages
add up to the whole build.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
_END = object()


class StageClock:
    """Accumulates seconds of ``timer`` (``time.perf_counter``) by stage name, in the order the
    stages first ran."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self.timer = timer
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self) -> float:
        return sum(self.seconds.values())

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = self.timer()
        try:
            yield
        finally:
            self.add(name, self.timer() - start)

    def iterate(self, name: str, items: Iterable[T]) -> Iterator[T]:
        """``items`` with the time spent producing each one counted to ``name``: a reader's own
        time, without that of the loop body that consumes what it reads."""
        it = iter(items)
        while True:
            with self.stage(name):
                item = next(it, _END)
            if item is _END:
                return
            yield item

    def format(self) -> str:
        stages = ", ".join(f"{name} {s:.1f}" for name, s in self.seconds.items())
        return f"{self.total():.1f} s ({stages})"

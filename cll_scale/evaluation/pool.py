"""The process pool that scores and identifies languages while the next direction decodes."""
from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager


def _worker_init() -> None:
    """Ctrl-C reaches every process of the terminal's group: the command stops the pool and says
    "interrupted" once, so a worker ignores SIGINT instead of printing its own traceback. The worker
    was started with SIGINT blocked (``_ScoringPool.submit``), so a Ctrl-C during its start-up waits
    pending until here, where ignoring it discards it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _ScoringPool(ProcessPoolExecutor):
    """A spawned worker spends seconds starting Python and importing torch before its initializer
    runs; a Ctrl-C then would kill it with a traceback of its own. ``submit`` starts the workers, so
    it runs with SIGINT blocked (the mask is per thread, so any thread may call it): the child
    inherits the mask through fork and exec, and the calling thread's own Ctrl-C is delivered as
    soon as the mask is restored, so nothing is lost."""

    def submit(self, fn, /, *args, **kwargs):
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return super().submit(fn, *args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def lid_pool(workers: int | None = None) -> Iterator[Executor | None]:
    """The process pool that scores while the next direction decodes (None: score inline), one
    per command: a spawned worker imports the command's main module (torch with it), so it is
    started once, on the first job, and serves every model and test set. Workers are started fresh
    ("spawn"), not forked: a fork copies the parent's thread pools (torch's, lingua's) without their
    threads, and a child that touches one hangs."""
    workers = max(1, min(16, (os.cpu_count() or 2) - 1)) if workers is None else workers
    if workers <= 0:
        yield None
        return
    pool = _ScoringPool(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)

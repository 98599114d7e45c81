"""The process pool that scores and identifies languages while the next direction decodes."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
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
    it runs with SIGINT blocked: the child inherits the mask through fork and exec.

    The mask is the calling thread's only. The kernel may hand the Ctrl-C to another thread of the
    command (torch's, the pool's manager), and Python would then raise KeyboardInterrupt in this one
    in the middle of starting a worker, before it was sent what it needs (it printed
    ``EOFError: Ran out of input``). So in the main thread the interrupt is also held back until
    the worker is started, then raised."""

    def submit(self, fn, /, *args, **kwargs):
        held = []
        main = threading.current_thread() is threading.main_thread()
        handler = signal.signal(signal.SIGINT, lambda *_: held.append(True)) if main else None
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return super().submit(fn, *args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            if main:
                signal.signal(signal.SIGINT, handler)
                if held and callable(handler):
                    handler(signal.SIGINT, None)          # Python's own raises KeyboardInterrupt
                elif held and handler == signal.SIG_DFL:
                    raise KeyboardInterrupt


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

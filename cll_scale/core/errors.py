"""The error types and exit codes of every command, and the one error path that turns a failure
into them (:func:`run_guarded`).

An expected failure ends in one line ``cll-<cmd>: error: …`` and an exit code that tells its
kind; a traceback is shown only with ``--debug`` (an unexpected exception still shows one: that
is a bug to report).

====  =====================================================================================
exit  meaning
====  =====================================================================================
0     done
2     bad arguments, settings or input (also argparse's code)
3     the file system refused: a missing or unwritable path, a full disk
4     the device: not present, or out of memory where a step cannot be skipped
5     training diverged (too many skipped steps in a row)
128+n stopped by signal n after saving what resumes it (SIGINT 130, SIGUSR1 138, SIGTERM 143)
====  =====================================================================================
"""
from __future__ import annotations

import sys
import traceback
from typing import Callable

EXIT_INPUT, EXIT_FILES, EXIT_DEVICE, EXIT_DIVERGED = 2, 3, 4, 5


class DeviceError(RuntimeError):
    """The requested device cannot be used (absent, or out of memory where nothing can be skipped)."""


def describe(err: BaseException) -> str:
    """An error in one line (an OSError names its path)."""
    if isinstance(err, OSError) and err.filename and err.strerror:
        target = f"{err.filename} -> {err.filename2}" if err.filename2 else err.filename
        return f"{target}: {err.strerror}"
    return str(err) or type(err).__name__


def exit_code(err: BaseException) -> int | None:
    """The exit code of an expected failure; None for an unexpected one (a bug)."""
    import torch
    if isinstance(getattr(err, "exit_code", None), int):     # a stop by signal, checkpoint saved
        return err.exit_code
    if isinstance(err, KeyboardInterrupt):
        return 130
    if isinstance(err, (DeviceError, torch.OutOfMemoryError)):
        return EXIT_DEVICE
    if isinstance(err, FloatingPointError):
        return EXIT_DIVERGED
    if isinstance(err, FileExistsError):       # an existing output: the user decides
        return EXIT_INPUT
    if isinstance(err, OSError):               # (a failed checkpoint save says EXIT_FILES itself)
        return EXIT_FILES
    if isinstance(err, ValueError):            # ManifestError, ExportError, LanguageError, CorpusError…
        return EXIT_INPUT
    return None


def on_failure(cleanup: Callable[[], None]) -> None:
    """Have :func:`run_guarded` call ``cleanup`` before it reports an expected failure: a layer
    above this one registers what must be undone (the collectives leave a process group), so
    that this module never reaches up to it."""
    if cleanup not in _CLEANUPS:
        _CLEANUPS.append(cleanup)


_CLEANUPS: list[Callable[[], None]] = []


def run_guarded(prog: str, body: Callable[[], int | None], debug: bool = False) -> int:
    """Call ``body`` (a command's work) and turn an expected failure into one line and its exit code."""
    try:
        return body() or 0
    except (Exception, KeyboardInterrupt) as err:   # noqa: BLE001 - sorted into expected or not below
        code = exit_code(err)
        if code is None:
            raise
        for cleanup in _CLEANUPS:        # e.g. leave a process group, or gloo's threads could abort the exit
            cleanup()
        if debug:
            traceback.print_exc()
        if getattr(err, "exit_code", None) is not None:
            hint = getattr(err, "hint", "")
            print(f"{prog}: {err}" + (f"; {hint}" if hint else ""), file=sys.stderr)
        elif isinstance(err, KeyboardInterrupt):
            print(f"{prog}: interrupted", file=sys.stderr)
        else:
            print(f"{prog}: error: {describe(err)}", file=sys.stderr)
        return code

"""What a command writes, written so that nothing else is ever lost.

Two promises, kept here for every command:
- **Atomic**: a file or directory is either the old one or the whole new one (a run can be
  killed at any moment, and resumption reads these files back).
- **Owned**: ``--overwrite`` replaces only a directory that this tool wrote itself, recognised
  by its marker (a shard build's ``manifest.json``, a downloaded corpus's known file names) and
  holding nothing else. A user's corpus, home directory or an unrelated folder named by mistake
  is refused with what is there, never deleted. An output that is, contains or sits inside an
  input is refused too, even without ``--overwrite``. Symlinks are resolved first, so a link
  cannot smuggle another directory past these checks.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

# Files we create are readable by the group and others, as `open()` would make them under the
# usual umask; mkstemp's private 0600 is not what a shared run directory needs.
FILE_MODE = 0o666


class OutputError(ValueError):
    """An output path would destroy or overlap something this command does not own."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Readers of ``path`` see the old file or the whole new one, never a partial write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fchmod(f.fileno(), FILE_MODE & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _listing(path: Path, names: Iterable[str], limit: int = 6) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_output(out: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False,
                 kind: str, strangers: Callable[[Path], list[str] | None]) -> Path:
    """Decide whether ``out`` may be written; return it resolved (symlinks followed).

    ``strangers(dir)`` says what in an existing ``dir`` this tool did not write: ``None`` when
    the directory lacks the tool's marker altogether, else the foreign entries (``[]`` = all
    ours). Only an all-ours directory is replaced, and only with ``overwrite``."""
    resolved = Path(out).resolve()
    for inp in inputs:
        source = Path(inp)
        if not source.exists():        # e.g. a hub dataset name: nothing local to protect
            continue
        source = source.resolve()
        if resolved == source or source in resolved.parents or resolved in source.parents:
            relation = ("is" if resolved == source else
                        "sits inside" if source in resolved.parents else "contains")
            raise OutputError(f"--out {out} {relation} the input {inp}; write the output elsewhere")
    if not resolved.exists() and not resolved.is_symlink():
        return resolved
    if not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    if not resolved.is_dir():
        raise OutputError(f"--out {out} is a file, not a {kind}; refusing to replace it")
    foreign = strangers(resolved)
    if foreign is None:
        present = [p.name for p in resolved.iterdir()]
        what = f"it holds {_listing(resolved, present)}" if present else "it is empty"
        raise OutputError(f"--overwrite refused: {out} is not a {kind} ({what}); "
                          "remove it yourself or choose another --out")
    if foreign:
        raise OutputError(f"--overwrite refused: {out} is a {kind} but also holds what this tool did not "
                          f"write: {_listing(resolved, foreign)}; move those away or choose another --out")
    return resolved


def remove_stale_temps(out: Path) -> None:
    """Temporary siblings of ``out`` left by processes that are gone (killed mid-write)."""
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        try:
            pid = int(stale.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(stale, ignore_errors=True)
        except PermissionError:
            pass


@contextlib.contextmanager
def atomic_dir(out: Path, replace: bool = False):
    """Yield a temporary sibling of ``out``, renamed to ``out`` when the block succeeds and
    removed when it fails: a directory is either complete or absent. With ``replace`` an existing
    ``out`` is exchanged for the new one in one step once the new one is complete. Callers decide
    beforehand, with ``check_output``, that an existing ``out`` is theirs to replace."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists() and not replace:
            raise FileExistsError(f"{out} appeared while it was being built")
        if out.exists():
            exchange(tmp, out)        # ``out`` is whole at every instant: the old, then the new
            if os.environ.get("CLL_FAULT") == "kill_at_swap":   # test hook: die before the clean-up
                os._exit(137)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)      # the new directory on failure, the old on success


def exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``), so that a reader
    of either path, or a crash, never sees it missing. Where the call is unavailable, ``b`` is
    moved aside and back in two renames, a window of a few microseconds."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
        errno = ctypes.get_errno()
        if errno not in (22, 38, 95):       # EINVAL, ENOSYS, EOPNOTSUPP: fall back below
            raise OSError(errno, os.strerror(errno), str(a), None, str(b))
    aside = b.parent / f".{b.name}.old-{os.getpid()}"
    os.replace(b, aside)
    os.replace(a, b)
    os.replace(aside, a)


class BusyError(OutputError):
    """Another live process holds the directory."""


class DirLock:
    """An exclusive lock on a directory, for one command: two processes writing one run
    directory would interleave their records and overwrite each other's checkpoints.

    ``flock`` on ``<dir>/.lock``: the kernel releases it when the holder ends, even by ``kill -9``,
    so a killed run's directory resumes without clean-up. The file names the holder for the
    error message of a second process."""

    NAME = ".lock"

    def __init__(self, directory: str | os.PathLike, what: str):
        self.dir, self.what, self.fd = Path(directory), what, None

    def acquire(self) -> "DirLock":
        import fcntl
        import socket
        import time
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / self.NAME, os.O_RDWR | os.O_CREAT, FILE_MODE & ~_umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise BusyError(f"{self.dir} is in use by {holder}; wait for that {self.what} to end, "
                            f"or choose another directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)       # closing the descriptor drops the flock
            self.fd = None

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
    ``out`` is swapped out only once the new one is complete. Callers decide beforehand, with
    ``check_output``, that an existing ``out`` is theirs to replace."""
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
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

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
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from cll_scale.core import faults

# Files we create are readable by the group and others, as `open()` would make them under the
# usual umask; mkstemp's private 0600 is not what a shared run directory needs.
FILE_MODE = 0o666


class OutputError(ValueError):
    """An output path would destroy or overlap something this command does not own."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def naming(path: str | os.PathLike):
    """An ``OSError`` raised inside names ``path``: a write to an open file that fails (a full
    disk: ENOSPC, EFBIG) carries no file name, and "[Errno 28] No space left on device" alone
    does not say where."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Readers of ``path`` see the old file or the whole new one, never a partial write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with naming(path), os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fchmod(f.fileno(), FILE_MODE & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _non_finite(obj, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in ``obj``, e.g. ``train.clip_norm``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "the value"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _non_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def _nulls_for_non_finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nulls_for_non_finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nulls_for_non_finite(v) for v in obj]
    return obj


def json_text(obj, non_finite_as_null: bool = False, **kwargs) -> str:
    """Strict JSON, as every file the project writes must be: Python's ``json`` would write NaN and
    Infinity, which other readers (``jq``, JavaScript, Go) reject. Config boundaries refuse
    non-finite settings first; this is the last guard, naming the value. Measurements that may
    legitimately be non-finite (a skipped step's gradient norm in ``metrics.jsonl``) are written
    as ``null`` with ``non_finite_as_null``."""
    if non_finite_as_null:
        obj = _nulls_for_non_finite(obj)
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:
        raise ValueError(f"{_non_finite(obj)} is not finite: JSON cannot hold NaN or infinity") from None


def _listing(path: Path, names: Iterable[str], limit: int = 6) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _same_file(a: Path, b: Path) -> bool:
    """One file under two names: a symlink (resolved away before) or a hard link (same inode)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_apart(out: str | os.PathLike, inputs: dict[str, str | os.PathLike | None], out_flag: str = "--out") -> Path:
    """Refuse an output that is an input, or contains or sits inside one, before anything is read:
    ``cll-translate --input x --output x`` would otherwise leave ``x`` holding only the translation.
    ``inputs`` maps each input's flag to its path (``None``, ``""`` (a setting left unset, which
    ``Path`` would read as the working directory) or a path that does not exist, e.g. a hub
    dataset name, has nothing local to protect). Symlinks and hard links count as the same file.
    Returns ``out`` resolved."""
    resolved = Path(out).resolve()
    for flag, inp in inputs.items():
        if inp is None or inp == "" or not Path(inp).exists():
            continue
        source = Path(inp).resolve()
        if resolved == source or _same_file(resolved, source):
            relation = "is"
        elif source in resolved.parents:
            relation = "sits inside"
        elif resolved in source.parents:
            relation = "contains"
        else:
            continue
        named = f"{flag} " if flag.startswith("-") else ""
        raise OutputError(f"{out_flag} {out} {relation} the input {named}{inp}; write the output elsewhere")
    return resolved


def check_stdin_apart(out: str | os.PathLike, out_flag: str = "--output") -> None:
    """``cmd < x --output x``: standard input redirected from the very file the output replaces."""
    try:
        st_in, st_out = os.fstat(0), os.stat(out)
    except (OSError, ValueError):
        return
    if (st_in.st_dev, st_in.st_ino) == (st_out.st_dev, st_out.st_ino):
        raise OutputError(f"{out_flag} {out} is the file on standard input; write the output elsewhere")


# Each command's output directory carries a marker that names its owner, so that one command never
# replaces, resumes into or deletes (``--restart``) what another one wrote.
SETTINGS = "settings.json"      # cll-bt, cll-extend: {"command": ..., "settings": ...}
EXPORT = "export"               # an export/ (export.json): what cll-train, cll-bt and cll-extend write for inference


def directory_owner(path: str | os.PathLike) -> str | None:
    """Which of our commands wrote ``path``, by its marker (:data:`EXPORT` for an export); ``None``
    for anything else."""
    path = Path(path)
    if not path.is_dir():
        return None
    if (path / "export.json").is_file():       # before manifest.json: an export carries a copy of it
        return EXPORT
    settings = path / SETTINGS
    if settings.is_file():
        try:
            command = json.loads(settings.read_text(encoding="utf-8")).get("command")
        except (ValueError, UnicodeDecodeError, AttributeError):
            command = None
        return command if isinstance(command, str) else "an unknown command (unreadable settings.json)"
    if (path / "manifest.json").is_file():
        return "cll-shards build"
    if (path / "config.json").is_file() and ((path / "metrics.jsonl").exists() or (path / "checkpoints").is_dir()):
        return "cll-train"
    if (path / "results.json").is_file() and (path / "results.md").is_file():
        return "cll-eval"
    if (path / "analysis.json").is_file():
        return "cll-analyze"
    return None


def check_owner(out: str | os.PathLike, prog: str, out_flag: str = "--out") -> None:
    """Refuse a directory that another of our commands wrote, with or without ``--restart`` or
    ``--overwrite``: the message names its owner."""
    owner = directory_owner(out)
    if owner is not None and owner != prog:
        what = "an export (export.json)" if owner == EXPORT else f"a {owner} run"
        raise OutputError(f"{out_flag} {out} holds {what}, not a {prog} one; {prog} never writes into "
                          f"another command's directory: choose another {out_flag}")


def check_output(out: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False,
                 kind: str, strangers: Callable[[Path], list[str] | None]) -> Path:
    """Decide whether ``out`` may be written; return it resolved (symlinks followed).

    ``strangers(dir)`` says what in an existing ``dir`` this tool did not write: ``None`` when
    the directory lacks the tool's marker altogether, else the foreign entries (``[]`` = all
    ours). Only an all-ours directory is replaced, and only with ``overwrite``."""
    resolved = check_apart(out, {f"input {n}": inp for n, inp in enumerate(inputs)})
    if not resolved.exists() and not resolved.is_symlink():
        return resolved
    if not resolved.is_dir():       # said first: --overwrite would not help
        raise OutputError(f"--out {out} is a file, not a {kind}; choose another --out (a file is never replaced)")
    if not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
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


def share_modes(root: Path) -> None:
    """Give every file under ``root`` the mode ``open()`` would (0644 under the usual umask):
    libraries that write through a private temporary file (safetensors' ``save_file``, mkstemp)
    leave 0600, and another user of a shared cluster then cannot load the model."""
    mode = FILE_MODE & ~_umask()
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


@contextlib.contextmanager
def atomic_dir(out: Path, replace: bool = False, name: str | None = None):
    """Yield a temporary sibling of ``out``, renamed to ``out`` when the block succeeds and
    removed when it fails: a directory is either complete or absent. With ``replace`` an existing
    ``out`` is exchanged for the new one in one step once the new one is complete. Callers decide
    beforehand, with ``check_output``, that an existing ``out`` is theirs to replace. Only what
    existed when the block began is replaced: an ``out`` that another process created meanwhile
    (two builds into one new directory) is refused, never overwritten. ``name``: how the user
    gave ``out`` (``--out data/x``), for the error when ``out`` cannot be written at all."""
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out)
        existed = replace and out.exists()
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as err:      # read-only or immutable folder, no permission, a file on the way, disk full
        # Named as the user gave it: the temporary sibling is ours, and means nothing to them.
        raise OSError(f"{name or out} cannot be written: {refused_at(tmp.parent, err)}") from err
    appeared = FileExistsError(f"{out} appeared while it was being built (another process writing it?); "
                               "nothing was replaced")
    try:
        yield tmp
        share_modes(tmp)
        if out.exists() and not existed:
            raise appeared
        if out.exists():
            exchange(tmp, out)        # ``out`` is whole at every instant: the old, then the new
            if faults.hit("kill_at_swap"):       # the exchange done, the clean-up not
                faults.crash()
        else:
            try:
                os.rename(tmp, out)       # fails on a directory that appeared since the check above
            except OSError as err:
                if out.exists():
                    raise appeared from err
                raise
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
        self.made_dir = self.made_file = False

    def acquire(self) -> "DirLock":
        import fcntl
        import socket
        import time
        self.made_dir = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / self.NAME
        while True:
            self.made_file = not path.exists()
            fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE & ~_umask())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
                os.close(fd)
                raise BusyError(f"{self.dir} is in use by {holder}; wait for that {self.what} to end, "
                                f"or choose another directory") from None
            # A refused command removes the lock file it made (``abandon``); a process that opened
            # it just before then holds a lock on a removed file, so it checks and tries again.
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)       # closing the descriptor drops the flock
            self.fd = None

    def abandon(self) -> None:
        """Release after a refusal: a command that wrote nothing leaves nothing behind, not even
        the lock file (which would make the directory look like one of ours to other tools)."""
        if self.fd is not None and self.made_file:
            (self.dir / self.NAME).unlink(missing_ok=True)      # still held: nobody else has it
        self.release()
        if self.made_dir:
            with contextlib.suppress(OSError):
                self.dir.rmdir()            # only if it is still empty


def _ours(name: str, names: Iterable[str]) -> bool:
    """``name`` is one of ``names`` (``*`` a run of digits: ``heatmap-*.png``), the lock, or a
    temporary file of :func:`write_atomic` left by a killed writer."""
    if name == DirLock.NAME or (name.startswith(".") and name.endswith(".tmp")):
        return True
    return any(re.fullmatch(re.escape(n).replace(r"\*", r"\d+"), name) for n in names)


@contextlib.contextmanager
def result_dir(out: str | os.PathLike, prog: str, writes: Iterable[str],
               inputs: dict[str, str | os.PathLike | None], out_flag: str = "--out"):
    """The directory of a command that writes its result as a whole (cll-eval, cll-analyze), owned
    as every output is. Before the block, so before any work: ``out`` is refused if it is a file,
    an input (:func:`check_apart`), another command's directory (:func:`check_owner`) or holds
    anything but ``writes`` (the entries ``prog`` makes; it is replaced as a whole, and a user's
    file in it would be lost); it is locked (:class:`DirLock`: a second process is refused), and
    writability is proven by making the lock and the new directory. The block writes into the
    yielded temporary directory, which replaces ``out`` in one step when the block ends well
    (:func:`atomic_dir`): no file of an earlier result survives beside the new one (heat maps of
    more sentences, hypotheses of other models). On failure ``out`` stays as it was, and a
    directory the lock made is removed."""
    if Path(out).exists() and not Path(out).is_dir():
        raise OutputError(f"{out_flag} {out} is a file; give a directory")
    check_owner(out, prog, out_flag)            # first, as every command: whose directory it is says most
    resolved = check_apart(out, inputs, out_flag)
    writes = tuple(writes)
    if resolved.is_dir():
        foreign = [p.name for p in resolved.iterdir() if not _ours(p.name, writes)]
        if foreign:
            raise OutputError(f"{out_flag} {out} holds what {prog} did not write: {_listing(resolved, foreign)}; "
                              f"{prog} replaces its directory as a whole: move those away or choose another "
                              f"{out_flag}")
    try:
        lock = DirLock(resolved, f"{prog} run").acquire()
    except OSError as err:
        raise _unwritable(err, out, out_flag) from None
    try:
        with contextlib.ExitStack() as stack:
            try:
                tmp = stack.enter_context(atomic_dir(resolved, replace=True))     # its sibling: the parent
            except OSError as err:
                raise _unwritable(err, out, out_flag) from None
            yield tmp
    except BaseException:
        lock.abandon()
        raise
    lock.release()


def _unwritable(err: OSError, out, out_flag: str) -> OSError:
    """The file system's refusal of ``out`` (exit 3), said as for a shard build: the flag as the
    user typed it, the nearest path there is, and why."""
    if isinstance(err.__cause__, OSError):      # atomic_dir's own wording: say it of the flag instead
        err = err.__cause__
    # what was refused: the output, its lock or its sibling
    return OSError(f"{out_flag} {out} cannot be written: {refused_at(Path(err.filename or out), err)}; "
                   "nothing was computed")


def check_file_writable(out: Path, flag: str, work: str = "nothing was computed") -> None:
    """Refuse, before any work, an output file whose folder cannot take it: :func:`write_atomic`
    writes a temporary sibling there and renames it, so that is what is tried (and removed)."""
    try:
        fd, probe = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.probe-")
    except OSError as err:
        raise OSError(f"{flag} {out} cannot be written: {refused_at(out.parent, err)}; {work}") from None
    os.close(fd)
    os.unlink(probe)


def refused_at(path: Path, err: OSError) -> str:
    """``where: why`` for a path that could not be written: the nearest part of it there is (a
    folder, or a file in the way) and the file system's reason."""
    path = path.absolute()
    where = next(p for p in (path, *path.parents) if p.exists())
    return f"{where}: {err.strerror or str(err) if where.is_dir() else 'a file, not a directory'}"

"""Atomic file writes: a reader sees either the old file or the complete new one, never a mix.

Every file nph writes goes through `atomic_write`, so an interrupted command (Ctrl-C, kill -9,
a full disk) cannot leave a half-written or destroyed file behind.

The temporary is NAME inside a folder `.NAME.HOST-PID.XXXXXXXX.tmp` beside NAME (which also
catches a writer library's own temporaries). Ctrl-C and errors remove it; a process killed
outright (SIGKILL, SIGTERM, power loss) cannot, so the next write of NAME on the same machine
removes those whose process is gone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from nphcli.core.errors import NphError, NphRuntimeError
from nphcli.core.notices import notice


def check_output(
    path: str | os.PathLike, *, force: bool, protect: Sequence[str | os.PathLike] = ()
) -> Path:
    """Refuse an output before any work: one of the command's inputs `protect` (even with
    force), a folder nph cannot write in, or an existing file without `force`."""
    check_not_input(path, protect)
    return check_writable(path, force=force)


def check_writable(path: str | os.PathLike, *, force: bool) -> Path:
    """Refuse to write `path` before any work is done: missing folder, or existing without force."""
    path = Path(path)
    check_folder(path)
    if path.exists() and not force:
        raise NphError(f"{path} already exists; pass --force to replace it")
    return path


def check_not_input(path: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> Path:
    """Refuse an output `path` that names one of the command's input files (even with --force:
    replacing what is being read is never what was meant)."""
    path = Path(path)
    for other in map(Path, inputs):
        if path.resolve() == other.resolve() or (
            path.exists() and other.exists() and os.path.samefile(path, other)
        ):
            raise NphError(f"{path} is an input of this command; choose another output file")
    return path


def check_folder(path: str | os.PathLike) -> Path:
    """Refuse a `path` nph could not create: its folder is missing, is a file, or is not
    writable; or `path` itself is a folder."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        if folder.exists():
            raise NphError(f"cannot write {path}: {folder} is a file, not a folder")
        raise NphError(f"cannot write {path}: folder {folder} does not exist")
    if path.is_dir():
        raise NphError(f"cannot write {path}: it is a directory")
    if not os.access(folder, os.W_OK):
        raise NphError(f"cannot write {path}: folder {folder} is not writable")
    return path


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, *, force: bool = False, before_switch: Callable[[], None] | None = None
) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success fsync it and rename it over
    `path` (same filesystem: POSIX makes the rename atomic). On any exception the temporary is
    removed and the old file untouched. `before_switch` runs after the fsync, right before the
    rename: the place to put files that the new `path` names (`app/store.py`)."""
    with staged(path, force=force) as stage:
        yield stage.tmp
        stage.commit(before_switch=before_switch)


class Stage:
    """A temporary file for `path` (`staged`): `tmp` to write, `commit` to switch it in."""

    def __init__(self, path: Path, folder: Path, *, force: bool) -> None:
        self.path, self.folder, self.force = path, folder, force
        self.tmp = folder / path.name  # the writer's suffix kept; writers may pick a format by it
        self.tmp.touch()

    def commit(
        self, target: Path | None = None, *, before_switch: Callable[[], None] | None = None
    ) -> Path:
        """fsync the temporary and rename it to `target` (by default `path`, refused without
        force if it appeared meanwhile); `before_switch` runs just before the rename."""
        target = self.path if target is None else target
        try:
            with open(self.tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.chmod(self.tmp, _final_mode(target))
            if target.exists() and not self.force:  # appeared while we were working
                raise NphError(f"{target} already exists; pass --force to replace it")
            if before_switch is not None:
                before_switch()
            os.replace(self.tmp, target)
            fsync_folder(target.parent)
        except OSError as error:
            reason = write_failure_reason(error)
            raise NphRuntimeError(f"could not write {target}: {reason}") from error
        return target


@contextlib.contextmanager
def staged(path: str | os.PathLike, *, force: bool = False) -> Iterator[Stage]:
    """A `Stage` for `path`: its temporary is `NAME` in a private folder beside `path` (module
    docstring), so a writer's own temporaries land there too and go with it, on any exception
    or at the next write of `path`. A write that fails for want of space is one NphError."""
    path = check_writable(path, force=force)
    for stale in remove_stale_temporaries(path):
        notice(f"removed {stale}, left by an nph process killed while writing {path.name}")
    prefix = f".{path.name}.{_host()}-{os.getpid()}."
    try:
        folder = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=path.parent))
    except OSError as error:
        raise NphError(f"cannot write {path}: {error.strerror or error}") from None
    try:
        yield Stage(path, folder, force=force)
    except Exception as error:
        if not isinstance(error, OSError) and not _is_serializer_io_error(error):
            raise
        raise NphRuntimeError(f"could not write {path}: {write_failure_reason(error)}") from error
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _is_serializer_io_error(error: Exception) -> bool:
    """A writer library's wrapped I/O failure (safetensors raises its own SafetensorError, not
    OSError, when the disk fills up)."""
    from safetensors import SafetensorError  # a dependency; cheap, and no torch

    text = str(error)  # "I/O error: No space left on device (os error 28)"; older: IoError(...)
    return isinstance(error, SafetensorError) and any(
        word in text for word in ("IoError", "I/O error", "(os error ")
    )


def write_failure_reason(error: Exception) -> str:
    """Why a write failed, in words: a full disk says so and what to do."""
    text = str(error)
    if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
        "No space left" in text or "StorageFull" in text or "QuotaExceeded" in text
    ):
        return "no space left on the device; free some space or write elsewhere"
    return getattr(error, "strerror", None) or text


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def remove_stale_temporaries(path: str | os.PathLike, names: str | None = None) -> list[Path]:
    """Delete temporary files of `path` (or of every file in its folder whose name matches the
    regular expression `names`) left by nph processes of this machine that no longer run
    (killed before they could clean up); returns what was deleted. Only POSIX can ask whether a
    process exists; files of other machines, and of processes still running, are never touched."""
    path = Path(path)
    if os.name != "posix":
        return []
    folder = path.parent if str(path.parent) else Path(".")
    name = re.escape(path.name) if names is None else f"(?:{names})"
    pattern = re.compile(rf"\.{name}\.{re.escape(_host())}-(?P<pid>\d+)\.[^.]+\.tmp\Z")
    removed = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            match = pattern.match(entry.name)
            if match is None or _running(int(match["pid"])):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:  # a temporary file of an older nph
                    os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _running(pid: int) -> bool:
    if not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists but belongs to another user
        pass
    return True


def _final_mode(path: Path) -> int:
    """Keep a replaced file's permissions; a new file gets the usual 0o666 minus the umask
    (a file in the private 0o700 temporary folder would otherwise surprise users sharing it)."""
    if path.exists():
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` itself durable (best effort: not every platform allows it);
    shared by `atomic_write` and the sweep results file."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

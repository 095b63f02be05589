"""One writer per file: an exclusive lock held while a command reads, changes and rewrites it
(a sweep's results file, a shard manifest, a growing memory's manifest), so two writers never
interleave rows or each switch the file to their own. A sweep or a memory change is refused at
once (`wait=False`, with the caller's advice); `nph index` waits its turn (`wait=True`).

The lock is a sidecar, `.NAME.lock` (a `--force` sweep renames a new file over NAME, which a lock
on the old inode would not cover), holding the holder's pid and command line. With `fcntl` it is
`flock`ed (the kernel releases it when the process dies); elsewhere created with O_EXCL and
removed on release. It follows the file: the sidecar sits beside a symlink's target and an
existing file's inode is flocked too, so a hard link or another spelling of the path meets it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from nphcli.core.errors import NphError
from nphcli.core.notices import notice

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


def lock_path(path: str | os.PathLike) -> Path:
    """The sidecar lock file of `path`."""
    path = Path(os.path.realpath(path))
    return path.with_name(f".{path.name}.lock")


_SWEEP_ADVICE = "wait for it to finish or choose another --out"


class WriterLock:
    """An exclusive lock on the file `path`: taken at once or refused with an NphError ending
    with `advice`, or with `wait`, taken once the holder lets go (said on stderr while waiting;
    flock only)."""

    def __init__(
        self, path: str | os.PathLike, *, wait: bool = False, advice: str = _SWEEP_ADVICE
    ) -> None:
        self._advice = advice  # what the refused writer can do
        self.path = Path(path)
        self.file: Path | None = lock_path(path)
        self._fd: int | None = None
        self._inode_fd: int | None = None
        self._wait = wait and fcntl is not None
        self._acquire()
        if fcntl is not None and self.file is not None and self.path.exists():
            self._lock_inode()

    def _acquire(self) -> None:
        holder = f"pid {os.getpid()}: {' '.join(sys.argv)}"[:500] + "\n"
        if fcntl is None:
            try:
                self._fd = os.open(self.file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._refuse(hint=f"; if no such process runs, delete {self.file}")
            except OSError as error:
                raise NphError(f"cannot lock {self.path}: {error.strerror or error}") from None
        else:
            while self._fd is None:
                try:
                    fd = os.open(self.file, os.O_CREAT | os.O_RDWR, 0o644)
                except PermissionError:  # a folder we may not write: --resume of a file in it
                    self._lock_results_file()
                    return
                except OSError as error:
                    raise NphError(f"cannot lock {self.path}: {error.strerror or error}") from None
                if not self._flock(fd):
                    os.close(fd)
                    self._refuse()
                # The holder before us may have removed the sidecar between our open and our
                # flock: then we hold a lock nobody else can see; open the new one instead.
                with contextlib.suppress(FileNotFoundError):
                    if os.path.samestat(os.fstat(fd), os.stat(self.file)):
                        self._fd = fd
                if self._fd is None:
                    os.close(fd)
            os.ftruncate(self._fd, 0)
        os.write(self._fd, holder.encode("utf-8", errors="replace"))

    def _lock_results_file(self) -> None:
        """flock the results file itself (no sidecar, so no holder to name)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as error:
            raise NphError(f"cannot lock {self.path}: {error.strerror or error}") from None
        if not self._flock(fd):
            os.close(fd)
            self._refuse()
        self._fd, self.file = fd, None

    def _lock_inode(self) -> None:
        """flock the existing file too, whatever name reached it (a hard link has its own lock)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # unreadable: the writer will say so
        if not self._flock(fd):
            os.close(fd)
            self.release()
            self.file = None  # the sidecar we held is not the holder's
            self._refuse()
        self._inode_fd = fd

    def follow(self) -> None:
        """Lock the file's inode as well, now that it exists (it did not when the lock was
        taken): a hard link made to it later then meets the lock too."""
        if fcntl is not None and self._inode_fd is None and self.file is not None:
            self._lock_inode()

    def _flock(self, fd: int) -> bool:
        """flock `fd` at once; with `wait`, else once its holder lets go. Whether it is held."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if not self._wait:
                return False
        notice(f"waiting for another nph process writing {self.path} ({self._holder()})")
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True

    def _holder(self) -> str:
        try:
            text = "" if self.file is None else self.file.read_text("utf-8", errors="replace")
        except OSError:
            text = ""
        return text.strip() or "holder unknown"

    def _refuse(self, hint: str = "") -> None:
        raise NphError(
            f"{self.path} is being written by another nph process "
            f"({self._holder()}){hint}; {self._advice}"
        )

    def release(self) -> None:
        """Remove the sidecar and unlock (idempotent)."""
        if self._inode_fd is not None:
            os.close(self._inode_fd)
            self._inode_fd = None
        if self._fd is None:
            return
        if self.file is not None:
            self.file.unlink(missing_ok=True)  # unlinked while still locked: see _acquire
        os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:  # a Results dropped after an error must not keep the file
        self.release()

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

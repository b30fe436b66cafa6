"""One writer per output folder: an exclusive ``flock`` on ``FOLDER/.graft.lock``.

The holder writes its pid and host into the file. The lock lives as long as the open file, so it is
released on any exit -- a normal end, an exception, SIGKILL, a crash -- and a folder left by a dead
process is never stale. Used by ``graft train`` (the run folder), ``graft eval --out``, the
trajectory store's writer and ``graft experiment run`` (each run of the plan it works on).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from graft.errors import UserError
from graft.files import writing

LOCK_NAME = ".graft.lock"


class LockError(UserError, RuntimeError):
    """Another process holds the folder; the message names it (pid, host, since when)."""


class FolderLock:
    """Exclusive lock on ``folder`` (created when missing), held from :meth:`acquire` to :meth:`release`.

    A folder this lock created and that holds nothing but the lock file when released is removed
    again, so a run refused after taking the lock leaves no trace."""

    def __init__(self, folder: str | os.PathLike, what: str = "folder") -> None:
        self.folder, self.what = Path(folder), what
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None
        self._created = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "FolderLock":
        """Take the lock or raise :class:`LockError` naming the holder; writes nothing else."""
        if self._fd is not None:
            return self
        self._created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder_text(fd)
            os.close(fd)
            raise LockError(
                f"{self.what} {self.folder} is in use by {who}; wait for it to end, stop it, or choose another {self.what}"
            ) from None
        with writing(self.path):
            os.ftruncate(fd, 0)
            os.pwrite(
                fd, f"pid {os.getpid()} on {socket.gethostname()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode(), 0
            )
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        if self._created and [p.name for p in self.folder.iterdir()] == [LOCK_NAME]:
            self.path.unlink(missing_ok=True)
            self.folder.rmdir()
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


def _holder_text(fd: int) -> str:
    """What the holder of the lock on ``fd`` wrote into it (``pid N on HOST (since ...)``)."""
    return os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"


def holder(folder: str | os.PathLike) -> str | None:
    """Who holds ``folder``'s lock (``pid N on HOST (since ...)``), or None when nobody does; takes nothing
    and creates nothing."""
    path = Path(folder) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_text(fd)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)

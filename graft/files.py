"""File helpers below storage and trainer: JSON that never holds NaN, fsync of a path, and the one-line error
for an output that cannot be written."""
from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path

from graft.errors import UserError


def json_safe(v):
    """``v`` with NaN/±inf replaced by ``None`` at any depth (dict keys become text, tuples
    lists, NumPy/torch scalars Python numbers); other objects are left for ``json`` to judge."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or isinstance(v, (str, bool, int)):
        return v
    if isinstance(v, dict):
        return {(k if isinstance(k, str) else str(k)): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if hasattr(v, "tolist"):   # NumPy scalars and arrays, tensors
        return json_safe(v.tolist())
    if hasattr(v, "__float__") and not isinstance(v, (str, bytes)):
        return json_safe(float(v))
    return v


def dumps_json(record, **kw) -> str:
    """``json.dumps`` of :func:`json_safe` ``(record)`` with ``allow_nan=False``."""
    return json.dumps(json_safe(record), allow_nan=False, **kw)


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` (a file or a folder: its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OutputError(UserError, RuntimeError):
    """The run folder (or a file in it) cannot be written: permissions, a file in the way, disk full.
    The message names the path and the cause."""


# errno values that mean "this output cannot be written here", as opposed to a bug.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR,
                           errno.EISDIR, errno.ENAMETOOLONG, errno.EFBIG})


def output_error(e: BaseException, what: str | os.PathLike) -> OutputError | None:
    """An :class:`OutputError` for an exception raised while writing ``what``, when it is an
    out-of-space / permission / path error (also torch's and safetensors' RuntimeErrors that
    report a failed file write); ``None`` for anything else."""
    if isinstance(e, OSError) and e.errno in OUTPUT_ERRNOS:
        target = e.filename or what
        hint = " (disk full?)" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
        return OutputError(f"cannot write {target}: {e.strerror or e}{hint}")
    text = str(e)
    if isinstance(e, RuntimeError) and any(m in text for m in _WRITE_FAILURES):
        return OutputError(f"cannot write {what}: {text.splitlines()[0][:200]} ({_free_space(what)}; disk full?)")
    return None


# How torch's zip writer and safetensors word a failed or short file write (torch reports a full
# disk in the middle of a tensor as "unexpected pos A vs B": fewer bytes landed than it wrote).
_WRITE_FAILURES = ("No space left", "file write failed", "unexpected pos")


def _free_space(what: str | os.PathLike) -> str:
    """'N MiB free' on the file system that holds ``what`` (its nearest existing parent)."""
    p = Path(what).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return f"{shutil.disk_usage(p).free / 2**20:.0f} MiB free"
    except OSError:
        return "free space unknown"

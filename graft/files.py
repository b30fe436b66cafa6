"""File helpers below storage and trainer: JSON that never holds NaN, fsync of a path, and the one-line error
for an output that cannot be written."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
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
    if hasattr(v, "tolist"):  # NumPy scalars and arrays, tensors
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
OUTPUT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENAMETOOLONG,
        errno.EFBIG,
    }
)
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def output_error(e: BaseException, what: str | os.PathLike) -> OutputError | None:
    """An :class:`OutputError` for an exception raised while writing ``what``, when it is an
    out-of-space / permission / path error: an ``OSError``, the OS error a Rust-backed writer quotes
    (safetensors' ``SafetensorError``, tokenizers' ``Exception``: "... (os error 28)"), or torch's
    RuntimeError for a failed file write; ``None`` for anything else. An :class:`OutputError` is
    returned as it is (an inner writer already named its file)."""
    if isinstance(e, OutputError):
        return e
    code, cause = _os_error(e)
    if code in OUTPUT_ERRNOS:
        target = (e.filename2 or e.filename) if isinstance(e, OSError) else None
        hint = " (disk full?)" if code in _FULL_ERRNOS else ""
        return OutputError(f"cannot write {target or what}: {cause}{hint}")
    text = str(e)
    if isinstance(e, RuntimeError) and any(m in text for m in _WRITE_FAILURES):
        cause = _TORCH_PREFIX.sub("", text.splitlines()[0])[:200]
        return OutputError(f"cannot write {what}: {cause} ({_free_space(what)}; disk full?)")
    return None


@contextlib.contextmanager
def writing(path: str | os.PathLike):
    """Run the block that writes ``path``: a failure :func:`output_error` recognises leaves it as
    that :class:`OutputError` (naming ``path`` unless the error names its own file)."""
    try:
        yield
    except Exception as e:
        err = output_error(e, path)
        if err is None or err is e:
            raise
        raise err from None


def write_text(path: str | os.PathLike, text: str) -> None:
    """``Path(path).write_text(text)``, failing with an :class:`OutputError` that names ``path``."""
    with writing(path):
        Path(path).write_text(text)


# How torch's zip writer words a failed or short file write (a full disk in the middle of a tensor
# is "unexpected pos A vs B": fewer bytes landed than it wrote; its C++ stream's failure "iostream
# error"), and the C++ location it puts first.
_WRITE_FAILURES = ("No space left", "file write failed", "unexpected pos", "iostream error")
_TORCH_PREFIX = re.compile(r"^\[enforce fail at [^\]]*\]\s*\.?\s*")
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


def _os_error(e: BaseException) -> tuple[int | None, str]:
    """The errno behind ``e`` and its wording: an ``OSError``'s, or the one a Rust library quotes."""
    if isinstance(e, OSError):
        return e.errno, e.strerror or str(e)
    m = _RUST_OS_ERROR.search(str(e))
    if m is None:
        return None, ""
    code = int(m.group(1) or m.group(2))
    return code, os.strerror(code)


def _free_space(what: str | os.PathLike) -> str:
    """'N MiB free' on the file system that holds ``what`` (its nearest existing parent)."""
    p = Path(what).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return f"{shutil.disk_usage(p).free / 2**20:.0f} MiB free"
    except OSError:
        return "free space unknown"

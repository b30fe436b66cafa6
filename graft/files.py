"""File helpers below storage and trainer: JSON that never holds NaN, and fsync of a path."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path


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

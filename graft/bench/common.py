"""What every part of ``graft bench`` shares: the alternation of sides, medians, peak RSS, the
machine's description, and number formatting."""

from __future__ import annotations

import math
import os
import platform
import re
import resource
import statistics
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from graft.console import say

PARTS = ("a", "b", "c")


def progress(msg: str) -> None:
    """One progress line on stderr (none with ``-q``)."""
    say(f"[bench] {msg}")


def series(values: list) -> dict:
    """``{"median", "values"}`` of a list of numbers (``None`` entries are skipped by the median)."""
    nums = [v for v in values if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v))]
    return {"median": statistics.median(nums) if nums else None, "values": list(values)}


def summarize(rows: list[dict], keys: tuple[str, ...]) -> dict:
    """:func:`series` of every key of ``keys`` over ``rows``."""
    return {k: series([r.get(k) for r in rows]) for k in keys}


def clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf become ``None``, tuples lists, unknown objects their ``str``."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter of this process (Linux >= 4.0); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_gb() -> float:
    """``ru_maxrss`` in GiB (Linux reports KiB): the peak since the last :func:`reset_peak_rss`."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def rss_gb() -> float | None:
    """This process's resident size now in GiB (None where ``/proc`` cannot say)."""
    try:
        m = re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(m.group(1)) / 2**20 if m else None


def cpu_model() -> str:
    """The CPU's model name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str | None:
    """The installed version of package ``name``, None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx_vnni", "amx_bf16")


def cpu_features(cpuinfo: str | None = None) -> str:
    """``family F model M: FLAGS`` of the first CPU -- the matmul instruction sets (AVX-512, bf16, AMX) that set
    how fast fp32 and bf16 run, so that tables made on two hosts with the same model name can be told apart."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    first = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        first[key.strip()] = value.strip()
    flags = set(first.get("flags", "").split())
    return f"family {first.get('cpu family', '?')} model {first.get('model', '?')}: " + (
        " ".join(f for f in SIMD_FLAGS if f in flags) or "no AVX2"
    )


def environment() -> dict:
    """Versions, CPU, threads and GPU of this machine and process."""
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "trl": package_version("trl"),
        "graft": package_version("graft"),
        "cpu_model": cpu_model(),
        "cpu_features": cpu_features(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def alternate(
    reps: int, sides: Sequence[tuple[str, Callable[[int], dict]]], part: str, describe: Callable[[dict], str]
) -> dict[str, list[dict]]:
    """Run ``reps`` rounds of every side in order (A, B, A, B, ...); each side's rows get the
    peak RSS of their own run (``peak_rss_gb``), the resident size after it (``rss_gb``) and the
    torch thread count it ran with."""
    out: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for i in range(reps):
        for name, fn in sides:
            scoped = reset_peak_rss()
            row = fn(i)
            row |= {
                "peak_rss_gb": peak_rss_gb(),
                "peak_rss_scope": "side" if scoped else "process",
                "rss_gb": rss_gb(),
                "torch_threads": torch.get_num_threads(),
            }
            out[name].append(row)
            progress(f"({part}) rep {i + 1}/{reps} {name}: {describe(row)}")
    return out


def fmt(v: Any, unit: str = "", digits: int = 1) -> str:
    """``v`` with ``digits`` decimals (floats) and ``unit``; ``n/a`` for None."""
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def steps_line(row: dict) -> str:
    """The phase times of one training-step row, for a progress line."""
    parts = [
        f"{k.replace('_s', '')} {fmt(row.get(k), ' s')}"
        for k in ("step_s", "rollout_s", "score_s", "exchange_s", "update_s")
        if row.get(k) is not None
    ]
    return ", ".join(parts)

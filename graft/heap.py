"""``cpu_memory: keep``: the process's C allocator keeps the memory that freed tensors give back, for reuse.

A CPU update allocates and frees the same large buffers every micro-batch (Gemma-3's [n, 262k] logits chunks, a
[262k, 640] gradient of the tied embedding, the optimiser's temporaries). glibc's malloc serves each block above its
mmap threshold (at most 32 MB) with a fresh ``mmap`` and unmaps it on ``free``, so every such allocation page-faults
its memory in again, page by page, with the kernel zeroing each page: in the default job's Gemma-3 update, 4.4
million minor faults and 14 s of system time in a 26 s update (``benchmarks/results/cpu-memory/``). With ``mallopt``
set to never ``mmap`` (``M_MMAP_MAX = 0``) and never return the heap's top to the kernel (``M_TRIM_THRESHOLD = -1``),
a freed block stays in the heap and later allocations reuse it: no faults after the first step (torch's
``posix_memalign`` cannot reuse a freed chunk of exactly its size, so a block may be faulted in twice before the
heap holds enough free space; ``tests/test_heap.py``). The numbers computed are the same (only where the buffers
live changes); the process's resident memory stays at its peak.
"""

from __future__ import annotations

import ctypes

from graft.registry import CPU_MEMORY

M_TRIM_THRESHOLD = -1
"""glibc ``malloc.h``: the free memory at the heap's top above which ``free`` returns it to the kernel; -1: never."""
M_MMAP_MAX = -4
"""glibc ``malloc.h``: how many blocks may be served by ``mmap`` at once; 0: none (every block from the heap)."""


CPU_MEMORY.register("keep", True)
CPU_MEMORY.register("release", False)


def keep_freed_memory() -> bool:
    """Make this process's ``malloc`` keep freed memory for reuse (see the module); returns whether it took effect:
    ``False`` where the C library has no ``mallopt`` (macOS) or ignores it (musl). Process-wide and permanent."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, -1) == 1

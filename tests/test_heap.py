"""``cpu_memory: keep`` (graft/heap.py): freed memory stays in the process, so a re-allocation does not fault again."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from graft.config import load_config
from graft.trainer.backends import keeps_memory
from tests.patience import patient

REPO = Path(__file__).resolve().parents[1]

# 256 MB allocated, touched and freed five times, before and after a worker that keeps memory is made. Without it
# glibc serves the block with a fresh mmap each time: 65,536 pages of 4 KB fault in every time. With it the first
# allocation grows the heap and later ones reuse it. torch allocates with posix_memalign(64, n), which cannot reuse a
# freed chunk of exactly n bytes, so when some small allocation lands above the first block before it is freed (another
# thread, the heap's layout), the second grows the heap once more (seen in CI: 65458, 65536, 0); from then on the freed
# space is reused. So: at most two of the five fault, against all five without it.
PROBE = """
import json, resource, torch
from graft.trainer.workers import PolicyWorker
torch.set_num_threads(1)
def faults():
    out = []
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = torch.ones(64 * 2**20)
        del t
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out
released = faults()
PolicyWorker("A", keep_memory=True)
print(json.dumps({"released": released, "kept": faults()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_worker_that_keeps_memory_reuses_freed_blocks_without_faulting():
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=patient(120))
    assert p.returncode == 0, p.stderr
    if "has no effect here" in p.stderr:
        pytest.skip("this C library has no glibc mallopt: " + p.stderr.strip())
    got = json.loads(p.stdout)
    assert all(n > 30_000 for n in got["released"]), got  # each time ~65,536 fresh pages
    assert sum(n > 30_000 for n in got["kept"]) <= 2 and min(got["kept"][2:]) < 1_000, got  # grows, then reused


def test_memory_is_kept_by_default_on_cpu_only(tmp_path):
    base = [f"run_dir={tmp_path}/run", "models=[{name: A, path: x}, {name: B, path: y}]"]
    cfg = load_config(None, base)
    assert cfg.cpu_memory == "keep"
    assert keeps_memory(cfg, "cpu") and not keeps_memory(cfg, "cuda")
    assert not keeps_memory(load_config(None, [*base, "cpu_memory=release"]), "cpu")

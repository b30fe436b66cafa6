"""scripts/gpu_check.sh: fails fast without CUDA; its CPU dry run runs one GRAFT step end to end."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from tests.patience import patient


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_fails_fast_with_a_clear_message():
    t0 = time.time()
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=patient(120))
    assert p.returncode == 2, p.stderr
    assert "CUDA is not available" in p.stderr and "--device cpu --dry-run" in p.stderr
    assert time.time() - t0 < 60


@pytest.mark.slow
def test_cpu_dry_run_runs_one_graft_step(tiny_llama_dir, tiny_gemma_dir):   # fixtures: tokenizers are cached
    p = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--dry-run", "--engines", "hf"],
                       capture_output=True, text=True, timeout=patient(280))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [l for l in p.stdout.splitlines() if l.startswith("gpu_check: RESULT ")]
    assert lines, p.stdout
    res = json.loads(lines[-1][len("gpu_check: RESULT "):])
    for m in ("A", "B"):
        assert res[f"{m}/rollout_tokens"] > 0 and res[f"{m}/rollout_tokens_per_s"] > 0
        assert res[f"{m}/train_tokens"] > 0 and res[f"{m}/train_tokens_per_s"] > 0
    assert "rollout (hf)" in p.stdout and "update:" in p.stdout and "exchange: A->B 2 responses" in p.stdout

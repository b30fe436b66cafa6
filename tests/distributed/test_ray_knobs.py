"""Issue 38: the learning-rate schedule, the KL penalty and gradient checkpointing run through the one update
path of the Ray backend (two FSDP ranks per model) as in one process."""
from __future__ import annotations

import pytest

from tests.distributed.test_ray_backend import (  # noqa: F401
    COMMON,
    PARAM_ATOL,
    RAY2,
    _run_steps,
    local_ray,
)
from tests.trainer.helpers import tiny_config

KNOBS = ("models.0.lr_schedule=cosine", "models.0.warmup_steps=1", "models.0.kl_coef=0.1",
         "models.1.lr_schedule=linear", "models.1.gradient_checkpointing=true", "models.1.kl_coef=0.05",
         "models.1.kl_loss_type=k2")


@pytest.mark.slow
def test_ray_knobs_match_single_process(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, local_ray):  # noqa: F811
    rows_l, params_l, _ = _run_steps(tiny_config(tmp_path / "local", tiny_llama_dir, tiny_gemma_dir, *COMMON, *KNOBS),
                                     monkeypatch, [])
    rows_r, params_r, _ = _run_steps(tiny_config(tmp_path / "ray", tiny_llama_dir, tiny_gemma_dir, *COMMON, *KNOBS,
                                                 *RAY2), monkeypatch, [])
    for a, b in zip(rows_l, rows_r):
        for key in ("A/learning_rate", "B/learning_rate", "A/reward/mean", "B/reward/mean"):
            assert a[key] == b[key], key
        for key in ("A/kl", "B/kl", "A/loss", "B/loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), key
    assert [r["A/learning_rate"] for r in rows_l] == pytest.approx([1e-3, 1e-3])
    for name in ("A", "B"):
        worst = max((params_l[name][k] - params_r[name][k]).abs().max().item() for k in params_l[name])
        assert worst <= PARAM_ATOL, f"{name}: max |param diff| {worst}"

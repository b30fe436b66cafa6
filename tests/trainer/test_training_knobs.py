"""Issue 38: learning-rate schedules, the KL penalty to a frozen reference and gradient checkpointing in real
(tiny) runs: the schedule is logged per model and followed exactly by a resumed run; ``kl_coef: 0`` trains
bit for bit as without the option."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from graft.files import dumps_json
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, params, tiny_config

# A: linear after 1 warm-up step, KL k3 at 0.1; B: cosine after 2 warm-up steps (lr 1e-3 both, 3 steps)
KNOBS = ("models.0.lr_schedule=linear", "models.0.warmup_steps=1", "models.0.kl_coef=0.1",
         "models.1.lr_schedule=cosine", "models.1.warmup_steps=2")


def _rows(cfg) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]


def _final_params(cfg) -> dict:
    from graft.storage.checkpoint import latest_checkpoint, load_checkpoint
    from graft.trainer.learner import Learner
    ck = load_checkpoint(latest_checkpoint(cfg.run_dir))
    return params({m.name: Learner.local(m, weights_from=ck.model_dirs[m.name]) for m in cfg.models})


def test_schedule_and_kl_resume_equals_uninterrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    full = tiny_config(tmp_path / "full", tiny_llama_dir, tiny_gemma_dir, "steps=3", *KNOBS)
    loop.train(full)
    rows = _rows(full)
    # A, linear, warm-up 1 of 3: 1e-3 * 1/1; then p = (k - 2) / 2 = 0, 1/2
    assert [r["A/learning_rate"] for r in rows] == pytest.approx([1e-3, 1e-3, 5e-4])
    # B, cosine, warm-up 2 of 3: 1e-3 * 1/2, 2/2; then p = 0
    assert [r["B/learning_rate"] for r in rows] == pytest.approx([5e-4, 1e-3, 1e-3])
    assert all(math.isfinite(r["A/kl"]) and r["A/kl"] >= 0 for r in rows) and rows[-1]["A/kl"] > 0
    assert not any("B/kl" in r for r in rows)

    # stopped after step 2 of the 3-step plan (the horizon says so: steps=2 alone would plan a 2-step decay)
    horizon = ("models.0.lr_horizon=3", "models.1.lr_horizon=3")
    part = tiny_config(tmp_path / "part", tiny_llama_dir, tiny_gemma_dir, "steps=2", "checkpoint.save_every=1", *KNOBS,
                       *horizon)
    loop.train(part)
    loop.train(tiny_config(tmp_path / "part", tiny_llama_dir, tiny_gemma_dir, "steps=3", "checkpoint.save_every=1",
                           "resume=true", *KNOBS, *horizon))
    resumed = _rows(part)
    for key in ("A/learning_rate", "B/learning_rate", "A/reward/mean", "B/reward/mean"):
        assert [r[key] for r in resumed] == [r[key] for r in rows], key
    assert [r["A/kl"] for r in resumed] == pytest.approx([r["A/kl"] for r in rows], rel=1e-5, abs=1e-9)
    pa, pb = _final_params(full), _final_params(part)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=0, atol=1e-6)


def test_reference_is_the_starting_weights(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "models.1.kl_coef=0.01"))
    try:
        workers = {n: lr.workers.worker for n, lr in run.learners.items()}
        assert workers["A"].reference is None
        ref, pol = workers["B"].reference.model, workers["B"].policy.model
        assert not any(p.requires_grad for p in ref.parameters())
        for (n, a), (_, b) in zip(pol.named_parameters(), ref.named_parameters()):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), n
    finally:
        loop.close_run(run)


def _two_steps(tmp_path, llama, gemma, *overrides) -> tuple[dict, list[dict]]:
    run = loop.setup(tiny_config(tmp_path, llama, gemma, *overrides))
    try:
        rows = [loop.train_step(run, step) for step in (1, 2)]
        return params(run), rows
    finally:
        loop.close_run(run)


def test_kl_coef_zero_is_bit_identical(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    absent, rows_a = _two_steps(tmp_path / "absent", tiny_llama_dir, tiny_gemma_dir)
    zero, rows_z = _two_steps(tmp_path / "zero", tiny_llama_dir, tiny_gemma_dir, "models.0.kl_coef=0",
                              "models.1.kl_coef=0", "models.0.kl_loss_type=k1", "models.1.lr_schedule=constant")
    assert absent.keys() == zero.keys()
    for k in absent:
        assert torch.equal(absent[k], zero[k]), k
    for ra, rz in zip(rows_a, rows_z):
        keep = [k for k in ra if not k.startswith(("time/", "mem/")) and "tokens_per_s" not in k]
        assert dumps_json({k: ra[k] for k in keep}) == dumps_json({k: rz[k] for k in keep})   # NaN as null
        assert "A/kl" not in rz and rz["A/learning_rate"] == 1e-3

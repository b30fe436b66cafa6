"""The equal-work benchmarks' helpers (``graft.bench.runs``): one step sampled once, and every model put back to
the same weights and optimiser state before each timed update."""
from __future__ import annotations

import torch

from graft.bench.runs import close_run, first_step, restore_model, snapshot_models
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, tiny_config


def _state(run, name):
    learner = run.learners[name]
    weights = {k: v.clone() for k, v in learner.workers.worker.policy.model.state_dict().items()}
    return weights, learner.optimizer.state_dict()


def test_restore_puts_an_updated_model_back_and_the_same_update_repeats(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)  # groups with mixed rewards: the update has work
    run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "threads=1"))
    try:
        _, train = first_step(run)
        start = snapshot_models(run)
        before = _state(run, "A")
        first = loop.update_model(run, "A", train["A"], 1)
        moved = _state(run, "A")
        assert any(not torch.equal(before[0][k], moved[0][k]) for k in before[0])  # the update changed weights
        assert moved[1]["state"] and not before[1]["state"]  # and made AdamW's moments
        restore_model(run, "A", start)
        back = _state(run, "A")
        assert all(torch.equal(before[0][k], back[0][k]) for k in before[0]) and not back[1]["state"]
        again = loop.update_model(run, "A", train["A"], 1)
        assert again["loss"] == first["loss"]
        assert all(torch.equal(moved[0][k], v) for k, v in _state(run, "A")[0].items())
        restore_model(run, "A", start)  # the snapshot is copied on restore, so it serves again
        assert all(torch.equal(before[0][k], v) for k, v in _state(run, "A")[0].items())
    finally:
        close_run(run)

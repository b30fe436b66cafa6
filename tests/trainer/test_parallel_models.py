"""Issue 39: ``threads_per_model`` runs the models' rollouts and updates side by side, one Python thread per
model with its own torch threads, and every model computes exactly what the sequential loop computes with
the same thread count."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from graft.config import ConfigError
from graft.files import dumps_json
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, params, tiny_config


def _fake_run(threads_per_model: dict) -> SimpleNamespace:
    cfg = SimpleNamespace(threads_per_model=threads_per_model, threads_claim_freed=False)
    return SimpleNamespace(cfg=cfg, learners={"A": None, "B": None})


def test_models_overlap_each_on_its_own_threads():
    before = torch.get_num_threads()
    meet = threading.Barrier(2, timeout=30)   # passes only if both models run at the same time

    def fn(name):
        meet.wait()
        return threading.get_ident(), torch.get_num_threads(), name

    out = loop.per_model(_fake_run({"update": 1}), "update", fn)
    assert list(out) == ["A", "B"] and [v[2] for v in out.values()] == ["A", "B"]
    assert out["A"][0] != out["B"][0] != threading.get_ident()
    assert out["A"][1] == out["B"][1] == 1 and torch.get_num_threads() == before


def test_without_the_phase_the_models_run_in_order_on_this_thread():
    seen = []
    out = loop.per_model(_fake_run({"update": 1}), "rollout", lambda n: seen.append((n, threading.get_ident())) or n)
    assert out == {"A": "A", "B": "B"} and seen == [("A", threading.get_ident()), ("B", threading.get_ident())]


def test_the_first_models_error_is_raised_after_both_finished():
    done = []

    def fn(name):
        if name == "A":
            raise ValueError("A failed")
        done.append(name)
        return name

    with pytest.raises(ValueError, match="A failed"):
        loop.per_model(_fake_run({"rollout": 1}), "rollout", fn)
    assert done == ["B"]


@pytest.mark.parametrize("bad", ["threads_per_model.rolout=1", "threads_per_model.update=0"])
def test_threads_per_model_is_checked_at_load(tmp_path, tiny_llama_dir, tiny_gemma_dir, bad):
    with pytest.raises(ConfigError, match="threads_per_model"):
        tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, bad)


def _two_steps(tmp_path, tiny_llama_dir, tiny_gemma_dir, *overrides) -> tuple[list[dict], dict]:
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "threads=1", *overrides)
    run = loop.setup(cfg)
    try:
        rows = [loop.train_step(run, step) for step in (1, 2)]
        p = params(run)
    finally:
        loop.close_run(run)
    timing = ("time/", "tokens_per_s/", "mem/")
    return [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in rows], p


@pytest.mark.slow
def test_side_by_side_models_compute_what_the_sequential_loop_computes(tmp_path, tiny_llama_dir, tiny_gemma_dir,
                                                                        monkeypatch):
    crafted_rewards(monkeypatch)
    rows_seq, p_seq = _two_steps(tmp_path / "seq", tiny_llama_dir, tiny_gemma_dir)
    rows_par, p_par = _two_steps(tmp_path / "par", tiny_llama_dir, tiny_gemma_dir,
                                 "threads_per_model.rollout=1", "threads_per_model.update=1")
    assert dumps_json(rows_par) == dumps_json(rows_seq)   # NaN (a statistic of nothing admitted) as null
    assert any(r.get("A/peer_responses") or r.get("B/peer_responses") for r in rows_seq), "the job exchanges"
    assert p_par.keys() == p_seq.keys()
    assert all(torch.equal(p_par[k], p_seq[k]) for k in p_seq)

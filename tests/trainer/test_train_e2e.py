"""End-to-end runs of the trainer on tiny random models built with the two real tokenizers."""
from __future__ import annotations

import json

import pytest
import torch

from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, params, tiny_config


def _train(cfg):
    run = loop.setup(cfg)
    before = params(run)
    rows = []
    try:
        for step in range(1, cfg.steps + 1):
            rows.append(loop.train_step(run, step))
    finally:
        run.grader.close()
    return run, before, rows


def test_graft_step_exchanges_and_updates_both_models(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    run, before, rows = _train(cfg)
    after = params(run)
    for name in ("A", "B"):
        changed = [k for k in before if k.startswith(name + ".") and not torch.equal(before[k], after[k])]
        assert changed, f"no parameter of {name} changed"
    # prompts 0..15, 4 per step: each step has 2 even (A solves) and 2 odd (B solves) prompts,
    # so |C_A->B| = |C_B->A| = 2 = m, and each direction hands over 2 groups of 4 responses.
    for r in rows:
        assert r["exchange/A->B/candidates"] == 2 and r["exchange/B->A/candidates"] == 2
        assert r["exchange/A->B/m"] == 2 and r["exchange/A->B/kept_prompts"] == 2
        assert r["exchange/A->B/transferred"] == 8 and r["exchange/B->A/transferred"] == 8
        assert r["complementarity/A->B"] == 1.0 and r["complementarity/B->A"] == 1.0
    admitted = sum(r["exchange/A->B/admitted"] + r["exchange/B->A/admitted"] for r in rows)
    assert admitted > 0
    assert sum(r["A/peer_responses"] + r["B/peer_responses"] for r in rows) == admitted


def test_audit_log_lets_every_decision_be_rechecked(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1")
    run, _, rows = _train(cfg)
    audit = [json.loads(l) for l in (run.run_dir / "audit.jsonl").read_text().splitlines()]
    assert {(a["source"], a["receiver"]) for a in audit} == {("A", "B"), ("B", "A")}
    for a in audit:
        for c in a["candidates"]:
            assert c["k_receiver"] == 0 and 1 <= c["k_source"] < cfg.rollout.n
        for row in a["responses"]:
            s = torch.exp(torch.tensor(row["mean_logp_receiver"] - row["mean_logp_source"], dtype=torch.float64))
            assert row["s"] == pytest.approx(float(s), rel=1e-5)
            assert row["admitted"] == (row["s"] > cfg.exchange.delta)
            assert row["weight"] == pytest.approx(min(row["s"], 1.0) if row["admitted"] else 0.0, rel=1e-6)
            assert row["reward_receiver"] is not None or not row["admitted"]
        n_adm = sum(r["admitted"] for r in a["responses"])
        d = f"exchange/{a['source']}->{a['receiver']}"
        assert rows[0][f"{d}/admitted"] == n_adm
        assert rows[0][f"{d}/admitted_correct"] == sum(r["admitted"] and r["reward_source"] > 0.5 for r in a["responses"])
        assert rows[0][f"{d}/transferred_correct"] == sum(r["reward_source"] > 0.5 for r in a["responses"])
        peer = rows[0][f"{a['receiver']}/peer_responses"]
        assert rows[0][f"{a['receiver']}/peer_row_share"] == pytest.approx(peer / (peer + 4 * (4 - len(a["selected"]))))


def test_all_fail_without_exchange_gives_zero_gradient(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    # Tiny random models never write \boxed{}: every group fails, every advantage is 0, and
    # with exchange off nothing may move.
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "exchange.mode=grpo")
    run, before, rows = _train(cfg)
    after = params(run)
    assert rows[0]["A/all_fail_frac"] == 1.0 and rows[0]["B/all_fail_frac"] == 1.0
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert rows[0]["A/grad_norm"] == 0.0


def test_grpo_mode_equals_two_independent_runs(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    pair = tiny_config(tmp_path / "pair", tiny_llama_dir, tiny_gemma_dir, "exchange.mode=grpo")
    run_pair, _, rows_pair = _train(pair)
    for name in ("A", "B"):
        alone = tiny_config(tmp_path / name, tiny_llama_dir, tiny_gemma_dir, "exchange.mode=grpo", models=(name,))
        run_alone, _, rows_alone = _train(alone)
        p_pair, p_alone = params(run_pair), params(run_alone)
        for k, v in p_alone.items():
            assert torch.equal(v, p_pair[k]), k
        for rp, ra in zip(rows_pair, rows_alone):
            assert rp[f"{name}/reward/mean"] == ra[f"{name}/reward/mean"]
            assert rp[f"{name}/loss"] == pytest.approx(ra[f"{name}/loss"], abs=0)


def test_swapping_models_swaps_exchange(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path / "ab", tiny_llama_dir, tiny_gemma_dir, "steps=1")
    _, _, rows = _train(cfg)
    swapped = tiny_config(tmp_path / "ba", tiny_llama_dir, tiny_gemma_dir, "steps=1")
    swapped.models = swapped.models[::-1]
    _, _, rows_sw = _train(swapped)
    for key in ("candidates", "m", "kept_prompts", "transferred", "admitted"):
        assert rows[0][f"exchange/A->B/{key}"] == rows_sw[0][f"exchange/A->B/{key}"]
        assert rows[0][f"exchange/B->A/{key}"] == rows_sw[0][f"exchange/B->A/{key}"]

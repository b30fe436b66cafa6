"""Stored-peer mode (spec §6): replay a finished GRPO run of the peer from its trajectory store."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from graft.storage.trajectory_store import TrajectoryStore
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, tiny_config


def test_stored_peer_run_replaces_groups_as_the_store_implies(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    # 1. a GRPO run of the peer B alone writes the store
    peer_cfg = tiny_config(tmp_path / "peer", tiny_llama_dir, tiny_gemma_dir, "exchange.mode=grpo", models=("B",))
    loop.train(peer_cfg)
    store_dir = Path(peer_cfg.run_dir) / "trajectories"

    # 2. receiver A trains with GRPO and takes B's stored groups on its all-fail prompts
    cfg = tiny_config(tmp_path / "recv", tiny_llama_dir, tiny_gemma_dir, "peer.source=store",
                      f"peer.store_path={store_dir}", "exchange.delta=0.0", models=("A",))
    loop.train(cfg)
    run_dir = Path(cfg.run_dir)
    audit = [json.loads(l) for l in (run_dir / "audit.jsonl").read_text().splitlines()]
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]

    table = TrajectoryStore(store_dir).read(models=["B"]).to_pylist()
    k_stored = defaultdict(int)
    for r in table:
        k_stored[(r["step"], r["prompt_id"])] += r["reward"] > 0.5
    own = TrajectoryStore(run_dir / "trajectories").read(models=["A"]).to_pylist()
    k_own = defaultdict(int)
    for r in own:
        k_own[(r["step"], r["prompt_id"])] += r["reward"] > 0.5

    assert len(audit) == cfg.steps and all(a["source"] == "B" and a["receiver"] == "A" for a in audit)
    total = 0
    for a in audit:
        step = a["step"]
        prompts = {pid for (s, pid) in k_own if s == step}
        # what the store implies: A all-fail and B's latest stored group (same step here) has 1 <= k < n
        implied = sorted(p for p in prompts if k_own[(step, p)] == 0 and 1 <= k_stored[(step, p)] < cfg.rollout.n)
        assert sorted(c["prompt_id"] for c in a["candidates"]) == implied
        assert sorted(a["selected"]) == implied      # no cap, no balancing: every candidate
        for c in a["candidates"]:
            assert c["k_source"] == k_stored[(step, c["prompt_id"])]
        assert {r["prompt_id"] for r in a["responses"]} == set(implied)
        assert all(r["admitted"] for r in a["responses"])    # delta = 0 admits every s > 0
        total += len(a["responses"])
        row = next(r for r in rows if r["step"] == step)
        assert row["A/peer_responses"] == len(a["responses"])
    assert total > 0


def test_stored_peer_cap_limits_replacements(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    peer_cfg = tiny_config(tmp_path / "peer", tiny_llama_dir, tiny_gemma_dir, "exchange.mode=grpo", "steps=1", models=("B",))
    loop.train(peer_cfg)
    cfg = tiny_config(tmp_path / "recv", tiny_llama_dir, tiny_gemma_dir, "steps=1", "peer.source=store",
                      f"peer.store_path={Path(peer_cfg.run_dir) / 'trajectories'}", "peer.max_replacements=1",
                      "update.num_minibatches=1", models=("A",))
    loop.train(cfg)
    audit = [json.loads(l) for l in (Path(cfg.run_dir) / "audit.jsonl").read_text().splitlines()]
    # step 1 sees prompts 0..3; B's stored groups: prompt 1 has k = 1, prompt 3 has k = 1 + 1 = 2.
    # Both are candidates; the cap of 1 keeps the one with more successes.
    assert sorted(c["prompt_id"] for c in audit[0]["candidates"]) == ["arith-00001", "arith-00003"]
    assert audit[0]["selected"] == ["arith-00003"]

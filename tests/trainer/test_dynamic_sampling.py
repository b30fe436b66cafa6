"""Dynamic sampling end to end on the tiny pair (real tokenizers, crafted rewards): off, the step is the step of
before; on, zero-variance groups make further rounds, the kept groups all carry gradient, the metrics and the audit
say so, and a resumed run equals an uninterrupted one."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from graft.storage.trajectory_store import TrajectoryStore
from graft.trainer import loop
from tests.trainer.helpers import grade_by, params, tiny_config


def solvers(p: int) -> dict[str, int]:
    """Successes (of n = 4) per model on prompt p (16 prompts, in order, 4 a round): p % 4 == 0 both solve some
    (A 1 + (p // 4) % 3 of them, so the rounds differ), 1 both solve all, 2 only B solves one (A's all-fail group
    is replaced by B's: with exchange.balance=none and delta 0 every B->A candidate goes through), 3 none solves."""
    return [{"A": 1 + (p // 4) % 3, "B": 2}, {"A": 4, "B": 4}, {"B": 1}, {}][p % 4]


ON = ("rollout.dynamic_sampling=true", "rollout.max_rounds=3", "exchange.balance=none", "exchange.delta=0")


def _rows(cfg) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]


def _audit(cfg) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg.run_dir) / "audit.jsonl").read_text().splitlines()]


def _final_params(cfg) -> dict:
    from graft.storage.checkpoint import latest_checkpoint, load_checkpoint
    from graft.trainer.learner import Learner
    ck = load_checkpoint(latest_checkpoint(cfg.run_dir))
    return params({m.name: Learner.local(m, weights_from=ck.model_dirs[m.name]) for m in cfg.models})


def _trained(monkeypatch) -> list[dict]:
    """Every step's training groups, as the update gets them."""
    seen: list[dict] = []
    update = loop.update_phase

    def spy(run, train_groups, step):
        seen.append({n: list(gs) for n, gs in train_groups.items()})
        return update(run, train_groups, step)

    monkeypatch.setattr(loop, "update_phase", spy)
    return seen


def test_zero_variance_groups_make_more_rounds_and_the_kept_ones_carry_gradient(tmp_path, tiny_llama_dir, tiny_gemma_dir,
                                                                                 monkeypatch):
    monkeypatch.setattr(loop, "grade", grade_by(solvers))
    seen = _trained(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *ON)
    loop.train(cfg)
    rows = _rows(cfg)
    # each round of 4 prompts: p % 4 == 0 carries for both (own), 2 for both (B own, A B's group); 1 and 3 nothing.
    # 2 kept a round: full (4) after 2 rounds, 8 sampled, kept_frac 1/2; step 1 = prompts 0-7, step 2 = 8-15
    for r in rows:
        for m in "AB":
            assert (r[f"{m}/dynamic/rounds"], r[f"{m}/dynamic/sampled"], r[f"{m}/dynamic/kept"]) == (2, 8, 4)
            assert r[f"{m}/dynamic/kept_frac"] == 0.5 and r[f"{m}/dynamic/tokens_generated"] > r[f"{m}/tokens/generated"]
        assert r["time/dynamic_s"] > 0
    for step, groups in enumerate(seen):
        base = 8 * step
        ids = {m: [(int(g.prompt_id.split("-")[-1]), g.source) for g in gs] for m, gs in groups.items()}
        assert ids["A"] == [(base, "A"), (base + 2, "B"), (base + 4, "A"), (base + 6, "B")]
        assert sorted(ids["B"]) == [(base, "B"), (base + 2, "B"), (base + 4, "B"), (base + 6, "B")]
        for gs in groups.values():   # every kept group carries gradient
            assert all(any(a != 0 and w != 0 for a, w in zip(g.advantages, g.weights)) for g in gs)
    # rewards stay round 0's: step 1, A: (1 + 4 + 0 + 0) / 16; step 2 (prompts 8-11, p // 4 = 2): (3 + 4) / 16
    assert [r["A/reward/mean"] for r in rows] == [5 / 16, 7 / 16]
    # the exchange of both rounds: B->A candidates 2 and 6 (step 1), all 8 responses admitted (delta 0)
    audit = [a for a in _audit(cfg) if (a["source"], a["receiver"]) == ("B", "A")]
    assert [a["rounds"] for a in audit] == [2, 2]
    assert [[int(p.split("-")[-1]) for p in a["selected"]] for a in audit] == [[2, 6], [10, 14]]
    assert [r["exchange/B->A/admitted"] for r in rows] == [8, 8] and [r["exchange/B->A/kept_prompts"] for r in rows] == [2, 2]
    # the trajectory store holds every round's groups
    stored = TrajectoryStore(Path(cfg.run_dir) / "trajectories").read(models=["A"], columns=["step", "prompt_id"])
    got = set(zip(stored["step"].to_pylist(), stored["prompt_id"].to_pylist()))
    assert got == {(1 + i // 8, pid) for i, pid in enumerate(stored_ids(cfg))}   # 8 prompts (2 rounds) a step


def stored_ids(cfg) -> list[str]:
    """The 16 prompt ids, in order (data.shuffle=false)."""
    from graft.domains.grading import load_data
    return [p.id for p in load_data(cfg.data.train, cfg, None)[0]]


def test_off_and_on_with_nothing_to_drop_train_alike(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    # every prompt mixed for both models: round 0 fills every batch, nothing is dropped or drawn again
    monkeypatch.setattr(loop, "grade", grade_by(lambda p: {"A": 1 + p % 3, "B": 2}))
    out = {}
    for name, extra in (("off", ()), ("on", ON)):
        cfg = tiny_config(tmp_path / name, tiny_llama_dir, tiny_gemma_dir, "exchange.balance=none", "exchange.delta=0", *extra)
        run = loop.setup(cfg)
        try:
            rows = [loop.train_step(run, step) for step in (1, 2)]
            out[name] = (params(run), rows, run.sampler.state_dict())
        finally:
            loop.close_run(run)
    (p_off, rows_off, s_off), (p_on, rows_on, s_on) = out["off"], out["on"]
    for k in p_off:
        assert torch.equal(p_off[k], p_on[k]), k
    assert s_off == s_on
    for a, b in zip(rows_off, rows_on):
        assert not any(k.startswith("A/dynamic/") or k == "time/dynamic_s" for k in a)
        assert b["A/dynamic/rounds"] == 1 and b["A/dynamic/kept_frac"] == 1.0
        same = [k for k in a if not k.startswith(("time/", "mem/")) and "tokens_per_s" not in k]
        assert json.dumps({k: a[k] for k in same}) == json.dumps({k: b[k] for k in same})


def test_no_group_kept_is_a_step_without_update(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    monkeypatch.setattr(loop, "grade", grade_by(lambda p: {}))   # every group all-fail: nothing to learn from
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *ON, "rollout.max_rounds=2", "steps=1")
    run = loop.setup(cfg)
    try:
        before = params(run)
        m = loop.train_step(run, 1)
        after = params(run)
    finally:
        loop.close_run(run)
    for k in before:
        assert torch.equal(before[k], after[k]), k
    for name in "AB":
        assert (m[f"{name}/dynamic/rounds"], m[f"{name}/dynamic/sampled"], m[f"{name}/dynamic/kept"]) == (2, 8, 0)
        assert m[f"{name}/update/skipped_empty"] == 1 and f"{name}/loss" not in m


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    monkeypatch.setattr(loop, "grade", grade_by(solvers))
    full = tiny_config(tmp_path / "full", tiny_llama_dir, tiny_gemma_dir, *ON, "steps=3")
    loop.train(full)
    part = tiny_config(tmp_path / "part", tiny_llama_dir, tiny_gemma_dir, *ON, "steps=2", "checkpoint.save_every=1")
    loop.train(part)
    loop.train(tiny_config(tmp_path / "part", tiny_llama_dir, tiny_gemma_dir, *ON, "steps=3", "checkpoint.save_every=1",
                           "resume=true"))
    a, b = _rows(full), _rows(part)
    # step 3 starts a second epoch (16 prompts, 8 drawn a step): the resumed sampler must continue after both rounds
    keys = [k for k in a[0] if "/dynamic/" in k and "tokens" not in k or k.endswith("/reward/mean") or k == "epoch"]
    assert [[r[k] for k in keys] for r in b] == [[r[k] for k in keys] for r in a]
    assert [x["epoch"] for x in a] == [0, 0, 1]
    assert [(x["step"], x["selected"]) for x in _audit(part)] == [(x["step"], x["selected"]) for x in _audit(full)]
    pa, pb = _final_params(full), _final_params(part)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=0, atol=1e-6)


def test_with_hacpo_a_prompt_is_kept_with_both_its_groups(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    # HACPO trains each model on its own group and the peer's of every prompt: the unit kept is the prompt
    monkeypatch.setattr(loop, "grade", grade_by(solvers))
    seen = _trained(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "rollout.dynamic_sampling=true", "exchange.kind=hacpo",
                      "update.rule=hacpo", "steps=1")
    loop.train(cfg)
    (row,) = _rows(cfg)
    for name, gs in seen[0].items():
        by_prompt: dict[str, list] = {}
        for g in gs:
            by_prompt.setdefault(g.prompt_id, []).append(g)
        assert len(by_prompt) == row[f"{name}/dynamic/kept"] <= 4
        assert all(sorted(g.source for g in pg) == ["A", "B"] for pg in by_prompt.values())   # own and peer
        assert all(any(a != 0 for g in pg for a in g.advantages) for pg in by_prompt.values())
    rounds = max(row["A/dynamic/rounds"], row["B/dynamic/rounds"])
    assert all(a.get("rounds", 1) == rounds for a in _audit(cfg))

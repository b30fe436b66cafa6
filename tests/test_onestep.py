"""graft onestep: one update with vs without the admitted peer groups (issue 20 §4)."""
from __future__ import annotations

import json

import pytest
import torch

from graft.onestep import paired_summary, summarize_rows


def test_paired_summary_hand_worked():
    # prompts 0.5 and 0.0 in state (1, 1), 0.25 in state (2, 1): mean (0.5 + 0 + 0.25) / 3 = 0.25
    s = paired_summary([((1, 1), 0.5), ((1, 1), 0.0), ((2, 1), 0.25)])
    assert s["mean"] == pytest.approx(0.25) and s["prompts"] == 3 and s["states"] == 2
    lo, hi = s["ci95"]
    assert 0.0 <= lo <= 0.25 <= hi <= 0.5            # every resample mean lies within the data's range
    assert paired_summary([]) == {"mean": None, "ci95": [None, None], "prompts": 0, "states": 0}
    same = paired_summary([((1, s), 0.1) for s in range(5)])
    assert same["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]    # no spread, no interval


def test_summarize_rows_counts_the_treatment():
    row = lambda kind, g, a, adm: {"seed": 1, "step": 1, "direction": "A->B", "kind": kind,   # noqa: E731
                                   "success": {"grpo": 0.0, "graft": g, "all": a},
                                   "admitted": {"graft": adm, "all": 8}, "admitted_correct": {"graft": 2, "all": 3}}
    s = summarize_rows([row("replaced", 0.25, 0.0, 4), row("unseen", 0.0, 0.0, 4)])
    assert s["graft_minus_grpo"]["A->B"]["replaced"]["mean"] == 0.25
    assert s["all_minus_grpo"]["A->B"]["unseen"]["mean"] == 0.0
    t = s["treatment"]["A->B"]
    assert t["selected_prompts"] == 1 and t["admitted/graft"] == 4 and t["admitted_correct/all"] == 3   # replaced rows only


def test_onestep_end_to_end_on_tiny_models(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """Crafted rewards make both directions exchange; the three arms' updates differ exactly where the
    peer groups do, and the trajectory continues on GRPO."""
    from graft.onestep import onestep_main
    from tests.trainer.helpers import crafted_rewards

    crafted_rewards(monkeypatch)
    model_yaml = (f"[{{name: A, path: '{tiny_llama_dir}', template: plain, lr: 1.0e-3}}, "
                  f"{{name: B, path: '{tiny_gemma_dir}', template: plain, lr: 1.0e-3}}]")
    args = ["--at", "1", "2", "--samples", "2", "--unseen", "1", "--seeds", "3", "--out", str(tmp_path / "o"),
            f"models={model_yaml}", "batch_prompts=4", "progress=false", "data.arithmetic.num_prompts=16",
            "data.arithmetic.families=[add,mul]", "rollout.n=4", "rollout.max_new_tokens=6", "rollout.batch_size=16",
            "reward.workers=0", "data.shuffle=false", "update.num_minibatches=2", "update.micro_batch_size=8",
            "exchange.delta=0.0"]
    assert onestep_main(["configs/default.yaml", *args]) == 0
    rows = [json.loads(x) for x in (tmp_path / "o" / "rows.jsonl").read_text().splitlines()]
    assert {r["direction"] for r in rows} == {"A->B", "B->A"}
    assert {r["step"] for r in rows} == {1, 2}
    replaced = [r for r in rows if r["kind"] == "replaced"]
    assert replaced and all(r["admitted"]["all"] >= r["admitted"]["graft"] for r in replaced)
    assert all(r["family"] in ("add", "mul") for r in rows)
    unseen = [r for r in rows if r["kind"] == "unseen"]
    assert unseen and all(r["prompt_id"].startswith("unseen-") for r in unseen)
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert set(summary["graft_minus_grpo"]) == {"A->B", "B->A"}
    assert json.loads((tmp_path / "o" / "measured.json").read_text()) == {"3": [1, 2]}
    assert summary["states"] == {"measured": 2, "with_exchange": len({r["step"] for r in rows})}
    metrics = [json.loads(x) for x in (tmp_path / "o" / "seed3" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # run again: the finished seed is skipped, the rows stay
    assert onestep_main(["configs/default.yaml", *args]) == 0
    assert len((tmp_path / "o" / "rows.jsonl").read_text().splitlines()) == len(rows)


def test_from_a_finished_grpo_run_equals_training_the_trajectory(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """Invariant: measuring along a finished GRPO run's checkpoints (``--from``) gives exactly the rows of
    training the same trajectory inside onestep (resume equals uninterrupted); a missing checkpoint, an
    exchanging run and a positional config with --from are refused in one line."""
    from graft.cli import main
    from graft.config import ConfigError
    from graft.onestep import onestep_main
    from tests.trainer.helpers import crafted_rewards

    crafted_rewards(monkeypatch)
    model_yaml = (f"[{{name: A, path: '{tiny_llama_dir}', template: plain, lr: 1.0e-3}}, "
                  f"{{name: B, path: '{tiny_gemma_dir}', template: plain, lr: 1.0e-3}}]")
    regime = [f"models={model_yaml}", "batch_prompts=4", "progress=false", "data.arithmetic.num_prompts=16",
              "data.arithmetic.families=[add,mul]", "rollout.n=4", "rollout.max_new_tokens=6", "rollout.batch_size=16",
              "reward.workers=0", "data.shuffle=false", "update.num_minibatches=2", "update.micro_batch_size=8",
              "exchange.delta=0.0"]
    measure = ["--at", "1", "3", "--samples", "2", "--unseen", "1"]
    assert onestep_main(["configs/default.yaml", *regime, *measure, "--seeds", "3", "--out", str(tmp_path / "replay")]) == 0
    run = tmp_path / "grpo"
    assert main(["train", "configs/default.yaml", *regime, "exchange.mode=grpo", "seed=3", "steps=3", f"run_dir={run}",
                 "checkpoint.save_every=1", "checkpoint.keep_last=5"]) == 0
    # measured in two commands, the later step first (resumable state by state): the same rows
    assert onestep_main(["--from", str(run), "--at", "3", *measure[3:], "--out", str(tmp_path / "from")]) == 0
    assert json.loads((tmp_path / "from" / "measured.json").read_text()) == {"3": [3]}
    assert onestep_main(["--from", str(run), *measure, "--out", str(tmp_path / "from")]) == 0
    read = lambda d: [json.loads(x) for x in (tmp_path / d / "rows.jsonl").read_text().splitlines()]  # noqa: E731
    assert read("from") == read("replay") and read("from")
    assert json.loads((tmp_path / "from" / "measured.json").read_text()) == {"3": [1, 3]}
    commands = json.loads((tmp_path / "from" / "summary.json").read_text())["commands"]
    assert [c[4:6] for c in commands] == [["--at", "3"], ["--at", "1"]]      # both measuring commands recorded
    assert not (tmp_path / "from" / "seed3" / "from-step3").exists()          # the scratch folder went
    assert (run / "checkpoints" / "step_000002").is_dir()                    # the run's own checkpoint stayed
    with pytest.raises(ConfigError, match=r"step\(s\) \[5\] needs its checkpoint\(s\) of step\(s\) \[4\]"):
        onestep_main(["--from", str(run), "--at", "5", "--out", str(tmp_path / "x")])
    graft_run = tmp_path / "graft"
    (graft_run).mkdir()
    (graft_run / "config.yaml").write_text((run / "config.yaml").read_text().replace("mode: grpo", "mode: graft"))
    with pytest.raises(ConfigError, match="the run exchanged"):
        onestep_main(["--from", str(graft_run), "--at", "1", "--out", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match="is not a key=value override"):
        onestep_main(["configs/default.yaml", "--from", str(run), "--at", "1", "--out", str(tmp_path / "x")])


def test_snapshot_restore_round_trip_keeps_tied_weights_shared(tiny_gemma_dir):
    """After an optimizer step and a restore, weights and AdamW moments equal the snapshot's exactly; the
    tied embedding is cloned once (one tensor under both keys) and stays tied in the model."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from graft.onestep import _restore, _snapshot
    from graft.trainer.workers import copy_optimizer_state

    model = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.tensor([[1, 2, 3, 4]])

    def step():
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    step()   # moments exist
    calls = []
    learner = SimpleNamespace(policy=SimpleNamespace(model=model), workers=SimpleNamespace(call=lambda *a: calls.append(a)),
                              optimizer=SimpleNamespace(state_dict=opt.state_dict,
                                                        restore=lambda st: copy_optimizer_state(opt, st)))
    snap = _snapshot(learner)
    tied = [k for k, v in snap["weights"].items() if v is snap["weights"]["model.embed_tokens.weight"]]
    assert len(tied) == 2, tied                                   # embed_tokens and lm_head: one clone
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {i: {k: v.clone() for k, v in st.items()} for i, st in opt.state_dict()["state"].items()}
    step()
    after = {k: v.clone() for k, v in model.state_dict().items()}
    assert not torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    live = {i: dict(st) for i, st in opt.state_dict()["state"].items()}
    _restore(learner, snap)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, moments[i][k]) for i, st in opt.state_dict()["state"].items() for k, v in st.items())
    assert all(v is live[i][k] for i, st in opt.state_dict()["state"].items() for k, v in st.items())   # in place
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert calls   # the workers are told the weights changed
    step()         # the same step again gives the same weights, bit for bit
    assert all(torch.equal(v, after[k]) for k, v in model.state_dict().items())


def test_restore_to_before_the_first_update_drops_the_moments(tiny_gemma_dir):
    """A snapshot of a fresh AdamW (step 1 of a run: no moments yet) restored after an update leaves no
    moments, and the next update equals the first one exactly."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from graft.onestep import _restore, _snapshot
    from graft.trainer.workers import copy_optimizer_state

    model = AutoModelForCausalLM.from_pretrained(tiny_gemma_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.tensor([[1, 2, 3, 4]])

    def step():
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    learner = SimpleNamespace(policy=SimpleNamespace(model=model), workers=SimpleNamespace(call=lambda *a: None),
                              optimizer=SimpleNamespace(state_dict=opt.state_dict,
                                                        restore=lambda st: copy_optimizer_state(opt, st)))
    snap = _snapshot(learner)
    step()
    first = {k: v.clone() for k, v in model.state_dict().items()}
    _restore(learner, snap)
    assert not opt.state_dict()["state"]
    step()
    assert all(torch.equal(v, first[k]) for k, v in model.state_dict().items())


def test_restore_through_the_learners_workers_is_exact(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """The path `graft onestep` takes (learner -> workers -> optimizer): after an update from a snapshot,
    `_restore` gives back the snapshot's weights and moments, and the same update again gives the same
    weights bit for bit."""
    import copy

    from graft.onestep import _restore, _snapshot
    from graft.trainer import loop
    from tests.trainer.helpers import crafted_rewards, tiny_config

    crafted_rewards(monkeypatch)
    run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2"))
    try:
        for step in (1, 2):
            prompts, _ = run.sampler.next_batch()
            groups, _ = loop.rollout_phase(run, prompts, step)
            loop.score_phase(run, groups)
            if step == 1:
                loop.update_phase(run, groups, step)     # moments exist
        learner = run.learners["B"]
        snap = _snapshot(learner)
        moments = copy.deepcopy(learner.optimizer.state_dict())
        loop.update_model(run, "B", groups["B"], 2)
        after = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
        assert not all(torch.equal(v, snap["weights"][k]) for k, v in after.items())
        _restore(learner, snap)
        assert all(torch.equal(v, snap["weights"][k]) for k, v in learner.policy.model.state_dict().items())
        now = learner.optimizer.state_dict()["state"]
        assert all(torch.equal(v, moments["state"][i][k]) for i, st in now.items() for k, v in st.items()
                   if torch.is_tensor(v))
        loop.update_model(run, "B", groups["B"], 2)
        assert all(torch.equal(v, after[k]) for k, v in learner.policy.model.state_dict().items())
    finally:
        loop.close_run(run)

"""graft onestep: one update with vs without the admitted peer groups (issue 20 §4; the arms, issue 42)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graft.commands.onestep import paired_summary, summarize_rows

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "study" / "onestep"


def test_paired_summary_hand_worked():
    # prompts 0.5 and 0.0 in state (1, 1), 0.25 in state (2, 1): mean (0.5 + 0 + 0.25) / 3 = 0.25
    s = paired_summary([((1, 1), 0.5), ((1, 1), 0.0), ((2, 1), 0.25)])
    assert s["mean"] == pytest.approx(0.25) and s["prompts"] == 3 and s["states"] == 2
    lo, hi = s["ci95"]
    assert 0.0 <= lo <= 0.25 <= hi <= 0.5            # every resample mean lies within the data's range
    assert s["differed"] == 2                          # 0.5 and 0.25 moved, 0.0 did not
    assert paired_summary([])["mean"] is None and paired_summary([])["prompts"] == 0
    same = paired_summary([((1, s), 0.1) for s in range(5)])
    assert same["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]    # no spread, no interval
    assert same["t95"]["ci95"] == [pytest.approx(0.1), pytest.approx(0.1)]


def test_state_t_interval_hand_worked():
    """Student t over state means, df = states - 1 (arithmetic in the comments)."""
    from graft.commands.onestep import state_t_interval

    # state means: (1, 1): (0.5 + 0.0) / 2 = 0.25; (2, 1): 0.25; (3, 1): -0.125 -> mean 0.375 / 3 = 0.125
    # deviations 0.125, 0.125, -0.25 -> sum of squares 0.015625 + 0.015625 + 0.0625 = 0.09375; / (3 - 1) = 0.046875
    # sd = sqrt(0.046875) = 0.2165064; se = sd / sqrt(3) = 0.125; t(0.975, df 2) = 4.3027 -> half-width 0.5378375
    t = state_t_interval([((1, 1), 0.5), ((1, 1), 0.0), ((2, 1), 0.25), ((3, 1), -0.125)])
    assert t["mean"] == pytest.approx(0.125) and t["states"] == 3
    assert t["sd"] == pytest.approx(0.2165064, abs=1e-7)
    assert t["ci95"] == [pytest.approx(0.125 - 0.5378375), pytest.approx(0.125 + 0.5378375)]
    # the prompt-weighted mean of the same diffs is (0.5 + 0 + 0.25 - 0.125) / 4 = 0.15625: a different estimand
    s = paired_summary([((1, 1), 0.5), ((1, 1), 0.0), ((2, 1), 0.25), ((3, 1), -0.125)])
    assert s["mean"] == pytest.approx(0.15625) and s["t95"] == t
    assert state_t_interval([((1, 1), 0.5), ((1, 1), 0.0)])["ci95"] == [None, None]    # one state: no interval


def test_summary_counts_the_prompts_that_changed_per_state_and_says_which_interval_it_reads():
    row = lambda step, kind, g, a: {"seed": 1, "step": step, "direction": "A->B", "kind": kind,   # noqa: E731
                                    "success": {"grpo": 0.25, "graft": g, "all": a},
                                    "admitted": {"graft": 1, "all": 2}, "admitted_correct": {"graft": 1, "all": 1}}
    rows = [row(1, "replaced", 0.5, 0.25), row(1, "unseen", 0.25, 0.0), row(1, "unseen", 0.25, 0.25),
            row(7, "replaced", 0.25, 0.25), row(7, "unseen", 0.0, 0.0)]
    s = summarize_rows(rows)
    assert s["differed"]["A->B"] == [
        {"seed": 1, "step": 1, "replaced": {"prompts": 1, "graft": 1, "all": 0}, "unseen": {"prompts": 2, "graft": 0, "all": 1}},
        {"seed": 1, "step": 7, "replaced": {"prompts": 1, "graft": 0, "all": 0}, "unseen": {"prompts": 1, "graft": 1, "all": 1}}]
    assert s["graft_minus_grpo"]["A->B"]["unseen"]["differed"] == 1 and s["all_minus_grpo"]["A->B"]["unseen"]["differed"] == 2
    assert s["verdict_interval"]["uses"] == "t95" and "Student-t" in s["verdict_interval"]["why"]


def test_fewer_than_16_samples_and_arms_that_would_differ_in_more_than_the_peer_groups_are_refused_in_one_line():
    from graft.commands.onestep import _check_pair_task, _parse
    from graft.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^--samples 8: .* >= 16 times per arm$"):
        _parse(["configs/default.yaml", "--at", "1", "--samples", "8", "--out", "x"])
    assert _parse(["configs/default.yaml", "--at", "1", "--out", "x"]).samples == 16
    _check_pair_task(load_config("configs/default.yaml", []))
    with pytest.raises(ConfigError, match=r"a KL penalty \(kl_coef > 0: gemma3\) does not allow$"):
        _check_pair_task(load_config("configs/default.yaml", ["models.1.kl_coef=0.01"]))
    with pytest.raises(ConfigError, match=r"exchange.pooled_rewards .* does not allow$"):
        _check_pair_task(load_config("configs/default.yaml", ["exchange.pooled_rewards=true"]))


def test_commands_log_every_invocation_that_recorded_a_state_and_carries_over_an_old_summary(tmp_path):
    """An invocation is listed with its states as it records them (an interrupted one too); a folder from before
    the log keeps its summary's commands, states unknown."""
    from graft.commands.onestep import log_command, read_commands

    (tmp_path / "summary.json").write_text(json.dumps({"commands": [["graft", "onestep", "old"]]}))
    assert read_commands(tmp_path) == [{"invocation": "before-log-0", "command": ["graft", "onestep", "old"], "states": None}]
    log_command(tmp_path, "i1", ["graft", "onestep", "a"], 4, 7)           # then killed
    log_command(tmp_path, "i2", ["graft", "onestep", "a"], 4, 13)          # the same command, resumed
    log_command(tmp_path, "i2", ["graft", "onestep", "a"], 5, 7)
    assert read_commands(tmp_path) == [
        {"invocation": "before-log-0", "command": ["graft", "onestep", "old"], "states": None},
        {"invocation": "i1", "command": ["graft", "onestep", "a"], "states": [[4, 7]]},
        {"invocation": "i2", "command": ["graft", "onestep", "a"], "states": [[4, 13], [5, 7]]}]


def test_a_commands_line_torn_by_a_kill_is_skipped_and_the_next_record_stays_readable(tmp_path):
    """A kill mid-append leaves half a line without its newline: reading skips it (no traceback), and the next
    invocation's record starts on a line of its own instead of being glued to the torn one."""
    from graft.commands.onestep import log_command, read_commands

    log_command(tmp_path, "i1", ["graft", "onestep", "a"], 4, 7)
    with (tmp_path / "commands.jsonl").open("a") as f:
        f.write('{"invocation": "i1", "command": ["graft", "on')                     # torn: killed mid-write
    assert read_commands(tmp_path) == [{"invocation": "i1", "command": ["graft", "onestep", "a"], "states": [[4, 7]]}]
    log_command(tmp_path, "i2", ["graft", "onestep", "a"], 4, 13)
    assert read_commands(tmp_path)[-1] == {"invocation": "i2", "command": ["graft", "onestep", "a"], "states": [[4, 13]]}


def test_states_are_not_added_to_a_folder_measured_with_other_arms(tmp_path):
    from graft.commands.onestep import ARMS_VERSION, _check_arms_version
    from graft.config import ConfigError

    (tmp_path / "rows.jsonl").write_text(json.dumps({"seed": 1, "step": 1}) + "\n")        # before issue 42: no version
    _check_arms_version(tmp_path, measuring=False)                                      # re-summarising is fine
    with pytest.raises(ConfigError, match=r"arms version \[1\] .* measure into a new folder$"):
        _check_arms_version(tmp_path, measuring=True)
    (tmp_path / "rows.jsonl").write_text(json.dumps({"seed": 1, "step": 1, "arms_version": ARMS_VERSION}) + "\n")
    _check_arms_version(tmp_path, measuring=True)


def test_the_committed_measurement_still_re_reads():
    """results/study/onestep (measured before issue 42's arms): its rows re-summarise to the committed bootstrap
    figures, its commands load, and the plan summary reads both the old and the new summary."""
    from graft.commands.experiment.summary import one_step_effect
    from graft.commands.onestep import read_commands

    if not (COMMITTED / "rows.jsonl").exists():
        pytest.skip("no committed onestep measurement")
    old = json.loads((COMMITTED / "summary.json").read_text())
    rows = [json.loads(x) for x in (COMMITTED / "rows.jsonl").read_text().splitlines() if x.strip()]
    new = summarize_rows(rows)
    for table in ("graft_minus_grpo", "all_minus_grpo"):
        for d, kinds in old[table].items():
            for kind, s in kinds.items():
                assert {k: new[table][d][kind][k] for k in s} == s, (table, d, kind)
                assert new[table][d][kind]["t95"]["states"] == s["states"]
    assert new["treatment"] == old["treatment"]
    assert new["arms_version"] == [1]                  # measured with the spec's spliced batch (before issue 42)
    assert [e["command"] for e in read_commands(COMMITTED)] == old["commands"]
    before, after = one_step_effect(old)["one_step_effect"], one_step_effect({**old, **new})["one_step_effect"]
    for d, kinds in before.items():              # the same figures, plus the t-interval and the changed prompts
        for kind, s in kinds.items():
            assert {k: after[d][kind][k] for k in s} == s and set(after[d][kind]) - set(s) == {"t95", "differed"}


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
    peer groups do, and the trajectory continues on GRPO. An invocation stopped after recording a state and
    the one that resumes it are both in the summary's commands, each with the states it recorded."""
    import graft.commands.onestep
    from graft.commands.onestep import onestep_main
    from tests.trainer.helpers import crafted_rewards

    crafted_rewards(monkeypatch)
    monkeypatch.setattr(graft.commands.onestep, "MIN_SAMPLES", 2)   # speed: the refusal below 16 is tested on its own
    model_yaml = (f"[{{name: A, path: '{tiny_llama_dir}', template: plain, lr: 1.0e-3}}, "
                  f"{{name: B, path: '{tiny_gemma_dir}', template: plain, lr: 1.0e-3}}]")
    args = ["--at", "1", "2", "--samples", "2", "--unseen", "1", "--seeds", "3", "--out", str(tmp_path / "o"),
            f"models={model_yaml}", "batch_prompts=4", "progress=false", "data.arithmetic.num_prompts=16",
            "data.arithmetic.families=[add,mul]", "rollout.n=4", "rollout.max_new_tokens=6", "rollout.batch_size=16",
            "reward.workers=0", "data.shuffle=false", "update.num_minibatches=2", "update.micro_batch_size=8",
            "exchange.delta=0.0"]
    measure = graft.commands.onestep.measure_state

    def stopped_at_step_2(run, groups, step, *a):
        if step == 2:
            raise KeyboardInterrupt
        return measure(run, groups, step, *a)

    monkeypatch.setattr(graft.commands.onestep, "measure_state", stopped_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        onestep_main(["configs/default.yaml", *args])
    assert json.loads((tmp_path / "o" / "measured.json").read_text()) == {"3": [1]}
    monkeypatch.setattr(graft.commands.onestep, "measure_state", measure)
    assert onestep_main(["configs/default.yaml", *args]) == 0     # resumes: step 2 only
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
    command = ["graft", "onestep", "configs/default.yaml", *args]
    assert summary["commands"] == [command, command]
    assert [e["states"] for e in summary["invocations"]] == [[[3, 1]], [[3, 2]]]
    assert summary["verdict_interval"]["uses"] == "t95" and summary["arms_version"] == [2]
    assert all("t95" in s and "differed" in s for kinds in summary["graft_minus_grpo"].values() for s in kinds.values())
    metrics = [json.loads(x) for x in (tmp_path / "o" / "seed3" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # run again: the finished seed is skipped, the rows stay, and an invocation that recorded nothing is not listed
    assert onestep_main(["configs/default.yaml", *args]) == 0
    assert len((tmp_path / "o" / "rows.jsonl").read_text().splitlines()) == len(rows)
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["commands"] == [command, command]


def test_from_a_finished_grpo_run_equals_training_the_trajectory(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """Invariant: measuring along a finished GRPO run's checkpoints (``--from``) gives exactly the rows of
    training the same trajectory inside onestep (resume equals uninterrupted); a missing checkpoint, an
    exchanging run and a positional config with --from are refused in one line."""
    import graft.commands.onestep
    from graft.commands.cli import main
    from graft.commands.onestep import onestep_main
    from graft.config import ConfigError
    from tests.trainer.helpers import crafted_rewards

    crafted_rewards(monkeypatch)
    monkeypatch.setattr(graft.commands.onestep, "MIN_SAMPLES", 2)   # speed: the refusal below 16 is tested on its own
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
    assert not (tmp_path / "from" / "seed3").exists()                         # the scratch folder went, and its empty parent
    assert (run / "checkpoints" / "step_000002").is_dir()                    # the run's own checkpoint stayed
    with pytest.raises(ConfigError, match=r"step\(s\) \[5\] needs its checkpoint\(s\) of step\(s\) \[4\]"):
        onestep_main(["--from", str(run), "--at", "5", "--out", str(tmp_path / "x")])
    graft_run = tmp_path / "graft"
    (graft_run).mkdir()
    grpo_text = (run / "config.yaml").read_text()   # exchange.mode: grpo, or exchange.kind: none since the kinds
    graft_text = grpo_text.replace("mode: grpo", "mode: graft").replace("kind: none", "kind: live")
    assert graft_text != grpo_text
    (graft_run / "config.yaml").write_text(graft_text)
    with pytest.raises(ConfigError, match="the run exchanged"):
        onestep_main(["--from", str(graft_run), "--at", "1", "--out", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match="is not a key=value override"):
        onestep_main(["configs/default.yaml", "--from", str(run), "--at", "1", "--out", str(tmp_path / "x")])


def test_snapshot_restore_round_trip_keeps_tied_weights_shared(tiny_gemma_dir):
    """After an optimizer step and a restore, weights and AdamW moments equal the snapshot's exactly; the
    tied embedding is cloned once (one tensor under both keys) and stays tied in the model."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from graft.commands.onestep import _restore, _snapshot
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

    from graft.commands.onestep import _restore, _snapshot
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

    from graft.commands.onestep import _restore, _snapshot
    from graft.trainer import loop
    from tests.trainer.helpers import crafted_rewards, tiny_config

    crafted_rewards(monkeypatch)
    run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2"))
    try:
        groups = _step_2_with_moments(run)
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


def _step_2_with_moments(run) -> dict:
    """Roll out and score steps 1 and 2 of ``run``, updating after step 1 (so the optimizer has moments); step 2's
    groups, not yet updated on."""
    from graft.trainer import loop

    for step in (1, 2):
        prompts, _ = run.sampler.next_batch()
        groups, _ = loop.rollout_phase(run, prompts, step)
        loop.score_phase(run, groups)
        if step == 1:
            loop.update_phase(run, groups, step)
    return groups


def test_the_arms_differ_by_the_peer_groups_only(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """Issue 42. On a tiny random model at a state with moments: the GRAFT arm's update with its peer groups
    emptied equals the GRPO update bit for bit (the spec's splice, which drops the receiver's all-fail group and
    re-plans the minibatches, does not); with the peer groups it differs. Minibatch by minibatch, the GRAFT arm
    forwards GRPO's rows with GRPO's normalisers and adds the peer rows to the last minibatch (``peer_last``)."""
    import copy

    from graft.commands.onestep import _restore, _snapshot, update_adding_peers
    from graft.exchange.common import adv_norm
    from graft.exchange.handover import Scoring
    from graft.exchange.live import exchange_live
    from graft.seeds import step_seed
    from graft.trainer import loop
    from tests.trainer.helpers import crafted_rewards, tiny_config

    crafted_rewards(monkeypatch)
    run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2", "exchange.delta=0.0"))
    try:
        groups = _step_2_with_moments(run)
        cfg, r = run.cfg, "B"
        ex = exchange_live(2, copy.deepcopy(groups), run.learners, cfg.rollout.n, cfg.exchange, Scoring.of(cfg), run.grade,
                           torch.Generator().manual_seed(step_seed(cfg.seed, 2, "exchange")),
                           adv_norm(cfg.update), threshold=cfg.reward.success_threshold)
        peers = [g for g in ex.train_groups[r] if g.is_peer]
        spliced_own = [g for g in ex.train_groups[r] if not g.is_peer]
        assert peers and len(spliced_own) < len(groups[r])        # the receiver's all-fail groups were replaced
        learner = run.learners[r]
        worker = learner.workers.worker
        shards, train = [], worker.train_minibatch

        def recording(shard, uc, temperature):
            shards.append(shard)
            return train(shard, uc, temperature)

        monkeypatch.setattr(worker, "train_minibatch", recording)
        snap = _snapshot(learner)

        def arm(update) -> tuple[dict, list]:
            _restore(learner, snap)
            shards.clear()
            update()
            return {k: v.detach().clone() for k, v in learner.policy.model.state_dict().items()}, list(shards)

        grpo, grpo_shards = arm(lambda: loop.update_model(run, r, groups[r], 2))
        empty, _ = arm(lambda: update_adding_peers(run, r, groups[r], [], 2))
        assert all(torch.equal(v, grpo[k]) for k, v in empty.items())                     # bit-identical
        spliced, _ = arm(lambda: loop.update_model(run, r, spliced_own, 2))
        assert not all(torch.equal(v, grpo[k]) for k, v in spliced.items())              # what issue 42 found
        graft, graft_shards = arm(lambda: update_adding_peers(run, r, groups[r], peers, 2))
        assert not all(torch.equal(v, grpo[k]) for k, v in graft.items())                # the peer groups' effect

        key = lambda s: (tuple(s.prompt_ids), tuple(s.response_ids), s.advantage, s.is_peer)   # noqa: E731
        assert len(graft_shards) == len(grpo_shards) == cfg.update.num_minibatches
        peer_rows = sum(len(t) for g in peers for t, a in zip(g.token_ids, g.advantages) if a != 0.0)
        for k, (g_sh, o_sh) in enumerate(zip(graft_shards, grpo_shards)):
            assert not any(s.is_peer for s in o_sh.rows)
            own = [s for s in g_sh.rows if not s.is_peer]
            assert [key(s) for s in own] == [key(s) for s in o_sh.rows] == [key(s) for s in g_sh.rows[:len(own)]]
            assert (g_sh.loss_kwargs["num_tokens"], g_sh.loss_kwargs["num_seqs"]) == o_sh.counts[:2]   # GRPO's normalisers
            last = k == len(grpo_shards) - 1
            assert sum(len(s.response_ids) for s in g_sh.rows if s.is_peer) == (peer_rows if last else 0)
    finally:
        loop.close_run(run)


def _record_states(out: str, seed: int, steps: list[int]) -> None:
    from graft.commands.onestep import log_command, out_lock, record_state

    for step in steps:
        with out_lock(Path(out)):
            record_state(Path(out), seed, step, [{"seed": seed, "step": step, "prompt": f"p{seed}-{step}"}])
            log_command(Path(out), f"i{seed}", ["graft", "onestep", str(seed)], seed, step)


def test_commands_recording_into_one_folder_at_the_same_time_keep_every_state(tmp_path):
    """Two commands measuring different states into the same --out at once (one per core): each record is a
    read-modify-write of rows.jsonl / measured.json, which without the lock loses the other's states."""
    import multiprocessing as mp

    from graft.commands.onestep import _read_rows, measured_states, read_commands

    steps = list(range(1, 41))
    procs = [mp.get_context("spawn").Process(target=_record_states, args=(str(tmp_path), seed, steps)) for seed in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0
    assert measured_states(tmp_path) == {1: set(steps), 2: set(steps)}
    assert len(_read_rows(tmp_path / "rows.jsonl")) == 80
    assert sorted(len(e["states"]) for e in read_commands(tmp_path)) == [40, 40]

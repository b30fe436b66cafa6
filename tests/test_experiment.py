"""graft experiment: a plan of arms x seeds runs resumably, evaluates final checkpoints, summarises."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from graft.config import ConfigError
from graft.commands.experiment import load_plan, run_plan, summarize, write_summary

COMPARED = {"title": "GRAFT vs GRPO",
            "comparisons": {"graft_minus_grpo_n8": {"arm": "graft_n8", "baseline": "grpo_n8"}},
            "labels": {"grpo_n8": "GRPO n=8", "graft_n8": "GRAFT n=8"}, "clip_frac_peer": {"peer_last": "graft_n8"}}
"""What the mini reproduction's plans declare for its report."""


def _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared: dict | None = None) -> Path:
    """A two-arm plan on the tiny models (GRPO, GRAFT, stored peers of GRPO), with ``compared`` (default
    :data:`COMPARED`) for its report."""
    compared = COMPARED if compared is None else compared
    base = {
        "run_dir": "unused", "steps": 1, "batch_prompts": 2, "progress": False, "seed": 0,
        "models": [{"name": "A", "path": tiny_llama_dir, "template": "plain", "lr": 1e-3},
                   {"name": "B", "path": tiny_gemma_dir, "template": "plain", "lr": 1e-3}],
        "data": {"train": "arithmetic", "arithmetic": {"num_prompts": 8, "families": ["add", "max"]}},
        "rollout": {"n": 2, "max_new_tokens": 4, "batch_size": 8},
        "reward": {"workers": 0}, "update": {"num_minibatches": 1, "micro_batch_size": 4},
        "checkpoint": {"save_final": True},
    }
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(2)))
    plan = {"name": "tiny", "config": "base.yaml", "runs": str(tmp_path / "runs"), "results": str(tmp_path / "results"),
            "seeds": [1], "arms": {"grpo_n8": ["exchange.kind=none"], "graft_n8": []},
            "stored": {"from": "grpo_n8", "seeds": [1]},
            "eval": {"data": {"test": "test.jsonl"}, "n": 2, "temperature": 0.6, "top_p": 0.95},
            **compared}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    return tmp_path / "plan.yaml"


def test_bad_plans_are_refused(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    raw = yaml.safe_load(path.read_text())
    raw["arms"]["bad"] = ["exchange.mode=GRPO"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError, match="exchange.mode"):
        load_plan(path)
    with pytest.raises(ConfigError, match="not found"):
        load_plan(tmp_path / "missing.yaml")


def test_a_plan_names_a_packaged_preset(tmp_path):
    # no baselines/dapo.yaml beside the plan: the packaged preset (GRPO with dynamic sampling) is the base config
    from graft.config import CONFIGS, load_config
    plan = {"name": "dapo", "config": "baselines/dapo", "runs": str(tmp_path / "runs"), "results": str(tmp_path / "res"),
            "seeds": [1], "arms": {"dapo": [], "grpo": ["rollout.dynamic_sampling=false"]}}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    p = load_plan(tmp_path / "plan.yaml")
    assert p.config == CONFIGS / "baselines" / "dapo.yaml"
    cfgs = {m.arm: load_config(p.config, m.train_overrides()) for m in p.members}
    assert cfgs["dapo"].rollout.dynamic_sampling and cfgs["dapo"].rollout.max_rounds == 3
    assert not cfgs["grpo"].rollout.dynamic_sampling and {c.exchange.kind for c in cfgs.values()} == {"none"}
    # a file of that name beside the plan wins over the preset
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "dapo").write_text("include: default\nexchange: {kind: none}\n")
    assert load_plan(tmp_path / "plan.yaml").config == tmp_path / "baselines" / "dapo"


def test_plan_members_and_stored_arms(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    plan = load_plan(_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir))
    assert [(m.arm, m.seed, m.models) for m in plan.members] == [
        ("grpo_n8", 1, ["A", "B"]), ("graft_n8", 1, ["A", "B"]), ("stored_A", 1, ["A"]), ("stored_B", 1, ["B"])]
    stored_a = plan.members[2].overrides
    assert "exchange.kind=stored" in stored_a and "peer.store_model=B" in stored_a
    assert any(o.startswith("peer.store_path=") and o.endswith("runs/grpo_n8/seed1/trajectories") for o in stored_a)


@pytest.mark.slow
def test_run_is_resumable_and_summarised(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "base": True, "keep_checkpoints": ["grpo_n8/1"]}, sort_keys=False))
    plan = load_plan(path)
    assert run_plan(plan) == []
    for m in plan.members:   # evaluated: only the arm the plan keeps them for still has checkpoints
        assert (m.run_dir / "checkpoints").exists() == (m.arm == "grpo_n8"), m.arm
    for name in ("A", "B"):   # the starting weights, evaluated once in the plan's prompt format
        assert (plan.results / "base" / "eval" / name / "results.json").is_file()
    for m in plan.members:
        assert (m.results_dir / "metrics.jsonl").is_file() and (m.results_dir / "config.yaml").is_file()
        # graft analyze's record, read from the store the results folder does not keep
        a = json.loads((m.results_dir / "analysis.json").read_text())
        assert a["run_dir"] == str(m.run_dir) and a["rewards"] and set(a["rewards"]) <= {"A", "B"}
        assert (m.results_dir / "analyze.txt").read_text().startswith(f"run {m.run_dir}: mode ")
        for name in m.models:
            assert (m.results_dir / "eval" / name / "results.json").is_file()
        assert not list(m.results_dir.rglob("*.safetensors")) and not (m.results_dir / "trajectories").exists()
    # a second pass starts nothing: every run is finished
    import subprocess
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"re-ran {a}"))
    assert run_plan(plan) == []
    # issue 40: a run another process finished between this one's "done?" check and its claim is skipped after
    # the claim (the old code went on into run_member and died with a RuntimeError traceback: no checkpoint left)
    from graft.commands.experiment import run as experiment
    seen = set()

    def stale_once(real):
        def check(m):
            key = (real.__name__, m.arm, m.seed)
            if key in seen:
                return real(m)
            seen.add(key)
            return False   # the first look predates the other process's finish
        return check

    for fn in ("_done", "_recorded"):
        monkeypatch.setattr(experiment, fn, stale_once(getattr(experiment, fn)))
    capsys.readouterr()
    assert run_plan(plan) == []
    skipped = [l for l in capsys.readouterr().err.splitlines() if "another `experiment run` of this plan finished it" in l]
    assert len(skipped) == len(plan.members)
    s = summarize(plan)
    assert s["models"] == ["A", "B"] and s["seeds"] == [1]
    assert set(s["arms"]) == {"grpo_n8", "graft_n8"}
    for arm in s["arms"].values():
        assert all(len(v) == 1 and 0.0 <= v[0] <= 1.0 for v in arm.values())
    assert set(s["exchanged"]["graft_n8"]) == {"A->B", "B->A"} and set(s["stored"]) == {"A", "B"}
    # the promised shape: {"peer_last": x}, one number (None: no step trained on peer data); per model beside it
    assert set(s["clip_frac_peer"]) == {"peer_last"} and not isinstance(s["clip_frac_peer"]["peer_last"], dict)
    assert set(s["clip_frac_peer_by_model"]["peer_last"]) == {"A", "B"}
    for a in ("A", "B"):
        (row,) = s["stored_vs_online"][a]
        assert row["seed"] == 1 and row["stored"] == s["stored"][a][0] and row["graft_n8"] == s["arms"]["graft_n8"][a][0]
        assert row["stored_gain"] == pytest.approx(row["stored"] - row["grpo_n8"])
    for arm in ("grpo_n8", "graft_n8"):   # eval responses kept, so every run is re-graded
        assert all(x is not None and 0.0 <= x <= 1.0 for xs in s["arms_answer_form_number"][arm].values() for x in xs)
    assert all(len(v) == 1 and v[0] is not None for v in s["stored_answer_form_number"].values())
    assert set(s["paired_diff_graft_minus_grpo_n8_number"]) == {"A", "B"}
    assert all(0.0 <= s["base"][a] <= 1.0 and s["base_strict"][a] is not None for a in ("A", "B"))
    assert set(s["admitted_correct"]["graft_n8"]) == {"A->B", "B->A"} and set(s["peer_row_share"]["graft_n8"]) == {"A", "B"}
    path = write_summary(plan)
    assert json.loads(path.read_text())["eval"]["n"] == 2
    report = (plan.results / "REPORT.md").read_text()
    assert "GRAFT vs GRPO" in report and "Stored vs online, A (seed 1)" in report


def test_exchange_totals_and_steps_from_metrics_and_audit(tmp_path):
    """Hand-worked: 6 steps; A->B transferred 8, 8, 0, 16, 0, 8 responses and admitted 3, 0, 0, 2, 0, 0;
    m > 0 in steps 1, 2, 4, 6 -> totals 5 admitted of 40 transferred, 4 steps with a target, 2 with an
    admitted response. The audit log's s of the transferred responses: steps 1-2 (first third) 0.9, 0.7, 0.6
    -> median 0.7; step 6 (last third; step 5 transferred nothing) 0.3, 0.5 -> median 0.4; the one correct
    admitted response (step 1) is admitted_correct. A run without metrics (not finished) gives None."""
    from graft.commands.experiment.summary import Member, _admitted_correct, _exchange_steps, _exchange_total, _treatment
    tr, ad, m = [8, 8, 0, 16, 0, 8], [3, 0, 0, 2, 0, 0], [1, 1, 0, 2, 0, 1]
    rows = [{"step": i + 1, "exchange/A->B/transferred": tr[i], "exchange/A->B/admitted": ad[i],
             "exchange/A->B/m": m[i]} for i in range(6)]
    s = {1: [(0.9, 1.0, True), (0.7, 0.0, True)], 2: [(0.6, 0.0, False)], 6: [(0.3, 0.0, False), (0.5, 1.0, False)]}
    audit = [{"step": st, "source": "A", "receiver": "B", "m": 1, "candidates": [{"prompt_id": "p"}],
              "responses": [{"s": v, "reward_source": r, "admitted": a} for v, r, a in xs]} for st, xs in s.items()]
    done = Member("graft_n8", 1, [], tmp_path / "run", tmp_path / "res", ["A", "B"])
    done.results_dir.mkdir()
    (done.results_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (done.results_dir / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in audit))
    assert _exchange_total(done, "A->B") == 5 and _exchange_total(done, "A->B", "transferred") == 40
    steps = _exchange_steps(done, "A->B", t := _treatment(done, "A->B"))
    assert steps["steps"] == 6 and steps["with_target"] == 4 and steps["with_admitted"] == 2
    assert steps["s_median_first_third"] == pytest.approx(0.7) and steps["s_median_last_third"] == pytest.approx(0.4)
    assert _admitted_correct(done, t) == 1
    pending = Member("graft_n8", 2, [], tmp_path / "run2", tmp_path / "res2", ["A", "B"])
    t = _treatment(pending, "A->B")
    assert _exchange_total(pending, "A->B") is None and _exchange_steps(pending, "A->B", t) is None
    assert _admitted_correct(pending, t) is None


def test_peer_clip_rate_pools_the_steps_with_peer_data(tmp_path):
    """Hand-worked: step 1 — A trained on 2 peer responses, clip low 0.10 + high 0.05 = 0.15; B on none
    (its 0.9 is not counted). Step 2 — A 0.00 + 0.10 = 0.10; B 0.20 + no high logged = 0.20. Pooled over
    the three (step, model) pairs with peer data: (0.15 + 0.10 + 0.20) / 3 = 0.15; A alone 0.125, B 0.20."""
    from graft.commands.experiment.summary import Member, _clip_peer
    rows = [{"step": 1, "A/peer_responses": 2, "A/clip_frac/peer_low": 0.10, "A/clip_frac/peer_high": 0.05,
             "B/peer_responses": 0, "B/clip_frac/peer_low": 0.9, "B/clip_frac/peer_high": 0.0},
            {"step": 2, "A/peer_responses": 1, "A/clip_frac/peer_low": 0.0, "A/clip_frac/peer_high": 0.10,
             "B/peer_responses": 3, "B/clip_frac/peer_low": 0.20}]
    m = Member("graft_n8", 1, [], tmp_path / "run", tmp_path / "res", ["A", "B"])
    m.results_dir.mkdir()
    (m.results_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _clip_peer(m, ["A", "B"]) == pytest.approx(0.15)
    assert _clip_peer(m, ["A"]) == pytest.approx(0.125) and _clip_peer(m, ["B"]) == pytest.approx(0.20)
    assert _clip_peer(m, ["C"]) is None


def test_stored_vs_online_gain_and_ratio():
    """Hand-worked: baseline (GRPO) 0.30, online (GRAFT) 0.40 (online gain 0.10), stored 0.384 (stored gain
    0.084) -> ratio 0.84. A negative online gain leaves the ratio undefined; a missing run leaves everything None."""
    from graft.commands.experiment.summary import stored_vs_online
    r = stored_vs_online(0.384, 0.30, 0.40)
    assert r["stored_gain"] == pytest.approx(0.084) and r["online_gain"] == pytest.approx(0.10)
    assert r["ratio"] == pytest.approx(0.84)
    r = stored_vs_online(0.25, 0.30, 0.28)
    assert r["online_gain"] == pytest.approx(-0.02) and r["stored_gain"] == pytest.approx(-0.05) and r["ratio"] is None
    assert stored_vs_online(None, 0.3, 0.4) == {"stored_gain": None, "online_gain": None, "ratio": None}


def test_regraded_pass1_with_the_strict_rule(tmp_path):
    """Hand-worked: set d1 — "486" answered \\boxed{27*18} (lenient 1, strict 0) and \\boxed{486} (1, 1) -> 0.5;
    "5" answered \\boxed{5} (1, 1) and \\boxed{4} (0, 0) -> 0.5; d1 = 0.5. Set d2 — "13" answered
    \\boxed{117 \\div 9} twice (1, 0) -> 0.0; "48" answered \\boxed{192/4} (1, 0: the question restated as a
    fraction) and \\boxed{48} (1, 1) -> 0.5; "228" of a max question hedged \\boxed{117} or \\boxed{228} (1, 0) and
    \\boxed{228} (1, 1) -> 0.5; d2 = (0 + 0.5 + 0.5) / 3 = 1/3. Macro (0.5 + 1/3) / 2 = 5/12.
    Skill only drops the max prompt (chance 0.5): d2 = (0 + 0.5) / 2 = 0.25, macro (0.5 + 0.25) / 2 = 0.375.
    Counted correct by the run: 9 responses, 3 of them expressions (27*18, 117 div 9 twice) -> 1/3."""
    from graft.commands.experiment.summary import Member, regraded_pass1
    m = Member("grpo_n8", 1, [], tmp_path / "run", tmp_path / "res", ["A"])
    rows = {"d1": [{"id": "d1-mul-00000", "answer": "486", "responses": ["\\boxed{27*18}", "\\boxed{486}"], "rewards": [1.0, 1.0]},
                   {"id": "d1-add-00001", "answer": "5", "responses": ["\\boxed{5}", "\\boxed{4}"], "rewards": [1.0, 0.0]}],
            "d2": [{"id": "d2-div-00000", "answer": "13", "responses": ["\\boxed{117 \\div 9}"] * 2, "rewards": [1.0, 1.0]},
                   {"id": "d2-div-00001", "answer": "48", "responses": ["\\boxed{192/4}", "\\boxed{48}"], "rewards": [1.0, 1.0]},
                   {"id": "d2-max-00002", "answer": "228", "responses": ["\\boxed{117} or \\boxed{228}", "\\boxed{228}"],
                    "rewards": [1.0, 1.0]}]}
    problems = {"d2-max-00002": "Which number is larger: 117 or 228?", "d2-div-00001": "What is 192 divided by 4?"}
    assert regraded_pass1(m, "A") is None                 # responses not kept
    for ds, rs in rows.items():
        (m.results_dir / "eval" / "A" / ds).mkdir(parents=True)
        (m.results_dir / "eval" / "A" / ds / "repeat_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    r = regraded_pass1(m, "A", problems)
    assert r["pass@1"] == pytest.approx(5 / 12) and r["pass@1_skill"] == pytest.approx(0.375)
    assert r["expression_share_of_correct"] == pytest.approx(3 / 9)
    # the run's own grading rewarded 9 answers: one hedge (multi_box, and 117/228 are the question's numbers),
    # the max answer 228 (operand), 192/4 (operator and fraction)
    mon = r["monitor"]["as_run"]
    assert mon["n"] == 9 and mon["multi_box"] == pytest.approx(1 / 9) and mon["operand"] == pytest.approx(2 / 9)
    assert r["monitor"]["strict"]["n"] == 4 and r["monitor"]["strict"]["operand"] == pytest.approx(1 / 4)
    assert r["families"]["max"] == {"pass@1": 0.5, "chance": 0.5, "prompts": 1}
    assert r["families"]["div"]["pass@1"] == pytest.approx(0.25) and r["families"]["div"]["prompts"] == 2


def test_report_of_a_numbers_only_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    """A plan's answer form is recorded (``mixed`` when arms differ); without kept eval responses the
    report has no strict re-grade section."""
    from graft.commands.experiment.report import report_markdown
    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    assert summarize(load_plan(path))["eval"]["answer_form"] == "any"
    raw = yaml.safe_load(path.read_text())
    raw["overrides"] = ["reward.answer_form=number"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    plan = load_plan(path)
    s = summarize(plan)
    assert s["eval"]["answer_form"] == "number" and s["expression_share_of_boxed"]["grpo_n8"] == {"A": [None], "B": [None]}
    md = report_markdown(plan, s, {})
    assert "## Strict re-grade" not in md                            # no eval responses kept: nothing to re-grade
    assert "lowest seed" not in md                                   # no plots, no caption
    assert "one run per arm, its lowest seed" in report_markdown(plan, s, {"rewards": "rewards.png"})
    raw["arms"]["grpo_n8"] = ["exchange.kind=none", "reward.answer_form=any"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert summarize(load_plan(path))["eval"]["answer_form"] == "mixed"


def test_status_of_every_run_and_unknown_only_arms(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    """Each state built by hand: a finished run, one killed after its first step (metrics, no
    checkpoint), one whose small files were committed from another machine, an untouched one."""
    from graft.commands.cli import main
    from graft.commands.experiment.run import check_only, plan_status

    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    plan = load_plan(path)
    grpo, graft, stored_a, _ = plan.members
    grpo.run_dir.mkdir(parents=True)
    (grpo.run_dir / "summary.json").write_text("{}")
    for name in grpo.models:
        (grpo.run_dir / "eval_final" / name).mkdir(parents=True)
        (grpo.run_dir / "eval_final" / name / "results.json").write_text("{}")
    graft.run_dir.mkdir(parents=True)
    (graft.run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    stored_a.results_dir.mkdir(parents=True)
    (stored_a.results_dir / "summary.json").write_text("{}")
    assert plan_status(plan)[2]["state"] == "not started"       # no eval results: not a finished record
    for name in stored_a.models:
        (stored_a.results_dir / "eval" / name).mkdir(parents=True)
        (stored_a.results_dir / "eval" / name / "results.json").write_text("{}")
    assert [r["state"] for r in plan_status(plan)] == [
        "done", "step 1/1 (no checkpoint yet)", "results only", "not started"]
    # run agrees with status: the recorded run is not trained again (nothing here could train it)
    assert run_plan(plan, only=[stored_a.arm]) == []
    assert "its results are recorded in" in capsys.readouterr().err

    assert main(["experiment", "status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "graft_n8/seed1  step 1/1 (no checkpoint yet)" in out and "2 of 4 runs finished" in out
    with pytest.raises(ConfigError, match=r"no arm\(s\) \['grpo_n9'\]"):
        check_only(plan, ["grpo_n8", "grpo_n9"])
    assert main(["experiment", "run", str(path), "--only", "grpo_n9"]) == 2   # one line, nothing run
    assert "--only: the plan has no arm(s) ['grpo_n9']" in capsys.readouterr().err


@pytest.mark.parametrize("plan_path", sorted((Path(__file__).resolve().parents[1] / "configs" / "experiments").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_committed_run_is_what_its_plan_resolves_to_now(plan_path, monkeypatch):
    """A committed run's config.yaml (loaded, so fields added since take their defaults) equals the config its
    plan builds today: a change of configs/default.yaml cannot silently change what a committed result means
    (the plans pin what moved since, e.g. data.arithmetic.max_operand=30). ``resume`` says how a run was
    started, not what it trains."""
    from graft.config import config_diff, load_config, to_dict
    monkeypatch.chdir(plan_path.parents[2])
    plan = load_plan(plan_path)
    committed = [m for m in plan.members if (m.results_dir / "config.yaml").is_file()]
    if not (plan.results / "summary.json").is_file():
        pytest.skip(f"{plan.name}: no run summarised yet")
    assert committed, "the plan's committed runs are missing"
    for m in committed:
        then = to_dict(load_config(m.results_dir / "config.yaml"))
        now = to_dict(load_config(plan.config, m.train_overrides()))
        assert [k for k in config_diff(then, now) if k != "resume"] == [], f"{m.arm}/seed{m.seed}"


def _record(plan, pass1: dict[tuple[str, int], dict[str, float]]) -> None:
    """Commit eval results by hand: (arm, seed) -> model -> macro pass@1 (the one data set ``test`` alike)."""
    for m in plan.members:
        for name, x in pass1.get((m.arm, m.seed), {}).items():
            out = m.results_dir / "eval" / name
            out.mkdir(parents=True)
            (out / "results.json").write_text(json.dumps({"macro": {"pass@1": {"mean": x}},
                                                          "datasets": {"test": {"pass@1": {"mean": x}}}}))


PASS1 = {("grpo_n8", 1): {"A": 0.30, "B": 0.50}, ("grpo_n8", 2): {"A": 0.40, "B": 0.60},
         ("graft_n8", 1): {"A": 0.45, "B": 0.45}, ("graft_n8", 2): {"A": 0.50, "B": 0.60},
         ("graft_n8", 3): {"A": 0.90, "B": 0.90},
         ("stored_A", 1): {"A": 0.42}, ("stored_B", 1): {"B": 0.55}}


def _seeded_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared: dict | None = None) -> Path:
    """The tiny plan with GRPO on seeds 1, 2 and GRAFT on seeds 1, 2, 3 (seed 3 has no baseline)."""
    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared)
    raw = yaml.safe_load(path.read_text())
    raw["arms"] = {"grpo_n8": {"overrides": ["exchange.kind=none"], "seeds": [1, 2]},
                   "graft_n8": {"overrides": [], "seeds": [1, 2, 3]}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_declared_comparison_is_summarised_and_reported(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    """Hand-worked, seed by seed (GRAFT − GRPO): A 0.45 − 0.30 = +15.0 points, 0.50 − 0.40 = +10.0, seed 3
    has no GRPO run: –; B 0.45 − 0.50 = −5.0, 0.60 − 0.60 = +0.0, –. Paired interval over the two pairs: A mean
    +12.5, sd 3.536, se 2.5, t(0.975, 1) = 12.706 -> +12.5 ± 31.77 = [−19.27, +44.27]; B −2.5 ± 31.77; detectable at 80 % power (12.706 + t(0.8, 1) = 1.3764) · 2.5 =
    35.2 for both. Stored peers of GRPO seed 1: A 0.42,
    stored gain 0.42 − 0.30 = +12.0 beside the online gain +15.0, ratio 80 %; B 0.55, stored gain +5.0 beside
    an online gain of −5.0: no ratio. Unpaired, every seed (A): GRAFT mean (0.45 + 0.50 + 0.90) / 3 = 0.61667 −
    GRPO 0.35 = +26.7; var/n 0.060833 / 3 = 0.020278 and 0.005 / 2 = 0.0025, se 0.15092, Welch df 0.022778^2 /
    (0.020278^2 / 2 + 0.0025^2 / 1) = 2.449 -> 2, half-width 4.3027 · 0.15092 = 0.6494 -> [−38.3, +91.6]; GRAFT's
    ranks 3, 4, 5 of 5: rank sum 12 vs mean 9, as extreme in 2 of C(5, 3) = 10 splits -> p 0.2."""
    from graft.commands.cli import main
    path = _seeded_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    plan = load_plan(path)
    _record(plan, PASS1)
    assert main(["experiment", "summarize", str(path)]) == 0
    s = json.loads((plan.results / "summary.json").read_text())
    diff = s["paired_diff_graft_minus_grpo_n8"]
    assert diff["A"] == [pytest.approx(0.15), pytest.approx(0.10), None]
    assert diff["B"] == [pytest.approx(-0.05), pytest.approx(0.0), None]
    assert s["paired_diff_graft_minus_grpo_n8_number"] == {"A": [None] * 3, "B": [None] * 3}   # no responses kept
    ci = s["paired_ci_graft_minus_grpo_n8"]["A"]
    assert ci["n"] == 2 and ci["mean"] == pytest.approx(0.125) and ci["ci95"] == pytest.approx([-0.192655, 0.442655], abs=1e-5)
    assert ci["detectable"] == pytest.approx(0.352, abs=1e-4)
    assert s["paired_ci_graft_minus_grpo_n8_number"]["A"] == {"mean": None, "ci95": [None, None], "sd": None,
                                                                "detectable": None, "n": 0}
    (row_a,) = s["stored_vs_online"]["A"]
    assert list(row_a) == ["seed", "stored", "grpo_n8", "graft_n8", "stored_gain", "online_gain", "ratio"]
    assert row_a["stored_gain"] == pytest.approx(0.12) and row_a["ratio"] == pytest.approx(0.8)
    assert s["stored_vs_online"]["B"][0]["ratio"] is None
    assert set(s["clip_frac_peer"]) == {"peer_last"}
    md = (plan.results / "REPORT.md").read_text()
    assert md.startswith("# tiny: GRAFT vs GRPO on A and B\n")
    assert "| GRAFT n=8 − GRPO n=8 | A | +15.0, +10.0, – | +12.5 [-19.3, +44.3] (2) | 35.2 |" in md
    assert "| GRAFT n=8 − GRPO n=8 | B | -5.0, +0.0, – | -2.5 [-34.3, +29.3] (2) | 35.2 |" in md
    un = s["unpaired_graft_minus_grpo_n8"]["A"]
    assert un["diff"] == pytest.approx(0.266667, abs=1e-5) and un["n"] == [3, 2] and un["p_rank_sum"] == pytest.approx(0.2)
    assert un["ci95"] == pytest.approx([-0.3827, 0.9160], abs=1e-4)
    assert "| GRAFT n=8 − GRPO n=8 | A | +26.7 [-38.3, +91.6] (3 / 2) | 0.200 |" in md
    assert ("Stored vs online, A (seed 1): stored peer 42.0, GRPO n=8 30.0, GRAFT n=8 45.0: stored gain +12.0 "
            "points, online gain +15.0 points, ratio 80 % (paper: 84 %).") in md
    assert "Stored vs online, B (seed 1): stored peer 55.0, GRPO n=8 50.0, GRAFT n=8 45.0" in md
    assert "ratio not defined (online gain ≤ 0)" in md


def test_a_pre_registered_decision_waits_for_its_pairs_then_gives_a_verdict(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    """The same recorded runs (A's GRAFT − GRPO: +15.0, +10.0, – ; B's −5.0, +0.0, –). Declared with 3 pairs the
    verdict waits (2 in); with 2 pairs A's interval [−19.3, +44.3] reaches below 0: not confirmed; with GRPO's
    seed-2 value lowered so that A's pairs are +15.0 and +14.0, mean +14.5, sd 0.707, half-width 12.706 * 0.5 =
    6.35 -> [+8.1, +20.9]: confirmed."""
    from graft.commands.experiment.report import report_markdown
    def decided(pairs: int) -> tuple[dict, str]:
        compared = {**COMPARED, "comparisons": {"confirm": {"arm": "graft_n8", "baseline": "grpo_n8",
                                                            "decision": {"model": "A", "pairs": pairs}}}}
        plan = load_plan(_seeded_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared=compared))
        s = summarize(plan)
        return s["decision_confirm"], report_markdown(plan, s, {})
    plan = load_plan(_seeded_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir))
    _record(plan, PASS1)
    d, md = decided(3)
    assert d["verdict"] == "waits" and d["n"] == 2 and d["model"] == "A"
    assert "**verdict waits** (2 of 3 pairs in; a partial set is not read)" in md
    d, md = decided(2)
    assert d["verdict"] == "not confirmed" and d["ci95"][0] < 0
    assert "**not confirmed**: +12.5 [-19.3, +44.3] (2) points" in md
    (m,) = [m for m in plan.members if (m.arm, m.seed) == ("grpo_n8", 2)]
    (m.results_dir / "eval" / "A" / "results.json").write_text(json.dumps({"macro": {"pass@1": {"mean": 0.36}},
                                                                              "datasets": {"test": {"pass@1": {"mean": 0.36}}}}))
    d, md = decided(2)
    assert d["verdict"] == "confirmed" and d["ci95"] == pytest.approx([0.08147, 0.20853], abs=1e-4)
    assert "**confirmed**: +14.5 [+8.1, +20.9] (2) points" in md
    # `graft experiment summarize` prints the verdict, not only the report
    from graft.commands.cli import main
    compared = {**COMPARED, "comparisons": {"confirm": {"arm": "graft_n8", "baseline": "grpo_n8",
                                                        "decision": {"model": "A", "pairs": 2}}}}
    path = _seeded_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared=compared)
    capsys.readouterr()
    assert main(["experiment", "summarize", str(path)]) == 0
    out = capsys.readouterr().out
    assert "on A, confirmed iff the Student-t 95 % interval over 2 paired seeds lies above 0: confirmed: +14.5 [+8.1, +20.9]" in out


def test_strict_paired_table_only_where_it_differs(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    """A plan that already grades with the strict rule gets one paired table, not the same one twice; where the
    strict re-grade changes any seed's difference (A seed 1: +15.0 -> +5.0) both tables are printed."""
    from graft.commands.experiment.report import strict_section
    plan = load_plan(_seeded_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir))
    _record(plan, PASS1)
    s = summarize(plan)
    s["arms_answer_form_number"] = {arm: {a: [0.3] for a in ("A", "B")} for arm in ("grpo_n8", "graft_n8")}
    for key in [k for k in s if k.startswith(("paired_diff_", "paired_ci_")) and not k.endswith("_number")]:
        s[key + "_number"] = json.loads(json.dumps(s[key]))
    md = "\n".join(strict_section(plan, s))
    assert "the same as with the plan's own grading" in md and "Paired difference, same seed, strict" not in md
    s["paired_diff_graft_minus_grpo_n8_number"]["A"][0] = 0.05
    md = "\n".join(strict_section(plan, s))
    assert "the same as with the plan's own grading" not in md
    assert "| GRAFT n=8 − GRPO n=8 | A | +5.0, +10.0, – |" in md


def test_a_plan_without_comparisons_reports_none(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    """The same runs, nothing declared: the arms' pass@1 are there, no difference, no stored-vs-online gain,
    no clip-rate comparison, and the heading claims no comparison."""
    from graft.commands.experiment.report import report_markdown
    plan = load_plan(_seeded_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared={}))
    _record(plan, PASS1)
    s = summarize(plan)
    assert s["arms"]["graft_n8"]["A"] == [0.45, 0.50, 0.90] and s["stored"]["A"] == [0.42]
    assert not [k for k in s if k.startswith("paired_diff") or k == "stored_vs_online"]
    assert s["clip_frac_peer"] == {} and s["clip_frac_peer_by_model"] == {}
    md = report_markdown(plan, s, {})
    assert md.startswith("# tiny on A and B\n")
    assert "paired difference" not in md and "Stored vs online" not in md and "clip rate" not in md


@pytest.mark.parametrize("change, key", [
    ({"comparisons": {"g": {"arm": "graft_n8", "baseline": "grpo_n9"}}}, "comparisons.g.baseline"),
    ({"comparisons": {"g": {"arm": "graft", "baseline": "grpo_n8"}}}, "comparisons.g.arm"),
    ({"comparisons": {"g": {"arm": "graft_n8", "baseline": "grpo_n8", "label": "x"}}}, "comparisons.g"),
    ({"comparisons": {"g": {"arm": "graft_n8", "baseline": "graft_n8"}}}, "comparisons.g"),
    ({"comparisons": [{"arm": "graft_n8", "baseline": "grpo_n8"}]}, "comparisons"),
    ({"comparisons": {"g": {"arm": "graft_n8", "baseline": "grpo_n8", "decision": {"model": "C", "pairs": 8}}}},
     "comparisons.g.decision.model"),
    ({"comparisons": {"g": {"arm": "graft_n8", "baseline": "grpo_n8", "decision": {"model": "A", "pairs": 1}}}},
     "comparisons.g.decision.pairs"),
    ({"comparisons": {"g": {"arm": "graft_n8", "baseline": "grpo_n8", "decision": {"model": "A"}}}},
     "comparisons.g.decision"),
    ({"labels": {"grpo_n9": "GRPO"}}, "labels.grpo_n9"),
    ({"clip_frac_peer": {"peer_last": "graft_n9"}}, "clip_frac_peer.peer_last"),
    ({"stored": {"from": "grpo_n9"}}, "stored.from"),
    ({"arms": {"stored_A": []}}, "arms.stored_A"),
    ({"onestep": ["a.json"]}, "onestep"),
    ({"keep_checkpoints": ["grpo_n9"]}, "keep_checkpoints"),
    ({"keep_checkpoints": ["grpo_n8/7"]}, "keep_checkpoints"),
    ({"keep_checkpoints": "grpo_n8"}, "keep_checkpoints"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_a_bad_declaration_is_refused_in_one_line(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys, change, key):
    from graft.commands.cli import main
    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **change}, sort_keys=False))
    assert main(["experiment", "summarize", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {key}: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "results").exists()


def test_a_named_onestep_summary_becomes_one_step_effect(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    """The plan's ``onestep`` summary (rows hand-made: A->B replaced prompts +0.25 and +0.0 in two states,
    mean +12.5 points; gate off +0.0) is carried into summary.json in the issue's shape and into REPORT.md."""
    from graft.commands.experiment.report import report_markdown
    from graft.commands.onestep import summarize_rows
    row = lambda step, kind, g, a: {"seed": 1, "step": step, "direction": "A->B", "kind": kind,  # noqa: E731
                                    "success": {"grpo": 0.5, "graft": 0.5 + g, "all": 0.5 + a},
                                    "admitted": {"graft": 3, "all": 8}, "admitted_correct": {"graft": 2, "all": 2}}
    rows = [row(1, "replaced", 0.25, 0.0), row(7, "replaced", 0.0, 0.0), row(1, "unseen", 0.0, -0.25)]
    (tmp_path / "onestep.json").write_text(json.dumps({"command": ["graft", "onestep"], **summarize_rows(rows),
                                                       "states": {"measured": 3, "with_exchange": 2}}))
    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared={"onestep": "onestep.json"})
    plan = load_plan(path)
    s = summarize(plan)
    eff = s["one_step_effect"]["A->B"]
    assert set(eff) == {"replaced", "unseen"}
    assert set(eff["replaced"]) == {"mean", "ci95", "prompts", "states", "differed", "t95"}
    assert eff["replaced"]["mean"] == pytest.approx(0.125) and eff["replaced"]["prompts"] == 2
    assert s["one_step_effect_gate_off"]["A->B"]["unseen"]["mean"] == pytest.approx(-0.25)
    assert s["one_step_treatment"]["A->B"]["admitted_correct/graft"] == 4      # two replaced rows x 2
    md = report_markdown(plan, s, {})
    line = next(x for x in md.splitlines() if x.startswith("| A->B | replaced |"))
    assert "+12.5 [" in line and "| 2 (2) | 6 (4) |" in line
    assert s["one_step_states"] == {"measured": 3, "with_exchange": 2}
    assert "Training states measured: 3; 2 had a prompt to exchange" in md
    # t over the 2 state means (+0.25, 0.0): mean 0.125, sd 0.1768, se 0.125, t(0.975, df 1) = 12.706,
    # half-width 1.588 -> [-1.463, +1.713]; 1 of the 2 replaced prompts changed at all
    # gate off: both states' replaced differences 0.0 -> [+0.0, +0.0]
    assert "| A->B | replaced | +12.5 [-146.3, +171.3] | +0.0 [+0.0, +0.0] | 1 of 2 | 2 |" in md
    assert "| A->B | unseen | +0.0 (one state: no interval) | -25.0 (one state: no interval) | 0 of 1 | 1 |" in md
    assert s["one_step_verdict_interval"]["uses"] == "t95"
    missing = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir, compared={"onestep": "none.json"})
    assert "one_step_effect" not in summarize(load_plan(missing))   # not measured yet: nothing claimed


def test_last_quarter_is_what_the_selection_rule_reads():
    """8 logged steps -> the last ceil(8/4) = 2 (steps 7-8): reward (0.5 + 0.3) / 2 = 0.4, distinct_frac
    (0.6 + 0.4) / 2 = 0.5; rewarded 4 + 6 = 10 responses, flagged 0.25 * 4 + 0.5 * 6 = 4 of them: 40 %."""
    from graft.commands.experiment.summary import last_quarter
    rows = [{"step": s, "A/reward/mean": 0.1, "A/distinct_frac": 0.9, "A/rewarded/n": 2, "A/rewarded/echo": 1.0}
            for s in range(1, 7)]
    rows += [{"step": 7, "A/reward/mean": 0.5, "A/distinct_frac": 0.6, "A/rewarded/n": 4, "A/rewarded/echo": 0.25},
             {"step": 8, "A/reward/mean": 0.3, "A/distinct_frac": 0.4, "A/rewarded/n": 6, "A/rewarded/example_copy": 0.5},
             {"final": True}]
    q = last_quarter(rows, "A")
    assert q["steps"] == [7, 8] and q["rewarded"] == 10
    assert q["reward"] == pytest.approx(0.4) and q["distinct_frac"] == pytest.approx(0.5)
    assert q["echo_or_copy_share"] == pytest.approx(0.4)
    assert last_quarter(rows, "B") is None


def test_last_quarter_table_averages_the_finished_seeds():
    """Seeds with reward 0.6 and 0.4 (one unfinished): mean 0.500 over [2]; distinct (0.3 + 0.5) / 2 = 0.40;
    flagged 0.1 * 100 + 0.4 * 50 = 30 of 150 rewarded: 20 %."""
    from graft.commands.experiment.report import _last_quarter_table
    q = lambda r, d, e, n: {"steps": [14, 18], "reward": r, "distinct_frac": d, "echo_or_copy_share": e, "rewarded": n}
    md = _last_quarter_table({"last_quarter": {"arm": {"A": [q(0.6, 0.3, 0.1, 100), None, q(0.4, 0.5, 0.4, 50)],
                                                       "B": [None, None]}}})
    assert md[-1] == "| arm | A | 14–18 | 0.500 [2] | 0.40 | 20 % of 150 |"
    assert not any("| B |" in line for line in md)                          # no finished seed, no row


def test_a_command_killed_or_failing_stops_the_plan_in_one_line(monkeypatch):
    """A child killed by a signal before its handler is in place (exit status -15) stops the plan resumably
    (Preempted, exit 75 from the CLI); a failing child (exit 1) stops it with one `error:` line, no traceback."""
    from graft.commands.experiment import run
    from graft.commands.experiment.run import RunFailed, _run
    from graft.trainer.stop import Preempted

    cmd = ["python", "-m", "graft.cli", "train", "cfg.yaml", "steps=18"]
    monkeypatch.setattr(run, "run_command", lambda c: -15)
    with pytest.raises(Preempted, match="killed by SIGTERM before it could checkpoint"):
        _run(cmd, "grpo_n8/seed1")
    monkeypatch.setattr(run, "run_command", lambda c: 1)
    with pytest.raises(RunFailed, match=r"`graft train` of grpo_n8/seed1 failed with exit status 1"):
        _run(cmd, "grpo_n8/seed1")
    monkeypatch.setattr(run, "run_command", lambda c: 0)
    _run(cmd, "grpo_n8/seed1")


def test_a_plan_edited_after_a_run_started_is_refused_by_run_and_summarize(tmp_path, tiny_llama_dir, tiny_gemma_dir,
                                                                           monkeypatch):
    """Seeds 1-2 trained at delta 0.8, then the plan edited to delta 0.3: `experiment run` trains nothing more and
    `summarize` pools nothing, each with one line naming the arm, the field, both values and the run; the run's
    record here is its run folder's config.yaml, or the one under results/ (a run of another machine)."""
    from graft.commands.experiment import run as experiment
    from graft.config import load_config, save_config

    path = _plan(tmp_path, tiny_llama_dir, tiny_gemma_dir)
    raw = yaml.safe_load(path.read_text())
    raw["arms"] = {"graft_n8": {"overrides": ["exchange.delta=0.8"], "seeds": [1, 2]}}
    raw.pop("stored"), raw.pop("comparisons", None), raw.pop("labels", None), raw.pop("clip_frac_peer", None)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    plan = load_plan(path)
    first, second = plan.members
    first.run_dir.mkdir(parents=True)
    save_config(load_config(plan.config, first.train_overrides()), first.run_dir / "config.yaml")
    second.results_dir.mkdir(parents=True)
    save_config(load_config(plan.config, second.train_overrides()), second.results_dir / "config.yaml")
    ran = []
    monkeypatch.setattr(experiment, "run_member", lambda plan, m, log: ran.append(m))

    raw["arms"]["graft_n8"]["overrides"] = ["exchange.delta=0.3", "progress=true"]   # progress: not what it computes
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    edited = load_plan(path)
    for refused in (lambda: run_plan(edited), lambda: summarize(edited)):
        with pytest.raises(ConfigError) as e:
            refused()
        msg = str(e.value)
        assert msg.startswith("arm graft_n8: exchange.delta is 0.3 in the plan now but 0.8 in its run seed1 (") and "\n" not in msg
        assert "progress" not in msg and "give the changed arm a new name" in msg
    assert ran == []
    first.run_dir.joinpath("config.yaml").unlink()   # its record under results/ (seed 2) stands as well
    with pytest.raises(ConfigError, match=r"in its run seed2 \(.*results/runs/graft_n8/seed2/config\.yaml\)"):
        run_plan(edited)

    raw["arms"]["graft_n8"]["overrides"] = ["exchange.delta=0.8", "progress=true"]   # restored
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    run_plan(load_plan(path))
    assert [m.seed for m in ran] == [1, 2]


def test_status_names_the_process_training_a_run(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    """A `graft train` left running (its `experiment run` killed) holds the run's folder: status says so instead of
    "resumes from checkpoint k" while it trains on."""
    import os

    from graft.commands.experiment.run import member_state
    from graft.storage.lock import FolderLock

    plan = load_plan(_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir))
    m = plan.members[0]
    m.run_dir.mkdir(parents=True)
    (m.run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    assert member_state(m, 3) == "step 1/3 (no checkpoint yet)"
    with FolderLock(m.run_dir, "run_dir"):
        assert member_state(m, 3).startswith(f"step 1/3, training (pid {os.getpid()} on ")

"""Issue 21, faults of a long run on a shared cluster, end to end on the tiny models with the real
tokenizers: two processes on one folder, a diverging update, a preemption signal, a length the
model cannot hold."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from graft.commands.cli import main
from graft.config import ConfigError, ModelConfig, save_config, to_dict
from graft.storage.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint, verify_model_files
from graft.storage.lock import LOCK_NAME, FolderLock
from graft.trainer import loop
from graft.trainer.stop import DIVERGED_EXIT, PREEMPTED_EXIT
from tests.patience import patient
from tests.trainer.helpers import crafted_rewards, tiny_config
from tests.trainer.test_resume import REPO, _assert_same_steps, _final_params, _metrics, _spawn, _store_steps, _wait_for


def _last_line(err: str) -> str:
    lines = [l for l in err.strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err[-3000:]


# ----------------------------------------------------------------------------- 1. one process per folder

@pytest.mark.slow
def test_second_train_on_a_running_run_dir_stops_and_writes_nothing(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    cfg = tiny_config(tmp_path / "first", tiny_llama_dir, tiny_gemma_dir, "steps=3", "checkpoint.save_every=1")
    run_dir = Path(cfg.run_dir)
    first = _spawn(tmp_path / "first", cfg, True)   # slow checkpoint writes: the first run is still busy
    _wait_for(lambda: (run_dir / "config.yaml").exists(), first)
    before = sorted(p.name for p in run_dir.iterdir())
    second = subprocess.run([sys.executable, "-m", "graft.cli", "train", str(tmp_path / "first" / "cfg.yaml")],
                            cwd=REPO, capture_output=True, text=True, timeout=patient(300))
    assert second.returncode == 2, second.stderr[-3000:]
    _no_traceback(second.stderr)
    last = _last_line(second.stderr)
    assert last.startswith("error: run_dir") and f"pid {first.pid} on " in last, last
    assert first.wait(timeout=patient(600)) == 0, first.stderr.read().decode()[-3000:]
    assert len(_metrics(run_dir)) == 3   # one writer: 3 lines for 3 steps (was 6: two runs interleaved)
    assert set(before) <= {p.name for p in run_dir.iterdir()}
    # released at the end: the run folder can be resumed by the next process
    FolderLock(run_dir, "run_dir").acquire().release()


def test_a_held_run_dir_is_refused_before_anything_is_written(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1")
    save_config(cfg, tmp_path / "cfg.yaml")
    run_dir = Path(cfg.run_dir)
    with FolderLock(run_dir, "run_dir"):
        assert main(["train", str(tmp_path / "cfg.yaml")]) == 2
        assert [p.name for p in run_dir.iterdir()] == [LOCK_NAME]   # no config.yaml, metrics, store
    assert f"pid {os.getpid()} on " in _last_line(capsys.readouterr().err)


def test_a_refused_run_leaves_no_folder_behind(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "models.0.path=/nonexistent/model")
    with pytest.raises(Exception, match="nonexistent"):
        loop.setup(cfg)
    assert not Path(cfg.run_dir).exists()   # the lock took the folder; released, it is gone again


def test_eval_out_folder_is_locked(tmp_path, tiny_llama_dir, capsys):
    out = tmp_path / "eval"
    args = ["eval", "--model", tiny_llama_dir, "--template", "plain", "--data", "t=arithmetic", "--limit", "2",
            "--n", "1", "--repeats", "1", "--max-new-tokens", "4", "--verify-workers", "0", "--no-progress",
            "--out", str(out)]
    with FolderLock(out, "--out folder"):
        assert main(args) == 2
        assert [p.name for p in out.iterdir()] == [LOCK_NAME]
    assert "--out folder" in _last_line(capsys.readouterr().err)
    assert main(args) == 0 and (out / "results.json").is_file()


def test_trajectory_store_has_one_writer(tmp_path):
    from graft.storage.lock import LockError
    from graft.storage.trajectory_store import TrajectoryStore
    from tests.storage.kill_driver import groups_for

    a = TrajectoryStore(tmp_path / "trajectories", run_id="a")
    a.write_step(0, 0, groups_for(0), {"A": "tok"})
    b = TrajectoryStore(tmp_path / "trajectories", run_id="b")
    with pytest.raises(LockError, match=f"pid {os.getpid()} on "):
        b.write_step(1, 0, groups_for(1), {"A": "tok"})
    with pytest.raises(LockError):
        b.truncate_after(0)
    assert TrajectoryStore(tmp_path / "trajectories").steps() == [0]   # readers need no lock
    a.close()
    b.write_step(1, 0, groups_for(1), {"A": "tok"})
    assert b.steps() == [0, 1]


def test_experiment_runs_share_a_plan_by_claiming_runs(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    """Two `experiment run` processes on one plan: a run (and the base evaluation) another process holds is
    skipped, not started a second time, and reported unfinished; the next unclaimed run is taken."""
    from graft.commands.experiment import run as experiment
    from tests.test_experiment import _plan

    plan = experiment.load_plan(_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir))
    plan.base = True
    ran = []
    monkeypatch.setattr(experiment, "run_member", lambda plan, m, log: ran.append(f"{m.arm}/seed{m.seed}"))
    monkeypatch.setattr(experiment, "evaluate_base", lambda plan, log: ran.append("base"))
    first = plan.members[0]
    held = experiment.claim(plan, f"{first.arm}/seed{first.seed}")
    assert held is not None and experiment.claim(plan, f"{first.arm}/seed{first.seed}") is None
    with held, FolderLock(plan.runs / ".claims" / "base"):
        status = experiment.plan_status(plan)
        assert f"running (pid {os.getpid()} on " in status[0]["state"] and "running" not in status[1]["state"]
        left = experiment.run_plan(plan)
    trained = [f"{m.arm}/seed{m.seed}" for m in plan.members if m.store is None]   # stored arms wait for grpo_n8
    assert len(trained) >= 2 and ran == trained[1:]
    assert first in left
    assert not list((plan.runs / ".claims").iterdir())   # released claims leave nothing behind
    ran.clear()
    experiment.run_plan(plan)
    assert ran == ["base"] + trained


# ----------------------------------------------------------------------------- 2. a diverging update

@pytest.mark.slow
def test_diverging_update_is_skipped_then_stops_with_exit_3(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    # lr 1e6: A's first minibatch step blows its weights up, every later gradient norm is NaN
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=6", "checkpoint.save_every=1", "models.0.lr=1e6")
    run_dir = Path(cfg.run_dir)
    proc = _spawn(tmp_path, cfg, False)
    assert proc.wait(timeout=patient(600)) == DIVERGED_EXIT
    err = proc.stderr.read().decode()
    _no_traceback(err)
    assert "warning: step 1: model A:" in err and "optimizer steps skipped" in err
    last = _last_line(err)
    assert last.startswith("error: step 3: model A:") and "update.max_nonfinite_steps=3" in last, last
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]   # stopped after the 3rd consecutive step with a skip
    assert all(r["A/update/skipped_nonfinite"] >= 1 for r in rows)
    assert all(r["B/update/skipped_nonfinite"] == 0 for r in rows)
    # checkpoints of steps 1 and 2 (none of step 3, none final); their weights are finite
    assert [load_checkpoint(p).step for p in list_checkpoints(run_dir)] == [1, 2]
    for p in list_checkpoints(run_dir):
        verify_model_files(p / "A")   # raises on NaN/inf weights


def test_nonfinite_update_leaves_weights_and_optimizer_state_alone(tmp_path, tiny_llama_dir):
    from graft.algos.minibatch import plan_minibatches
    from graft.trainer.learner import Learner
    from graft.trainer.rules import make_rule
    from graft.types import Prompt

    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_llama_dir)
    learner = Learner.local(ModelConfig(name="A", path=tiny_llama_dir, template="plain"))
    groups, _ = learner.rollout([Prompt(id="p-0", problem="What is 1 + 1?", answer="2")], cfg.rollout, 1, 7)
    groups[0].advantages = [float("nan")] + [1.0] * (groups[0].size - 1)   # -> NaN loss and gradients
    before = {k: v.clone() for k, v in learner.policy.model.named_parameters()}
    m = learner.update(groups, plan_minibatches([False], 1, "peer_last", torch.Generator().manual_seed(0)),
                       cfg.update, 1.0, make_rule(cfg.update, cfg.reward.success_threshold))
    assert m["update/skipped_nonfinite"] == 1 and not math.isfinite(m["grad_norm"])
    for k, v in learner.policy.model.named_parameters():
        assert torch.equal(v, before[k]), k
    assert learner.optimizer.state_dict()["state"] == {}   # no Adam moments, no step count


def test_nonfinite_weights_are_never_checkpointed_nor_loaded(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    from graft.trainer.stop import Diverged

    crafted_rewards(monkeypatch)
    run = loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1"))
    with torch.no_grad():
        next(run.learners["A"].policy.model.parameters())[0, 0] = float("nan")
    with pytest.raises(Diverged, match="model A: 1 parameter tensor"):
        loop.save(run, 1)
    assert list_checkpoints(run.run_dir) == []
    # a checkpoint holding NaN weights (written around the check): eval and export refuse it, one line each
    save_checkpoint(run.run_dir, 1, {n: l.save for n, l in run.learners.items()},
                    {n: l.optimizer for n, l in run.learners.items()}, {"step": 1}, to_dict(run.cfg), keep_last=2)
    run.lock.release()
    save_config(run.cfg, run.run_dir / "config.yaml")
    step = list_checkpoints(run.run_dir)[0]
    assert main(["export", str(run.run_dir), str(tmp_path / "out"), "--model", "A"]) == 2
    assert "NaN or inf" in _last_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
    assert main(["eval", "--model", str(step / "A"), "--data", "t=arithmetic", "--limit", "1", "--n", "1",
                 "--repeats", "1", "--out", str(tmp_path / "ev"), "--no-progress"]) == 2
    assert "NaN or inf" in _last_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------- 3. preemption

@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_equals_uninterrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    steps = 4
    ref_cfg = tiny_config(tmp_path / "ref", tiny_llama_dir, tiny_gemma_dir, f"steps={steps}")
    ref = _spawn(tmp_path / "ref", ref_cfg, False)
    assert ref.wait(timeout=patient(600)) == 0, ref.stderr.read().decode()[-3000:]

    cfg = tiny_config(tmp_path / "term", tiny_llama_dir, tiny_gemma_dir, f"steps={steps}")   # no save_every
    run_dir = Path(cfg.run_dir)
    proc = _spawn(tmp_path / "term", cfg, False)
    _wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(_metrics(run_dir)) >= 1, proc)
    proc.send_signal(signal.SIGTERM)   # during step 2 (mostly): that step finishes, is checkpointed, the run stops
    assert proc.wait(timeout=patient(300)) == PREEMPTED_EXIT
    err = proc.stderr.read().decode()
    _no_traceback(err)
    last = _last_line(err)
    k = len(_metrics(run_dir))
    assert 1 <= k < steps and last.startswith(f"SIGTERM: stopped at step {k}; continue with resume=true (checkpoint "), last
    assert [load_checkpoint(p).step for p in list_checkpoints(run_dir)] == [k]
    assert _store_steps(run_dir) == list(range(1, k + 1))

    resumed = _spawn(tmp_path / "term", cfg, False, "resume=true")
    assert resumed.wait(timeout=patient(600)) == 0, resumed.stderr.read().decode()[-3000:]
    assert _store_steps(run_dir) == list(range(1, steps + 1))
    _assert_same_steps(_metrics(Path(ref_cfg.run_dir)), _metrics(run_dir))
    pa, pb = _final_params(Path(ref_cfg.run_dir), ref_cfg), _final_params(run_dir, cfg)
    for key in pa:
        torch.testing.assert_close(pa[key], pb[key], rtol=0, atol=0)


@pytest.mark.slow
def test_second_signal_stops_at_once(tmp_path, tiny_llama_dir, tiny_gemma_dir):
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=50")
    run_dir = Path(cfg.run_dir)
    proc = _spawn(tmp_path, cfg, False)
    _wait_for(lambda: (run_dir / "metrics.jsonl").exists(), proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=patient(60)) == -signal.SIGINT   # the default action, as without graft's handler
    assert len(_metrics(run_dir)) < 50


def test_experiment_run_stops_after_its_current_run(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    from graft.commands.experiment import run as experiment
    from graft.trainer.stop import Preempted
    from tests.test_experiment import _plan

    plan = experiment.load_plan(_plan(tmp_path, tiny_llama_dir, tiny_gemma_dir))
    ran = []

    def member(plan, m, log):
        ran.append(m.arm)
        os.kill(os.getpid(), signal.SIGTERM)   # arrives while this run is in progress

    monkeypatch.setattr(experiment, "run_member", member)
    before = signal.getsignal(signal.SIGTERM)   # SIG_DFL, or a handler a library installed earlier in this process
    with pytest.raises(Preempted, match="SIGTERM: stopped after the current run"):
        experiment.run_plan(plan)
    assert ran == ["grpo_n8"]   # of four runs
    assert signal.getsignal(signal.SIGTERM) is before   # the handler is gone again
    # a run of the plan that got the signal itself (exit 75) stops the plan too
    with pytest.raises(Preempted, match="graft train stopped on a signal"):
        experiment._run([sys.executable, "-c", f"import sys; sys.exit({PREEMPTED_EXIT})", "train"], "grpo_n8/seed1")


# ----------------------------------------------------------------------------- 4. a length the model cannot hold

def test_prompt_plus_max_new_tokens_beyond_the_model_is_refused(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    # the tiny models hold 4096 positions; the plain prompts are a few dozen tokens
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "rollout.max_new_tokens=4090")
    with pytest.raises(ConfigError, match=r"rollout\.max_new_tokens=4090: the longest prompt \((\d+) tokens\) plus 4090 "
                                          r"new tokens is \d+ positions, beyond model A's max_position_embeddings=4096"):
        loop.setup(cfg)
    assert not Path(cfg.run_dir).exists()
    save_config(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "rollout.max_new_tokens=100000"), tmp_path / "c.yaml")
    assert main(["train", str(tmp_path / "c.yaml")]) == 2
    assert "max_position_embeddings=4096" in _last_line(capsys.readouterr().err)
    # the validation set with its own limit, and graft eval
    with pytest.raises(ConfigError, match=r"eval\.max_new_tokens=5000.*model A"):
        loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "data.val=arithmetic", "eval.every=1",
                               "eval.max_new_tokens=5000"))
    assert main(["eval", "--model", tiny_gemma_dir, "--template", "plain", "--data", "t=arithmetic", "--limit", "2",
                 "--n", "1", "--repeats", "1", "--max-new-tokens", "5000", "--no-progress",
                 "--out", str(tmp_path / "ev")]) == 2
    assert "--max-new-tokens=5000" in _last_line(capsys.readouterr().err)
    assert not (tmp_path / "ev").exists()


def test_probe_checks_the_length(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    save_config(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "rollout.max_new_tokens=4095"), tmp_path / "c.yaml")
    assert main(["probe", str(tmp_path / "c.yaml"), "--prompts", "2"]) == 2
    assert "beyond model A's max_position_embeddings=4096" in _last_line(capsys.readouterr().err)

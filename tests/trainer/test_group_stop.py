"""A run stopped as a cluster stops a job -- SIGTERM to its whole process group (Slurm, systemd) -- in the rollout,
the score and the update phase, with each kind of grader: a reward function, a domain's grader, the code sandbox.
Every stop finishes the step in progress, checkpoints it and exits 75 (graft's workers ignore the signal, so no
reward is lost or scored as an error), and the resumed run's metrics, stored rewards and weights equal an
uninterrupted run's bit for bit. SIGHUP (a closed terminal) and SIGINT (Ctrl-C) to the group do the same. One tiny
model: a reference and a run per stop plus the one that finishes; about 45 s for the function and the domain kind
(stopped at steps 1-4, 5 steps) and 65 s for the code kind (steps 1-3, 4 steps) on 2 cores."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from graft.storage.checkpoint import list_checkpoints, load_checkpoint
from graft.trainer.stop import PREEMPTED_EXIT
from tests.patience import patient
from tests.trainer.group_stop import write_files
from tests.trainer.helpers import tiny_config
from tests.trainer.test_resume import _assert_same_steps, _final_params, _metrics, _spawn

pytestmark = pytest.mark.slow

STOPS = {
    "function": ("rollout:1:SIGTERM", "score:2:SIGTERM", "update:3:SIGTERM", "score:4:SIGHUP"),
    "domain": ("rollout:1:SIGTERM", "score:2:SIGTERM", "update:3:SIGTERM", "score:4:SIGINT"),
    "code": ("rollout:1:SIGTERM", "score:2:SIGTERM", "update:3:SIGTERM"),
}
"""Per kind, where each run is stopped (phase:step:signal to the group); the step is the one it checkpoints, and one
run more finishes."""


def _prelude(kind: str, folder: Path) -> str:
    return (f"sys.path.insert(0, {str(folder)!r})\nimport os, pathlib\nfrom tests.trainer.group_stop import install\n"
            f"install({kind!r}, os.environ.get('GRAFT_TEST_STOP_AT', ''), pathlib.Path({str(folder)!r}))")


def _graded(run_dir: Path) -> list[tuple]:
    """(step, prompt, sample, reward, status) of every stored response."""
    rows = []
    for f in sorted((run_dir / "trajectories").glob("step_*.parquet")):
        t = pq.read_table(f).to_pylist()
        rows += [(r["step"], r["prompt_id"], r["group_index"], r["reward"], r["verify_status"]) for r in t]
    return rows


def _run(tmp_path: Path, cfg, kind: str, stop_at: str, monkeypatch, *extra: str):
    monkeypatch.setenv("GRAFT_TEST_STOP_AT", stop_at)
    proc = _spawn(Path(cfg.run_dir).parent, cfg, False, *extra, prelude=_prelude(kind, tmp_path), session=True)
    rc = proc.wait(timeout=patient(600))
    return rc, proc.stderr.read().decode()


@pytest.mark.parametrize("kind", ["function", "domain", "code"])
def test_group_sigterm_in_each_phase_then_resume_equals_uninterrupted(tmp_path, tiny_llama_dir, kind, monkeypatch):
    stops = STOPS[kind]
    overrides = [f"steps={len(stops) + 1}", "exchange.kind=none", "reward.workers=1", "batch_prompts=2", *write_files(tmp_path)[kind]]
    ref = tiny_config(tmp_path / "ref", tiny_llama_dir, tiny_llama_dir, *overrides, models=("A",))
    rc, err = _run(tmp_path, ref, kind, "", monkeypatch)
    assert rc == 0, err[-3000:]
    rewards = [r["A/reward/mean"] for r in _metrics(Path(ref.run_dir))]
    assert len(set(rewards)) > 1 or 0 < rewards[0] < 1, rewards   # rewards differ within groups: updates move weights

    cfg = tiny_config(tmp_path / "stopped", tiny_llama_dir, tiny_llama_dir, *overrides, models=("A",))
    run_dir = Path(cfg.run_dir)
    for k, where in enumerate(stops, 1):
        sig = where.split(":")[2]
        rc, err = _run(tmp_path, cfg, kind, where, monkeypatch, *(["resume=true"] if k > 1 else []))
        assert rc == PREEMPTED_EXIT, (where, err[-3000:])
        assert "Traceback" not in err and "warning:" not in err, (where, err[-3000:])
        assert f"{sig}: finishing the step in progress" in err, (where, err[-3000:])
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"{sig}: stopped at step {k}; continue with resume=true (checkpoint "), (where, last)
        assert load_checkpoint(list_checkpoints(run_dir)[-1]).step == k
    assert not (tmp_path / "fire").exists()   # the score-phase signal was sent from inside the reward code's call
    rc, err = _run(tmp_path, cfg, kind, "", monkeypatch, "resume=true")
    assert rc == 0, err[-3000:]

    _assert_same_steps(_metrics(Path(ref.run_dir)), _metrics(run_dir), names=("A",))
    assert _graded(run_dir) == _graded(Path(ref.run_dir))   # every reward and status, none an "error"
    pa, pb = _final_params(Path(ref.run_dir), ref), _final_params(run_dir, cfg)
    for key in pa:
        torch.testing.assert_close(pa[key], pb[key], rtol=0, atol=0)


@pytest.mark.parametrize("workers", [1, 0])
def test_a_cgroup_wide_sigterm_while_programs_run_then_resume_equals_uninterrupted(tmp_path, tiny_llama_dir, workers,
                                                                                   monkeypatch):
    """SIGTERM to every process of the run's tree (Slurm's scancel, systemd: the job's whole cgroup) while the sandbox
    runs programs that restored SIGTERM's default action, with the grader's worker and in-process (workers=0): the
    stop kills a program, which is graded again, not scored; the run stops after the step, and the resumed run equals
    the uninterrupted one bit for bit (every reward and status, none "interrupted" or "missing_result")."""
    overrides = ["steps=2", "exchange.kind=none", "batch_prompts=2", *write_files(tmp_path)["code_default"],
                 f"reward.workers={workers}"]
    ref = tiny_config(tmp_path / "ref", tiny_llama_dir, tiny_llama_dir, *overrides, models=("A",))
    rc, err = _run(tmp_path, ref, "code_default", "", monkeypatch)
    assert rc == 0, err[-3000:]
    cfg = tiny_config(tmp_path / "stopped", tiny_llama_dir, tiny_llama_dir, *overrides, models=("A",))
    rc, err = _run(tmp_path, cfg, "code_default", "score:1:SIGTERM:tree", monkeypatch)
    assert rc == PREEMPTED_EXIT, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("SIGTERM: stopped at step 1; continue with resume=true"), err[-3000:]
    rc, err = _run(tmp_path, cfg, "code_default", "", monkeypatch, "resume=true")
    assert rc == 0, err[-3000:]
    run_dir = Path(cfg.run_dir)
    _assert_same_steps(_metrics(Path(ref.run_dir)), _metrics(run_dir), names=("A",))
    graded = _graded(run_dir)
    assert graded == _graded(Path(ref.run_dir)) and {g[4] for g in graded} == {"ok", "wrong_answer"}
    pa, pb = _final_params(Path(ref.run_dir), ref), _final_params(run_dir, cfg)
    for key in pa:
        torch.testing.assert_close(pa[key], pb[key], rtol=0, atol=0)

"""Resumable runs: resume equals an uninterrupted run, also after SIGKILL mid-step or mid-checkpoint."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from graft.config import ConfigError, save_config
from graft.trainer import loop
from tests.patience import patient
from tests.trainer.helpers import crafted_rewards, params, tiny_config

REPO = Path(__file__).resolve().parents[2]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _final_params(run_dir: Path, cfg) -> dict:
    from graft.storage.checkpoint import latest_checkpoint, load_checkpoint
    from graft.trainer.learner import Learner

    ck = load_checkpoint(latest_checkpoint(run_dir))
    return params({m.name: Learner.local(m, weights_from=ck.model_dirs[m.name]) for m in cfg.models})


DETERMINISTIC = ("reward/mean", "all_fail_frac", "response_length/mean", "peer_responses", "num_tokens")


def _assert_same_steps(rows_a, rows_b, names=("A", "B")):
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    for ra, rb in zip(rows_a, rows_b):
        for n in names:
            for k in DETERMINISTIC:
                assert ra[f"{n}/{k}"] == rb[f"{n}/{k}"], (ra["step"], n, k)
            assert ra[f"{n}/loss"] == pytest.approx(rb[f"{n}/loss"], rel=1e-5, abs=1e-7)


def test_resume_equals_uninterrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    full = tiny_config(tmp_path / "full", tiny_llama_dir, tiny_gemma_dir, "steps=3", "checkpoint.save_every=1")
    loop.train(full)
    part = tiny_config(tmp_path / "part", tiny_llama_dir, tiny_gemma_dir, "steps=2", "checkpoint.save_every=1")
    loop.train(part)
    resumed = tiny_config(tmp_path / "part", tiny_llama_dir, tiny_gemma_dir, "steps=3", "checkpoint.save_every=1", "resume=true")
    loop.train(resumed)
    _assert_same_steps(_metrics(Path(full.run_dir)), _metrics(Path(part.run_dir)))
    pa, pb = _final_params(Path(full.run_dir), full), _final_params(Path(part.run_dir), part)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=0, atol=1e-6)


def test_resume_refuses_changed_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    loop.train(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1"))
    bad = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2", "resume=true", "exchange.delta=0.5", "rollout.n=2")
    with pytest.raises(ConfigError, match=r"exchange\.delta.*rollout\.n|rollout\.n.*exchange\.delta"):
        loop.setup(bad)


def test_existing_run_dir_needs_resume(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    loop.train(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1"))
    with pytest.raises(ConfigError, match="resume=true"):
        loop.setup(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2"))


# ----------------------------------------------------------------------------- SIGKILL

CRAFTED = "from tests.trainer.helpers import install_crafted_rewards\ninstall_crafted_rewards()"
"""The runner's default prelude: the crafted reward rule instead of grading."""

RUNNER = """
import sys, time
sys.path.insert(0, {repo!r})
if __name__ == "__main__":   # graft's worker processes start from a forkserver that imports this script
    {prelude}
    if {slow_save}:
        from graft.trainer import learner
        _save = learner.Learner.save
        def slow_save(self, path):
            _save(self, path)
            time.sleep(3)
        learner.Learner.save = slow_save
    from graft.commands.cli import main
    sys.exit(main(["train", {config!r}] + sys.argv[1:]))
"""


def _spawn(tmp_path: Path, cfg, slow_save: bool, *extra: str, prelude: str = CRAFTED,
           session: bool = False) -> subprocess.Popen:
    """``graft train`` of ``cfg`` in a runner process (``prelude``: code it runs first; ``session``: the leader of a
    process group of its own, which a test can signal as a cluster would)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg_path = tmp_path / "cfg.yaml"
    save_config(cfg, cfg_path)
    script = tmp_path / "runner.py"
    prelude = prelude.replace("\n", "\n    ")
    script.write_text(RUNNER.format(repo=str(REPO), prelude=prelude, slow_save=slow_save, config=str(cfg_path)))
    return subprocess.Popen([sys.executable, str(script), *extra], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=session)


def _wait_for(cond, proc, timeout=240):
    timeout, t0 = patient(timeout), time.time()
    while not cond():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() - t0 < timeout, "timed out waiting"
        time.sleep(0.05)


def _store_steps(run_dir: Path) -> list[int]:
    files = sorted((run_dir / "trajectories").glob("step_*.parquet"))
    steps = []
    for f in files:
        steps += sorted(set(pq.read_table(f, columns=["step"]).column("step").to_pylist()))
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("where", ["mid_step", "mid_checkpoint"])
def test_sigkill_then_resume_matches_uninterrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir, where):
    steps = 4
    ref_cfg = tiny_config(tmp_path / "ref", tiny_llama_dir, tiny_gemma_dir, f"steps={steps}", "checkpoint.save_every=1")
    ref = _spawn(tmp_path / "ref", ref_cfg, False)
    assert ref.wait(timeout=patient(600)) == 0, ref.stderr.read().decode()[-3000:]

    cfg = tiny_config(tmp_path / "kill", tiny_llama_dir, tiny_gemma_dir, f"steps={steps}", "checkpoint.save_every=1")
    run_dir = Path(cfg.run_dir)
    proc = _spawn(tmp_path / "kill", cfg, where == "mid_checkpoint")
    if where == "mid_step":
        # metrics of step 2 are written just before its checkpoint; kill once step 3 has begun
        _wait_for(lambda: (run_dir / "checkpoints" / "step_000002").exists(), proc)
        time.sleep(0.3)
    else:
        _wait_for(lambda: any(p.name.startswith(".tmp-step_000002") for p in (run_dir / "checkpoints").glob(".tmp-*"))
                  if (run_dir / "checkpoints").exists() else False, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=patient(30))

    resumed = _spawn(tmp_path / "kill", cfg, False, "resume=true")
    assert resumed.wait(timeout=patient(600)) == 0, resumed.stderr.read().decode()[-3000:]
    assert _store_steps(run_dir) == list(range(1, steps + 1))
    _assert_same_steps(_metrics(Path(ref_cfg.run_dir)), _metrics(run_dir))
    pa, pb = _final_params(Path(ref_cfg.run_dir), ref_cfg), _final_params(run_dir, cfg)
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=0, atol=1e-6)

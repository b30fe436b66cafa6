"""SIGKILL a writer of store steps and checkpoints at random points: what is visible stays loadable."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from graft.storage.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from graft.storage.lock import LOCK_NAME
from graft.storage.trajectory_store import TrajectoryStore
from tests.patience import patient


TOTAL = 400   # enough steps that the random kills (0.05-0.4 s each, doubled on a slow machine) rarely reach the end
ROWS_PER_STEP = 6 * 4  # kill_driver: PROMPTS * G


def _check_disk(run: Path) -> tuple[int, int]:
    """Every visible store step and the latest checkpoint load cleanly and agree; returns (last store step, ckpt step)."""
    store = TrajectoryStore(run / "trajectories")
    steps = store.steps() if (run / "trajectories").is_dir() else []
    assert steps == list(range(len(steps))), f"store steps not contiguous: {steps}"
    if steps:
        t = store.read()
        assert t.num_rows == ROWS_PER_STEP * len(steps)
        for s in steps:
            part = store.read(steps=[s])
            assert set(part["step"].to_pylist()) == {s} and part.num_rows == ROWS_PER_STEP
            assert part["response"][0].as_py() == f"s{s}p0g0"
    ck_path = latest_checkpoint(run)
    ck_step = -1
    if ck_path is not None:
        ck = load_checkpoint(ck_path, verify="full")
        ck_step = ck.step
        assert ck.state["sampler"] == {"pos": ck.step}
        assert float(load_file(ck.model_dirs["A"] / "model.safetensors")["w"][0, 0]) == ck.step
        opt = ck.optimizer_state("A")
        assert opt["param_groups"][0]["steps"] == ck.step + 1  # optimizer state carried across every resume
        assert ck_step <= (steps[-1] if steps else -1), "store step is written before its checkpoint"
    assert len(list_checkpoints(run)) <= 3  # keep_last=2, plus one when killed between publish and prune
    return (steps[-1] if steps else -1), ck_step


@pytest.mark.slow
def test_sigkill_at_random_points(tmp_path):
    driver = Path(__file__).with_name("kill_driver.py")
    run = tmp_path / "run"
    repo = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(driver), str(run), str(TOTAL)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=repo, env=env)

    def do(cmd: str) -> str:
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline().strip()
        assert line.startswith("done"), f"driver said {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        return line

    try:
        rng = random.Random(0)
        progress = []

        scale = [1.0]   # a slow machine writes no step within 0.4 s: the delays double until kills land mid-run

        def random_kills(times: int) -> None:
            for _ in range(times):  # a kill lands anywhere: mid store write, mid checkpoint, mid prune
                assert do(f"random {scale[0] * rng.uniform(0.05, 0.4):.3f}") in ("done killed", "done exit 0")
                progress.append(_check_disk(run))
                if progress[-1] == (-1, -1) and scale[0] < 16:
                    scale[0] *= 2

        random_kills(2)
        # a kill inside a checkpoint's model writer: the half-written folder stays a hidden .tmp
        store_before, ck_before = _check_disk(run)
        assert do("hang_ckpt") == "done killed"
        assert any(p.name.startswith(".tmp-step_") for p in (run / "checkpoints").iterdir())
        store_after, ck_after = _check_disk(run)
        assert ck_after == ck_before and store_after == ck_before + 1  # store written, checkpoint not
        # a kill after a store temp file is written but before its rename: invisible
        assert do("hang_store") == "done killed"
        assert any(p.name.endswith(".tmp") for p in (run / "trajectories").iterdir())
        assert _check_disk(run) == (ck_before, ck_before)  # resumed: the un-checkpointed step was truncated
        random_kills(4)
        assert do("finish") == "done exit 0"
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(timeout=patient(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert _check_disk(run) == (TOTAL - 1, TOTAL - 1)
    assert [p.name for p in list_checkpoints(run)] == [f"step_{TOTAL - 2:06d}", f"step_{TOTAL - 1:06d}"]
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    leftovers += [p.name for p in (run / "trajectories").iterdir() if p.name.startswith(".") and p.name != LOCK_NAME]
    assert leftovers == [], leftovers
    assert any(0 <= ck < TOTAL - 1 for _, ck in progress), f"no kill landed mid-run: {progress}"

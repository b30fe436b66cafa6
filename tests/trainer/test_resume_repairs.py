"""Issue 40: a damaged shared tokenizer file and a torn trajectory store file on resume. Either the run recovers
with one line and equals an uninterrupted one, or it stops with one line naming the file and changes nothing."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from graft.commands.cli import main
from graft.config import save_config
from graft.storage.lock import LOCK_NAME
from tests.trainer.helpers import crafted_rewards, tiny_config
from tests.trainer.test_resume import _assert_same_steps, _metrics


def _train(cfg, *overrides: str) -> int:
    path = Path(cfg.run_dir).parent / "cfg.yaml"
    save_config(cfg, path)
    return main(["train", str(path), *overrides])


def _snapshot(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != LOCK_NAME}


def _stderr_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_llama_dir, tiny_gemma_dir) -> Path:
    """An uninterrupted 3-step run."""
    tmp = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        crafted_rewards(mp)
        cfg = tiny_config(tmp, tiny_llama_dir, tiny_gemma_dir, "steps=3", "checkpoint.save_every=1")
        assert _train(cfg) == 0
    return Path(cfg.run_dir)


def _interrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch):
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2", "checkpoint.save_every=1")
    assert _train(cfg) == 0
    return cfg, Path(cfg.run_dir)


def test_a_damaged_shared_tokenizer_file_is_restored_and_the_run_resumes_identically(
        tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys, reference):
    cfg, run = _interrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch)
    shared = next((run / "checkpoints" / "tokenizers").glob("A-*")) / "tokenizer.json"
    data = bytearray(shared.read_bytes())
    data[1000:1008] = bytes(b ^ 0xFF for b in data[1000:1008])
    shared.write_bytes(bytes(data))
    capsys.readouterr()
    assert _train(cfg, "resume=true", "steps=3") == 0
    err = _stderr_lines(capsys)
    flagged = [l for l in err if l.startswith(("resume:", "warning:", "error:"))]
    assert len(flagged) == 1 and flagged[0].startswith(f"resume: restored {run / 'checkpoints'}")
    assert "/A/tokenizer.json" in flagged[0]
    assert f"resumed from {run / 'checkpoints' / 'step_000002'} at step 2" in err
    _assert_same_steps(_metrics(reference), _metrics(run))
    for m in ("A", "B"):
        weights = [(r / "checkpoints" / "step_000003" / m / "model.safetensors").read_bytes() for r in (reference, run)]
        assert weights[0] == weights[1]


def test_a_torn_store_file_reruns_from_an_earlier_checkpoint_or_is_refused(
        tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys, reference):
    cfg, run = _interrupted(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch)
    first, second = (run / "trajectories" / f"step_00000{s}.parquet" for s in (1, 2))

    # step 1 torn: no checkpoint precedes it, and a resume from step 2 cannot rewrite it
    intact = first.read_bytes()
    first.write_bytes(intact[: len(intact) // 2])
    before = _snapshot(run)
    capsys.readouterr()
    assert _train(cfg, "resume=true", "steps=3") == 2
    err = _stderr_lines(capsys)
    assert len(err) == 1 and err[0].startswith(f"error: {first}: not a readable Parquet file")
    assert "no resumable checkpoint precedes step 1" in err[0] and "nothing was changed" in err[0]
    assert _snapshot(run) == before

    # step 2 (the resume step) torn: checkpoint 1 re-runs step 2 and rewrites the file
    first.write_bytes(intact)
    second.write_bytes(second.read_bytes()[:100])
    assert _train(cfg, "resume=true", "steps=3") == 0
    err = _stderr_lines(capsys)
    warnings = [l for l in err if l.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {second}: not a readable Parquet file")
    assert f"resuming from {run / 'checkpoints' / 'step_000001'} instead" in warnings[0]
    assert f"resumed from {run / 'checkpoints' / 'step_000001'} at step 1" in err
    _assert_same_steps(_metrics(reference), _metrics(run))
    for s in (1, 2, 3):
        name = f"step_00000{s}.parquet"
        assert pq.read_table(run / "trajectories" / name).equals(pq.read_table(reference / "trajectories" / name))
    assert main(["analyze", str(run)]) == 0
    assert json.loads((run / "analysis.json").read_text())

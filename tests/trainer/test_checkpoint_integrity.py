"""Issue 10: checkpoint integrity on resume and eval; a damaged checkpoint never costs a run its history."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from graft.commands.cli import main
from graft.config import save_config
from graft.storage.lock import LOCK_NAME
from tests.trainer.helpers import crafted_rewards, tiny_config


def _train(tmp_path: Path, cfg, *overrides: str) -> int:
    path = tmp_path / "cfg.yaml"
    save_config(cfg, path)
    return main(["train", str(path), *overrides])


def _snapshot(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != LOCK_NAME}   # the lock names its latest holder


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF            # tensor data at the end of a safetensors file; the size stays the same
    path.write_bytes(bytes(data))


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _metric_rows(run_dir: Path) -> list[tuple]:
    keys = ("A/reward/mean", "B/reward/mean", "A/loss", "B/loss")
    return [(r["step"], *(r[k] for k in keys)) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _last_err_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_flipped_bytes_in_the_only_checkpoint_stop_the_resume(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch,
                                                              capsys):
    """issue 10: flipped bytes inside a checkpoint's weight file are detected on resume (sha256), one line naming the file."""
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1")
    assert _train(tmp_path, cfg) == 0
    run_dir = Path(cfg.run_dir)
    _flip_last_byte(run_dir / "checkpoints" / "step_000001" / "A" / "model.safetensors")
    before = _snapshot(run_dir)
    assert _train(tmp_path, cfg, "resume=true", "steps=2") == 2
    last = _last_err_line(capsys)
    assert last.startswith("error:") and "step_000001" in last and "A/model.safetensors" in last and "sha256" in last
    assert "resume=restart" in last
    assert _snapshot(run_dir) == before


def test_resume_from_a_corrupt_checkpoint_path_is_refused(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    """issue 10: resume=PATH verifies the sha256 of every file of that checkpoint."""
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1")
    assert _train(tmp_path, cfg) == 0
    run_dir = Path(cfg.run_dir)
    ck = run_dir / "checkpoints" / "step_000001"
    _flip_last_byte(ck / "B" / "model.safetensors")
    before = _snapshot(run_dir)
    assert _train(tmp_path, cfg, f"resume={ck}", "steps=2") == 2
    last = _last_err_line(capsys)
    assert last.startswith("error:") and "B/model.safetensors" in last and "sha256" in last
    assert _snapshot(run_dir) == before


def test_damaged_newest_checkpoint_falls_back_with_a_warning(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch,
                                                             capsys):
    """issue 10: a corrupt newest checkpoint is skipped with a one-line warning naming the file; resume continues
    from the previous intact checkpoint (the old code resumed from the corrupt one without a word)."""
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=2", "checkpoint.save_every=1")
    assert _train(tmp_path, cfg) == 0
    run_dir = Path(cfg.run_dir)
    _flip_last_byte(run_dir / "checkpoints" / "step_000002" / "B" / "model.safetensors")
    assert _train(tmp_path, cfg, "resume=true", "steps=3") == 0
    err = capsys.readouterr().err
    warning = [l for l in err.splitlines() if l.startswith("warning: skipping damaged checkpoint")]
    assert len(warning) == 1 and "step_000002" in warning[0] and "B/model.safetensors" in warning[0]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000001'} at step 1" in err
    assert _steps(run_dir) == [1, 2, 3]


def test_incomplete_only_checkpoint_keeps_the_history(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    """issue 10: when the only checkpoint is incomplete, resume=true stops with an error naming the missing file
    and deletes nothing (the old code printed "no checkpoint; starting from scratch" and deleted metrics,
    audit log and trajectories)."""
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1")
    assert _train(tmp_path, cfg) == 0
    run_dir = Path(cfg.run_dir)
    (run_dir / "checkpoints" / "step_000001" / "A" / "model.safetensors").unlink()
    before = _snapshot(run_dir)
    assert any(k.startswith("trajectories/") for k in before) and "metrics.jsonl" in before
    assert _train(tmp_path, cfg, "resume=true", "steps=2") == 2
    last = _last_err_line(capsys)
    assert last.startswith("error:") and "A/model.safetensors is missing" in last
    assert "resume=restart" in last and "another run_dir" in last
    assert _snapshot(run_dir) == before


def test_metrics_without_checkpoint_are_set_aside_and_the_run_starts_over(tmp_path, tiny_llama_dir, tiny_gemma_dir,
                                                                           monkeypatch, capsys):
    """issue 40 (was issue 10's refusal): a run killed before its first save has metrics but no checkpoint.
    resume=true starts it afresh with one line, moving the earlier attempt's files aside (nothing deleted), so
    a requeue loop passing resume=true always recovers; the new run equals a fresh one."""
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "checkpoint.save_final=false")
    assert _train(tmp_path, cfg) == 0
    run_dir = Path(cfg.run_dir)
    assert not (run_dir / "checkpoints").exists()
    before = {k: v for k, v in _snapshot(run_dir).items() if k != "config.yaml"}
    capsys.readouterr()
    assert _train(tmp_path, cfg, "resume=true", "steps=2", "checkpoint.save_final=true") == 0
    aside = run_dir / "set_aside" / "attempt_1"
    notice = [l for l in capsys.readouterr().err.splitlines() if l.startswith("resume:")]
    assert notice == [f"resume: no intact checkpoint in {run_dir}; moved the earlier attempt's files to {aside}; "
                      "starting from scratch"]
    assert {k: v for k, v in _snapshot(aside).items()} == before
    assert _steps(run_dir) == [1, 2] and (run_dir / "checkpoints" / "step_000002").is_dir()

    (tmp_path / "fresh").mkdir()
    fresh = tiny_config(tmp_path / "fresh", tiny_llama_dir, tiny_gemma_dir, "steps=2")
    assert _train(tmp_path / "fresh", fresh) == 0
    assert _metric_rows(run_dir) == _metric_rows(Path(fresh.run_dir))


def test_eval_of_a_corrupt_checkpoint_folder_names_the_file(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch,
                                                            capsys):
    """issue 10: `graft eval` of a checkpoint model folder verifies its files against the manifest's sha256."""
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1")
    assert _train(tmp_path, cfg) == 0
    model_dir = Path(cfg.run_dir) / "checkpoints" / "step_000001" / "A"
    _flip_last_byte(model_dir / "model.safetensors")
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "q", "problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    rc = main(["eval", "--model", str(model_dir), "--data", f"d={data}", "--n", "1", "--repeats", "1",
               "--max-new-tokens", "2", "--verify-workers", "0", "--no-progress", "--out", str(tmp_path / "ev")])
    last = _last_err_line(capsys)
    assert rc == 2 and "A/model.safetensors" in last and "sha256" in last
    assert not (tmp_path / "ev").exists()

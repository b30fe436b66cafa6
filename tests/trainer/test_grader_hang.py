"""A grader that hangs stops the run with a clear message and a non-zero exit, writing no step."""
from __future__ import annotations

from graft.commands.cli import main
from graft.config import save_config
from graft.reward.grader import Grader
from graft.trainer import loop
from tests.trainer.helpers import tiny_config


def test_hanging_grader_stops_with_clear_error(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch, capsys):
    hang = "tests.reward.grader_hooks:hang_always"     # replaces whatever reward.domain picks
    monkeypatch.setattr(loop, "make_grader", lambda r: Grader(r.timeout_s, r.workers, verify_fn=hang))
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "steps=1", "reward.workers=1", "reward.timeout_s=0.3",
                      "batch_prompts=2", "rollout.n=2", "update.num_minibatches=1")
    path = tmp_path / "cfg.yaml"
    save_config(cfg, path)
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "grader appears to hang" in err and "reward.timeout_s=0.3" in err
    run_dir = tmp_path / "run"
    assert not (run_dir / "metrics.jsonl").exists() or (run_dir / "metrics.jsonl").read_text() == ""
    assert not list((run_dir / "trajectories").glob("step_*.parquet")) if (run_dir / "trajectories").exists() else True
    assert not (run_dir / "checkpoints").exists() or not list((run_dir / "checkpoints").glob("step_*"))

"""Issue 22 §5, the run side: `checkpoint.keep_optimizer=none` writes weights only, exports and
evaluates, and a resume from it is refused in one line that names the reason."""
from __future__ import annotations

from pathlib import Path

from graft.commands.cli import main
from graft.config import save_config
from graft.storage.checkpoint import list_checkpoints, load_checkpoint
from graft.trainer import loop
from tests.trainer.helpers import crafted_rewards, tiny_config


def test_weights_only_run_exports_and_refuses_to_resume(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch,
                                                         capsys):
    crafted_rewards(monkeypatch)
    cfg = tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, "checkpoint.save_every=1", "checkpoint.keep_last=2",
                      "checkpoint.keep_optimizer=none")
    loop.train(cfg)
    run = Path(cfg.run_dir)
    cks = list_checkpoints(run)
    assert [load_checkpoint(p).step for p in cks] == [1, 2]
    assert not list(run.rglob("optimizer.pt"))
    inodes = {p.stat().st_ino for p in (run / "checkpoints").rglob("tokenizer.json")}
    assert len(inodes) == 2                                                 # one copy per model, not per step
    assert main(["export", str(run), "--model", "B", str(tmp_path / "B")]) == 0
    assert (tmp_path / "B" / "tokenizer.json").is_file() and (tmp_path / "B" / "model.safetensors").is_file()
    save_config(cfg, tmp_path / "cfg.yaml")
    capsys.readouterr()
    before = (run / "metrics.jsonl").read_bytes()
    assert main(["train", str(tmp_path / "cfg.yaml"), "resume=true", "steps=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot resume from {cks[-1]}: it holds weights only")
    assert "checkpoint.keep_optimizer=none" in err[0]
    assert (run / "metrics.jsonl").read_bytes() == before

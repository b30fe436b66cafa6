"""A run of the code domain on the tiny models: it refuses to start without bubblewrap unless opted in (one line,
before any model loads), records the sandbox it grades in, and logs the held-out detector every step."""
from __future__ import annotations

import json

import pytest

from graft.commands.cli import main
from graft.config import save_config
from graft.reward import sandbox
from tests.trainer.helpers import tiny_config

pytestmark = pytest.mark.slow

CODE = ("data.train=code_task", "data.code_task.num_prompts=8", "reward.domain=code", "reward.workers=1", "steps=1",
        "batch_prompts=2", "rollout.n=2", "update.num_minibatches=1", "rollout.max_new_tokens=5")


def _config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *overrides):
    path = tmp_path / "cfg.yaml"
    save_config(tiny_config(tmp_path, tiny_llama_dir, tiny_gemma_dir, *CODE, *overrides), path)
    return path


def test_a_code_run_without_bubblewrap_stops_before_loading_models(tmp_path, tiny_llama_dir, tiny_gemma_dir, monkeypatch,
                                                                    capsys):
    monkeypatch.setattr(sandbox, "_FORCE", None)
    monkeypatch.setattr(sandbox, "_detected", {"bwrap": (False, "bwrap is not installed")})
    assert main(["train", str(_config(tmp_path, tiny_llama_dir, tiny_gemma_dir))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: reward.domain=code runs model-written programs and needs bubblewrap")
    assert not (tmp_path / "run").exists()   # nothing written, nothing loaded


def test_a_code_run_records_its_sandbox_and_logs_the_detector(tmp_path, tiny_llama_dir, tiny_gemma_dir, capsys):
    if not sandbox._probe("bwrap")[0]:
        pytest.skip("bwrap is not usable here")
    assert main(["train", str(_config(tmp_path, tiny_llama_dir, tiny_gemma_dir))]) == 0
    head = (tmp_path / "run" / "config.yaml").read_text().splitlines()
    assert "# grading: code programs run in the bwrap sandbox (no network, read-only system, no graft, a call per process)" in head
    assert "grading: code programs run in the bwrap sandbox" in capsys.readouterr().err
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"A/rewarded/holdout_fail", "B/rewarded/holdout_fail"} <= set(row)

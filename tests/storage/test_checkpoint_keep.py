"""Checkpoint pruning policies: optimizer state only in the newest checkpoint; protected (best) steps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graft.storage.checkpoint import (CheckpointError, drop_optimizer_state, list_checkpoints, load_checkpoint,
                                      save_checkpoint)


def _opt(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()
    opt.zero_grad()
    return opt


def _save(run: Path, step: int, model, opt, **kw) -> Path:
    return save_checkpoint(run, step, {"A": model.save_pretrained}, {"A": opt}, {"sampler": {}},
                           {"models": [{"name": "A"}]}, **kw)


def _steps(run: Path) -> list[int]:
    return [int(p.name.split("_")[1]) for p in list_checkpoints(run)]


def test_keep_optimizer_last_strips_older_checkpoints_consistently(tmp_path, tiny_model):
    opt = _opt(tiny_model)
    for step in (1, 2, 3):
        _save(tmp_path, step, tiny_model, opt, keep_last=3, keep_optimizer="last")
    assert _steps(tmp_path) == [1, 2, 3]
    for step in (1, 2):
        path = tmp_path / "checkpoints" / f"step_{step:06d}"
        manifest = json.loads((path / "manifest.json").read_text())
        assert not (path / "A" / "optimizer.pt").exists()
        assert manifest["optimizers"] == [] and "A/optimizer.pt" not in manifest["files"]
        ck = load_checkpoint(path, verify="full")          # still complete and intact
        assert (path / "A" / "model.safetensors").is_file() and ck.step == step
        with pytest.raises(CheckpointError, match="no optimizer state for model 'A'"):
            ck.optimizer_state("A")
    newest = load_checkpoint(tmp_path / "checkpoints" / "step_000003", verify="full")
    assert newest.optimizer_names == ["A"] and "exp_avg" in newest.optimizer_state("A")["state"][0]
    assert drop_optimizer_state(tmp_path / "checkpoints" / "step_000001") == []   # nothing left to drop


def test_keep_optimizer_all_keeps_every_optimizer(tmp_path, tiny_model):
    opt = _opt(tiny_model)
    for step in (1, 2):
        _save(tmp_path, step, tiny_model, opt, keep_last=2)
    assert all((p / "A" / "optimizer.pt").is_file() for p in list_checkpoints(tmp_path))


def test_keep_steps_survive_pruning(tmp_path, tiny_model):
    opt = _opt(tiny_model)
    plain, protected = tmp_path / "plain", tmp_path / "protected"
    for step in (1, 2, 3, 4):
        _save(plain, step, tiny_model, opt, keep_last=2)
        _save(protected, step, tiny_model, opt, keep_last=2, keep_steps={1})
    assert _steps(plain) == [3, 4]
    assert _steps(protected) == [1, 3, 4]


def test_a_checkpoint_held_by_a_reader_survives_pruning_until_released(tmp_path, tiny_model):
    """`graft eval --model latest` of a run still training: the checkpoint it evaluates is held
    (:func:`reading`) and pruning leaves it alone (it used to vanish mid-load, and eval read the path as a hub id:
    "Repo id must be in the form 'repo_name'"); released, the next save prunes it. A checkpoint pruned before it
    could be held is a one-line CheckpointError (eval then chooses again)."""
    from graft.storage.checkpoint import reading

    opt = _opt(tiny_model)
    first = _save(tmp_path, 1, tiny_model, opt, keep_last=1)
    with reading(first) as held:
        assert held == first
        _save(tmp_path, 2, tiny_model, opt, keep_last=1)
        assert _steps(tmp_path) == [1, 2]
        load_checkpoint(first, verify="full")          # whole while held
    _save(tmp_path, 3, tiny_model, opt, keep_last=1)
    assert _steps(tmp_path) == [3] and not first.exists()
    with pytest.raises(CheckpointError, match=r"step_000001: no longer there \(pruned"):
        with reading(first):
            pass

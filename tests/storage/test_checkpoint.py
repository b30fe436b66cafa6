"""Checkpoints: atomic publish, pruning, round-trip of weights / optimizer / RNG, clear errors."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from graft.storage.checkpoint import (
    CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint, remove_checkpoints_after, rng_state,
    save_checkpoint, set_rng_state,
)


def _opt(model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return opt


def _save(run: Path, step: int, model, opt=None, **kw) -> Path:
    return save_checkpoint(run, step, {"A": model.save_pretrained}, {"A": opt} if opt else {},
                           {"sampler": {"epoch": 1, "pos": step}}, {"seed": 0, "models": [{"name": "A"}]}, **kw)


def _visible(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith("."))


def test_round_trip_weights_optimizer_rng_config(tmp_path, tiny_model):
    from transformers import AutoModelForCausalLM

    opt = _opt(tiny_model)
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    path = _save(tmp_path, 10, tiny_model, opt)
    expected = (torch.rand(4), random.random(), np.random.rand())

    assert path == tmp_path / "checkpoints" / "step_000010"
    assert (path / "A" / "model.safetensors").is_file()
    manifest = json.loads((path / "manifest.json").read_text())
    assert "A/model.safetensors" in manifest["files"] and "state.pt" in manifest["files"]

    ck = load_checkpoint(path, verify="full")
    assert ck.step == 10 and ck.state["step"] == 10 and ck.state["sampler"] == {"epoch": 1, "pos": 10}
    assert ck.config == {"seed": 0, "models": [{"name": "A"}]}
    loaded = AutoModelForCausalLM.from_pretrained(ck.model_dirs["A"])
    for (n, a), (_, b) in zip(tiny_model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n

    opt2 = torch.optim.AdamW(loaded.parameters(), lr=1e-3)
    opt2.load_state_dict(ck.optimizer_state("A"))
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys()
    assert all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)

    torch.rand(10), random.random(), np.random.rand()  # move every generator on
    set_rng_state(ck.rng)
    assert torch.equal(torch.rand(4), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]

    with pytest.raises(CheckpointError, match="no optimizer state for model 'B'"):
        ck.optimizer_state("B")


def test_rng_state_round_trip_without_checkpoint():
    s = rng_state()
    a = (torch.randn(3), random.random(), np.random.randn())
    set_rng_state(s)
    b = (torch.randn(3), random.random(), np.random.randn())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


def test_writer_crash_leaves_previous_checkpoint_and_nothing_partial(tmp_path, tiny_model):
    good = _save(tmp_path, 1, tiny_model)

    def crashing(folder: Path) -> None:
        tiny_model.save_pretrained(folder)
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        save_checkpoint(tmp_path, 2, {"A": crashing}, {}, {}, {})
    assert _visible(tmp_path) == ["step_000001"]
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "checkpoints").iterdir())
    assert latest_checkpoint(tmp_path) == good
    assert load_checkpoint(tmp_path).step == 1  # a run folder resolves to its latest checkpoint


def test_leftover_tmp_from_killed_writer_is_ignored_and_cleaned(tmp_path, tiny_model):
    _save(tmp_path, 1, tiny_model)
    dead = tmp_path / "checkpoints" / ".tmp-step_000002-999999999"  # no such pid
    (dead / "A").mkdir(parents=True)
    (dead / "A" / "model.safetensors").write_bytes(b"half")
    assert latest_checkpoint(tmp_path).name == "step_000001"
    _save(tmp_path, 2, tiny_model)
    assert not dead.exists()
    assert latest_checkpoint(tmp_path).name == "step_000002"


def test_keep_last_prunes_oldest(tmp_path, tiny_model):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, tiny_model, keep_last=2)
    assert _visible(tmp_path) == ["step_000003", "step_000004"]
    _save(tmp_path, 5, tiny_model, keep_last=0)  # 0 keeps everything
    assert _visible(tmp_path) == ["step_000003", "step_000004", "step_000005"]
    assert [p.name for p in list_checkpoints(tmp_path)] == _visible(tmp_path)


def test_resave_same_step_replaces_it(tmp_path, tiny_model):
    _save(tmp_path, 3, tiny_model)
    save_checkpoint(tmp_path, 3, {"A": tiny_model.save_pretrained}, {}, {"marker": 2}, {})
    assert _visible(tmp_path) == ["step_000003"]
    assert load_checkpoint(tmp_path / "checkpoints" / "step_000003").state["marker"] == 2


def test_kill_between_replace_renames_falls_back_to_old_copy(tmp_path, tiny_model):
    path = _save(tmp_path, 3, tiny_model)
    old = path.parent / ".old-step_000003-999999999"
    os.rename(path, old)  # what a kill between the two renames leaves
    assert latest_checkpoint(tmp_path) == old
    _save(tmp_path, 4, tiny_model, keep_last=5)
    assert _visible(tmp_path) == ["step_000003", "step_000004"]  # restored, then the new one


def test_remove_checkpoints_after(tmp_path, tiny_model):
    for step in (1, 2, 3):
        _save(tmp_path, step, tiny_model, keep_last=0)
    gone = remove_checkpoints_after(tmp_path, 1)
    assert [p.name for p in gone] == ["step_000002", "step_000003"]
    assert _visible(tmp_path) == ["step_000001"]


def test_missing_or_truncated_shard_is_a_clear_error(tmp_path, tiny_model):
    path = _save(tmp_path, 1, tiny_model)
    shard = path / "A" / "model.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"A/model\.safetensors has \d+ bytes"):
        load_checkpoint(path)
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"A/model\.safetensors is missing"):
        load_checkpoint(path)
    assert latest_checkpoint(tmp_path) is None  # an incomplete checkpoint is never "latest"


def test_flipped_byte_caught_by_full_verify(tmp_path, tiny_model):
    path = _save(tmp_path, 1, tiny_model)
    shard = path / "A" / "model.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    load_checkpoint(path)  # size check passes
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path, verify="full")


def test_other_load_errors(tmp_path, tiny_model):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        load_checkpoint(tmp_path / "empty")
    path = _save(tmp_path / "run", 1, tiny_model)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_checkpoint(tmp_path / "run")


def test_unpicklable_state_is_refused_at_save(tmp_path, tiny_model):
    class Custom:
        pass

    for bad in (Custom(), Path("/x")):  # unpicklable; picklable but refused by weights_only
        with pytest.raises(CheckpointError, match="plain data"):
            save_checkpoint(tmp_path, 1, {"A": tiny_model.save_pretrained}, {}, {"obj": bad}, {})
    assert latest_checkpoint(tmp_path) is None
    assert not any((tmp_path / "checkpoints").iterdir())


def test_lora_adapter_folder_round_trip(tmp_path, tiny_model):
    import copy

    from peft import LoraConfig, PeftModel, get_peft_model

    peft_model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.5)
    path = save_checkpoint(tmp_path, 1, {"A": peft_model.save_pretrained}, {}, {}, {})
    assert (path / "A" / "adapter_model.safetensors").is_file()
    ck = load_checkpoint(path, verify="full")
    reloaded = PeftModel.from_pretrained(copy.deepcopy(tiny_model), ck.model_dirs["A"])
    x = torch.tensor([[1, 2, 3]])
    peft_model.eval(), reloaded.eval()
    assert torch.allclose(peft_model(x).logits, reloaded(x).logits)


def test_invalid_model_name(tmp_path):
    with pytest.raises(CheckpointError, match="invalid model name"):
        save_checkpoint(tmp_path, 1, {"state.pt": lambda f: None}, {}, {}, {})

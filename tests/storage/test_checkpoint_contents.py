"""Issue 22 §5, the storage side: weights-only checkpoints (``keep_optimizer="none"``), what a checkpoint
weighs (AdamW state = twice the fp32 weights), and tokenizer bytes stored once per run (hard links), not per step."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.storage.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint, verify_model_files
from tests.storage.test_checkpoint_keep import _opt


def _writer(model, tok):
    def write(folder: Path) -> None:   # what Policy.save writes: weights and tokenizer
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder))
    return write


def _save(run: Path, step: int, writer, opt, **kw) -> Path:
    return save_checkpoint(run, step, {"A": writer}, {"A": opt}, {"sampler": {}}, {"models": [{"name": "A"}]}, **kw)


def test_weights_only_writes_no_optimizer_and_weighs_a_third(tmp_path, tiny_model):
    opt = _opt(tiny_model)
    full = _save(tmp_path / "full", 1, tiny_model.save_pretrained, opt)
    lean = _save(tmp_path / "lean", 1, tiny_model.save_pretrained, opt, keep_optimizer="none")
    assert not (lean / "A" / "optimizer.pt").exists()
    ck = load_checkpoint(lean, verify="full")
    assert ck.optimizer_names == [] and "A/optimizer.pt" not in ck.manifest["files"]
    with pytest.raises(CheckpointError, match="no optimizer state for model 'A'"):
        ck.optimizer_state("A")
    # fp32 AdamW keeps exp_avg and exp_avg_sq, 4 + 4 bytes per parameter, against 4 for the weights:
    # docs/run-folder.md's 1.6 GB weights + 3.2 GB AdamW for the default pair. P = 2 * 64 * 16 (embedding + head) + layer.
    P = sum(p.numel() for p in tiny_model.parameters())
    weights = (full / "A" / "model.safetensors").stat().st_size
    adamw = (full / "A" / "optimizer.pt").stat().st_size
    assert 4 * P <= weights < 4 * P + 4096                  # safetensors: the fp32 values + a JSON header
    assert 8 * P <= adamw < 8 * P + 64 * 1024               # two fp32 moments + torch.save's framing
    with pytest.raises(ValueError, match="valid: all, last, none"):
        _save(tmp_path / "bad", 1, tiny_model.save_pretrained, opt, keep_optimizer="some")


def test_tokenizer_bytes_are_stored_once_and_every_step_stays_a_full_folder(tmp_path, tiny_model, tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    opt = _opt(tiny_model)
    steps = [_save(tmp_path, s, _writer(tiny_model, tok), opt, keep_last=3) for s in (1, 2, 3)]
    store = sorted((tmp_path / "checkpoints" / "tokenizers").iterdir())
    assert len(store) == 1 and store[0].name.startswith("A-")
    for step in steps:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            assert (step / "A" / f).samefile(store[0] / f)         # a hard link, not a copy
        assert "A/tokenizer.json" in json.loads((step / "manifest.json").read_text())["files"]   # hashed as before
        load_checkpoint(step, verify="full")
    # a step folder is still a complete Hugging Face folder
    text = "Problem: What is 12 + 30?\nSolution: \\boxed{42}"
    loaded = AutoTokenizer.from_pretrained(str(steps[-1] / "A"))
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    # on disk: one tokenizer.json inode for the three steps and the store (4 names)
    paths = list((tmp_path / "checkpoints").rglob("tokenizer.json"))
    assert len(paths) == 4 and len({p.stat().st_ino for p in paths}) == 1
    # pruning step 1 leaves the others intact; a half-written copy of a killed writer is cleaned up
    dead = tmp_path / "checkpoints" / "tokenizers" / ".tmp-A-0123456789abcdef-999999999"
    dead.mkdir()
    _save(tmp_path, 4, _writer(tiny_model, tok), opt, keep_last=3)
    assert not dead.exists()
    assert [load_checkpoint(p, verify="full").step for p in list_checkpoints(tmp_path)] == [2, 3, 4]

    # one flipped byte in the stored copy is named by every step's sha256 check
    f = store[0] / "tokenizer.json"
    data = bytearray(f.read_bytes())
    data[100] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="A/tokenizer.json does not match its sha256"):
        verify_model_files(steps[1] / "A")
    # the next save finds the stored copy damaged and writes a fresh one for its own step
    step5 = _save(tmp_path, 5, _writer(tiny_model, tok), opt, keep_last=5)
    load_checkpoint(step5, verify="full")
    assert not (step5 / "A" / "tokenizer.json").samefile(steps[1] / "A" / "tokenizer.json")

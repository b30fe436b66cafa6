"""Issue 22 §5, the storage side: weights-only checkpoints (``keep_optimizer="none"``), what a checkpoint
weighs (AdamW state = twice the fp32 weights), and tokenizer files written once per run, not per step."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graft.config import ModelConfig
from graft.policy.loading import load_tokenizer
from graft.storage.checkpoint import (CheckpointError, TOKENIZER_REF, list_checkpoints, load_checkpoint,
                                      save_checkpoint, tokenizer_folder, verify_model_files)


def _opt(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    opt.step()
    opt.zero_grad()
    return opt


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
    # the README's 1.6 GB weights + 3.2 GB AdamW for the default pair. P = 2 * 64 * 16 (embedding + head) + layer.
    P = sum(p.numel() for p in tiny_model.parameters())
    weights = (full / "A" / "model.safetensors").stat().st_size
    adamw = (full / "A" / "optimizer.pt").stat().st_size
    assert 4 * P <= weights < 4 * P + 4096                  # safetensors: the fp32 values + a JSON header
    assert 8 * P <= adamw < 8 * P + 64 * 1024               # two fp32 moments + torch.save's framing
    with pytest.raises(CheckpointError, match="'all', 'last' or 'none'"):
        _save(tmp_path / "bad", 1, tiny_model.save_pretrained, opt, keep_optimizer="some")


def test_tokenizer_is_written_once_and_still_verified_and_loaded(tmp_path, tiny_model, tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    opt = _opt(tiny_model)
    steps = [_save(tmp_path, s, _writer(tiny_model, tok), opt, keep_last=3) for s in (1, 2, 3)]
    shared = sorted((tmp_path / "checkpoints" / "tokenizers").iterdir())
    assert len(shared) == 1 and shared[0].name.startswith("A-") and (shared[0] / "tokenizer.json").is_file()
    for step in steps:
        assert not (step / "A" / "tokenizer.json").exists() and (step / "A" / TOKENIZER_REF).is_file()
        assert tokenizer_folder(step / "A").resolve() == shared[0].resolve()
        manifest = json.loads((step / "manifest.json").read_text())
        assert manifest["tokenizers"]["A"]["folder"] == f"tokenizers/{shared[0].name}"
        load_checkpoint(step, verify="full")
    text = "Problem: What is 12 + 30?\nSolution: \\boxed{42}"
    loaded = load_tokenizer(ModelConfig(path=tiny_llama_dir), weights_from=str(steps[-1] / "A"))
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    # the checkpoints of the run now hold one copy of tokenizer.json, not three
    copies = [p for p in (tmp_path / "checkpoints").rglob("tokenizer.json")]
    assert len(copies) == 1

    # the shared files are covered by every step's sha256: one flipped byte is named
    f = shared[0] / "tokenizer.json"
    data = bytearray(f.read_bytes())
    data[100] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="tokenizer.json does not match its sha256.*tokenizer of model A"):
        verify_model_files(steps[0] / "A")
    with pytest.raises(CheckpointError, match="tokenizer.json does not match its sha256"):
        load_checkpoint(steps[0], verify="full")
    # a damaged shared copy is rewritten by the next save, so later steps are intact again
    _save(tmp_path, 4, _writer(tiny_model, tok), opt, keep_last=4)
    load_checkpoint(tmp_path / "checkpoints" / "step_000004", verify="full")
    assert [load_checkpoint(p).step for p in list_checkpoints(tmp_path)] == [1, 2, 3, 4]

"""Issue 40, the storage side: a damaged tokenizer file shared by every checkpoint is rewritten in place from an
identical source (never from different bytes); a torn trajectory store file is found from its footer."""
from __future__ import annotations

from pathlib import Path

import pytest

from graft.storage.checkpoint import CheckpointError, load_checkpoint, restore_tokenizer_files
from graft.storage.trajectory_store import TrajectoryStore
from tests.storage.test_checkpoint_contents import _save, _writer
from tests.storage.test_checkpoint_keep import _opt


def _flip_8_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(100, 108):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_shared_tokenizer_file_is_rewritten_in_place_only_from_identical_bytes(tmp_path, tiny_model,
                                                                                         tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    run = tmp_path / "run"
    steps = [_save(run, s, _writer(tiny_model, tok), _opt(tiny_model), keep_last=3) for s in (1, 2)]
    shared = next((run / "checkpoints" / "tokenizers").iterdir()) / "tokenizer.json"
    _flip_8_bytes(shared)
    for step in steps:
        with pytest.raises(CheckpointError, match="A/tokenizer.json does not match its sha256"):
            load_checkpoint(step, verify="full")

    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_bytes(shared.read_bytes())   # the right size, not the recorded bytes
    assert restore_tokenizer_files(run, lambda name: other) == []
    assert restore_tokenizer_files(run, lambda name: None) == []
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(steps[-1], verify="full")

    src = tmp_path / "src"
    tok.save_pretrained(str(src))
    notices = restore_tokenizer_files(run, lambda name: src if name == "A" else None)
    assert len(notices) == 1 and notices[0].startswith("resume: restored ") and "tokenizer.json" in notices[0]
    for step in steps:
        load_checkpoint(step, verify="full")
        assert (step / "A" / "tokenizer.json").samefile(shared)   # mended in place: still one inode
    assert restore_tokenizer_files(run, lambda name: pytest.fail("an intact run needs no source")) == []


def test_first_torn_names_the_lowest_torn_file_up_to_a_step(tmp_path, group_factory):
    store = TrajectoryStore(tmp_path / "traj", run_id="r")
    for step in (1, 2, 3, 4):
        store.write_step(step, 0, [group_factory("A", "p1", [0, 1, 0, 1], step)], {"A": "tok"})
    assert store.first_torn(4) is None
    for step in (2, 4):
        path = store.path_for(step)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    step, why = store.first_torn(4)
    assert step == 2 and why.startswith(f"{store.path_for(2)}: not a readable Parquet file")
    assert store.first_torn(1) is None

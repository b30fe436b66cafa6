"""Tiny random-weight models with the REAL tokenizers of the embedded pair, for tests.

``build_tiny_model("llama", out)`` writes a 2-layer Llama (hidden 32) with SmolLM2's 49k BPE
tokenizer, ``build_tiny_model("gemma3", out)`` a 2-layer Gemma-3 text model with Gemma-3's
262k SentencePiece tokenizer. Both tie their embeddings and keep the real vocabulary size,
so every tokenizer and vocabulary-size path (chunked log-softmax over 262k, BOS handling,
re-tokenization between the two) is exercised in seconds. The tiny Gemma uses a sliding
window of 4 tokens on its first layer and ``final_logit_softcapping=30`` (the real
Gemma-3-270M has none) so that the sliding-window cache and the softcapping path are tested.

The tokenizers are extracted from the GGUF files once and cached under
``~/.cache/graft/tokenizers`` (see :func:`graft.policy.loading.gguf_tokenizer_folder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, LlamaConfig

from graft.policy.loading import gguf_tokenizer_folder, resolve_model_path

EMBEDDED_OF = {"llama": "embedded:smollm2-135m-instruct", "gemma3": "embedded:gemma3-270m"}

TinyKind = Literal["llama", "gemma3"]


def tiny_shape(kind: TinyKind) -> dict[str, Any]:
    """The tests' tiny ``kind`` model's shape (config keys): 2 layers of width 32; Gemma-3's first layer slides
    over a window of 4."""
    if kind == "llama":
        return dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8
        )
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )


def special_token_ids(tok: Any) -> dict[str, Any]:
    """``bos_token_id``, ``eos_token_id`` and ``pad_token_id`` (the eos when the tokenizer has no pad) of ``tok``."""
    return dict(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )


def tiny_tokenizer_folder(kind: TinyKind) -> Path:
    """Cached folder holding the real tokenizer of the embedded model of architecture ``kind``."""
    if kind not in EMBEDDED_OF:
        raise ValueError(f"kind must be one of {sorted(EMBEDDED_OF)}, got {kind!r}")
    folder, gguf = resolve_model_path(EMBEDDED_OF[kind])
    assert gguf is not None, EMBEDDED_OF[kind]  # an embedded model is always one GGUF file
    return gguf_tokenizer_folder(Path(folder) / gguf)


def build_tiny_model(kind: TinyKind, out_dir: str | Path, seed: int = 0) -> str:
    """Save a tiny random model + the real tokenizer of ``kind`` to ``out_dir``; returns the folder."""

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_folder(kind)))
    vocab = len(tok)
    special = special_token_ids(tok)
    config: LlamaConfig | Gemma3TextConfig
    if kind == "llama":
        config = LlamaConfig(
            vocab_size=vocab,
            **tiny_shape("llama"),
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            rms_norm_eps=1e-5,
            initializer_range=0.2,
            **special,
        )
    else:
        config = Gemma3TextConfig(
            vocab_size=vocab,
            **tiny_shape("gemma3"),
            max_position_embeddings=4096,
            final_logit_softcapping=30.0,
            tie_word_embeddings=True,
            initializer_range=0.2,
            **special,
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return str(out)

"""The length check of a prompt against a model's positions (graft/policy/context.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from graft.config import ConfigError
from graft.policy.context import check_context, max_token_chars
from graft.types import Prompt


class _Codec:
    """Tokens: one per 2 characters; the vocabulary's longest piece has 3 characters."""

    def __init__(self):
        self.tokenizer = SimpleNamespace(get_vocab=lambda: {"a": 0, "ab": 1, "abc": 2})
        self.encoded = []

    def encode_prompt(self, problem, messages=None):
        text = problem if messages is None else "".join(m["content"] for m in messages)
        self.encoded.append(len(text))
        return [0] * (len(text) // 2)


def texts(*problems):
    return [Prompt(f"p{i}", problem, "1") for i, problem in enumerate(problems)]


def test_a_huge_problem_is_refused_without_tokenizing_it():
    """100 positions and pieces of at most 3 characters: 301 characters are at least ceil(301 / 3) = 101 tokens,
    refused unread (a 50 MB row took 146 s and 18 GB to tokenize before the refusal; now the refusal is at once)."""
    codec = _Codec()
    assert max_token_chars(codec.tokenizer) == 3
    with pytest.raises(ConfigError, match=r"a problem of 301 characters .* is at least 101 tokens \(model A's longest "
                                          r"token is 3 characters\), beyond its max_position_embeddings=100; remove"):
        check_context("A", codec, 100, texts("x" * 301, "short"), 6, "rollout.max_new_tokens")
    assert codec.encoded == []
    # 300 characters might fit (at least 100 tokens): tokenized, 150 tokens + 6 > 100, refused as before
    with pytest.raises(ConfigError, match=r"the longest prompt \(150 tokens\) plus 6 new tokens is 156 positions"):
        check_context("A", codec, 100, texts("x" * 300, "short"), 6, "rollout.max_new_tokens")
    check_context("A", codec, 100, texts("x" * 180), 6, "rollout.max_new_tokens")   # 90 + 6 <= 100


def test_a_conversation_counts_every_message():
    """Two messages of 160 characters each: 320 characters, at least ceil(320 / 3) = 107 tokens > 100, refused
    unread although its last user message alone (160 characters) might fit."""
    codec = _Codec()
    talk = ({"role": "system", "content": "s" * 160}, {"role": "user", "content": "u" * 160})
    with pytest.raises(ConfigError, match=r"a problem of 320 characters .* is at least 107 tokens"):
        check_context("A", codec, 100, [Prompt("c", "u" * 160, "1", talk)], 6, "rollout.max_new_tokens")
    assert codec.encoded == []

"""Does the longest prompt plus the generation budget fit a model's positions?

Checked once the models are loaded -- by training (``rollout.max_new_tokens``, ``eval.max_new_tokens``),
``graft eval`` and the probe -- before anything is sampled: a model asked to write past
``max_position_embeddings`` generates for minutes, exhausts memory or writes garbage past its trained
positions.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from graft.config import ConfigError
from graft.types import Prompt


def max_positions(model_config: Any) -> int | None:
    """``max_position_embeddings`` of a transformers config (or of its text config, for a multimodal
    model); ``None`` when it has none (such a model is not checked)."""
    for c in (model_config, getattr(model_config, "text_config", None)):
        v = getattr(c, "max_position_embeddings", None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def distinct(prompts: Iterable[Prompt]) -> list[Prompt]:
    """``prompts`` with each problem (text, or conversation) once."""
    seen = {(p.problem, json.dumps(p.messages, sort_keys=True, default=str) if p.messages else None): p for p in prompts}
    return list(seen.values())


def prompt_chars(p: Prompt) -> int:
    """Characters of ``p``'s problem text, or of all its messages' contents."""
    return sum(len(str(m.get("content", ""))) for m in p.messages) if p.messages else len(p.problem)


def longest_prompt(codec: Any, prompts: Iterable[Prompt]) -> int:
    """Tokens of the longest rendered prompt (template, worked examples, instruction) of ``prompts``."""
    return max((len(codec.encode_prompt(p.problem, p.messages)) for p in distinct(prompts)), default=0)


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for: its longest vocabulary entry (a byte-level piece
    has a symbol per byte, a SentencePiece one a symbol per character). A text of c characters is at least
    c / this many tokens, which says a text does not fit without tokenizing it."""
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1) or 1


def check_context(name: str, codec: Any, limit: int | None, prompts: Iterable[Prompt], max_new_tokens: int, field: str) -> None:
    """Raise a one-line :class:`ConfigError` when the longest prompt of ``prompts`` (in ``codec``'s
    tokens) plus ``max_new_tokens`` (the value of ``field``) exceeds ``limit`` positions of model ``name``. A problem
    longer than ``limit`` tokens of the longest piece is refused without tokenizing it (a 50 MB row took
    minutes and gigabytes to tokenize before this refusal)."""
    if limit is None:
        return
    prompts = distinct(prompts)
    per_token = max_token_chars(codec.tokenizer)
    huge = max(prompts, key=prompt_chars, default=None)
    if huge is not None and prompt_chars(huge) > per_token * limit:
        chars = prompt_chars(huge)
        raise ConfigError(
            f"{field}={max_new_tokens}: a problem of {chars} characters ({huge.problem[:40]!r}...) is at least "
            f"{-(-chars // per_token)} tokens (model {name}'s longest token is {per_token} characters), beyond "
            f"its max_position_embeddings={limit}; remove that row"
        )
    longest = longest_prompt(codec, prompts)
    if longest + max_new_tokens > limit:
        room = f"at most {limit - longest}" if limit > longest else "the prompts alone do not fit"
        raise ConfigError(
            f"{field}={max_new_tokens}: the longest prompt ({longest} tokens) plus {max_new_tokens} new "
            f"tokens is {longest + max_new_tokens} positions, beyond model {name}'s "
            f"max_position_embeddings={limit}; lower {field} ({room})"
        )


def check_learner_context(
    learner: Any, prompts: Iterable[Any], max_new_tokens: int, field: str = "rollout.max_new_tokens"
) -> None:
    """:func:`check_context` for a :class:`graft.trainer.learner.Learner` (either backend) on ``prompts``
    (:class:`graft.types.Prompt`)."""
    check_context(learner.name, learner.codec, learner.max_positions(), prompts, max_new_tokens, field)

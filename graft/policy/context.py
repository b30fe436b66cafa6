"""Does the longest prompt plus the generation budget fit a model's positions?

Checked once the models are loaded -- by training (``rollout.max_new_tokens``, ``eval.max_new_tokens``),
``graft eval`` and the probe -- before anything is sampled: a model asked to write past
``max_position_embeddings`` generates for minutes, exhausts memory or writes garbage past its trained
positions.
"""

from __future__ import annotations

from typing import Any, Iterable

from graft.config import ConfigError


def max_positions(model_config: Any) -> int | None:
    """``max_position_embeddings`` of a transformers config (or of its text config, for a multimodal
    model); ``None`` when it has none (such a model is not checked)."""
    for c in (model_config, getattr(model_config, "text_config", None)):
        v = getattr(c, "max_position_embeddings", None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def longest_prompt(codec: Any, problems: Iterable[str]) -> int:
    """Tokens of the longest rendered prompt (template, worked examples, instruction) of ``problems``."""
    return max((len(codec.encode_prompt(p)) for p in set(problems)), default=0)


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for: its longest vocabulary entry (a byte-level piece
    has a symbol per byte, a SentencePiece one a symbol per character). A text of c characters is at least
    c / this many tokens, which says a text does not fit without tokenizing it."""
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1) or 1


def check_context(name: str, codec: Any, limit: int | None, problems: Iterable[str], max_new_tokens: int, field: str) -> None:
    """Raise a one-line :class:`ConfigError` when the longest prompt of ``problems`` (in ``codec``'s
    tokens) plus ``max_new_tokens`` (the value of ``field``) exceeds ``limit`` positions of model ``name``. A problem
    longer than ``limit`` tokens of the longest piece is refused without tokenizing it (a 50 MB row took
    minutes and gigabytes to tokenize before this refusal)."""
    if limit is None:
        return
    problems = set(problems)
    per_token = max_token_chars(codec.tokenizer)
    huge = max(problems, key=len, default="")
    if len(huge) > per_token * limit:
        raise ConfigError(
            f"{field}={max_new_tokens}: a problem of {len(huge)} characters ({huge[:40]!r}...) is at least "
            f"{-(-len(huge) // per_token)} tokens (model {name}'s longest token is {per_token} characters), beyond "
            f"its max_position_embeddings={limit}; remove that row"
        )
    longest = longest_prompt(codec, problems)
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
    check_context(learner.name, learner.codec, learner.max_positions(), [p.problem for p in prompts], max_new_tokens, field)

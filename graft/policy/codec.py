"""A model's text side, without its weights: prompt template, tokenizer, response framing, stop strings.

One :class:`TextCodec` per model serves every place that turns text into that model's tokens or
back: rollouts, peer scoring (re-tokenizing a peer's responses), evaluation, the probe, and the
driver side of the Ray backend (which holds no weights). The rules themselves live in
:mod:`graft.policy.prompts`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from graft.config import ModelConfig
from graft.policy import prompts
from graft.policy.loading import load_tokenizer
from graft.types import Messages


class TextCodec:
    """Template, tokenizer and stop strings of one model (``cfg``)."""

    def __init__(self, cfg: ModelConfig, tokenizer: Any) -> None:
        self.cfg, self.name, self.tokenizer = cfg, cfg.name, tokenizer
        self.eos_token_id: int = tokenizer.eos_token_id
        """EOS appended by :meth:`encode_response` to finished responses."""
        self.pad_token_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stops: tuple[str, ...] = tuple(cfg.stop_strings())
        """Stop strings that end a response (``ModelConfig.stop_strings()``)."""
        self.stop_ids: set[int] = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        """Token ids that end a sampled response: the tokenizer's EOS, plus the model's generation-config
        EOS ids (:class:`~graft.policy.policy.Policy` adds them; :meth:`load` reads them from a folder)."""

    @classmethod
    def load(cls, cfg: ModelConfig, weights_from: str | None = None) -> "TextCodec":
        """The codec of ``cfg`` (tokenizer from ``weights_from`` when it holds one), with the EOS ids of a
        ``generation_config.json`` in that folder."""
        codec = cls(cfg, load_tokenizer(cfg, weights_from=weights_from))
        gen = Path(weights_from or cfg.path) / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            codec.stop_ids |= {int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None}
        return codec

    def render_prompt(self, problem: str, messages: Messages | None = None) -> str:
        """The prompt text of ``problem`` in this model's template; of the conversation ``messages`` when given
        (:attr:`graft.types.Prompt.messages`)."""
        return prompts.render_prompt(self.cfg, self.tokenizer, problem, messages)

    def encode_prompt(self, problem: str, messages: Messages | None = None) -> list[int]:
        """Token ids of the rendered prompt of ``problem`` (or ``messages``; BOS handled, see :mod:`prompts`)."""
        return prompts.encode_prompt(self.tokenizer, self.render_prompt(problem, messages))

    def encode_response(self, text: str, finished: bool) -> list[int]:
        """This model's tokenization of a (peer) response text, framed as its own samples are
        (:func:`prompts.frame_response`: a few-shot base model's answers start with a space and
        end at ``"\\n\\nProblem:"``, not at an EOS it never writes; a chat model's end with EOS)."""
        text, eos = prompts.frame_response(text, finished, self.cfg.template, list(self.stops))
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        return ids + [self.eos_token_id] if eos else ids

    def encode_responses(self, texts: Sequence[str], finished: Sequence[bool]) -> list[list[int]]:
        return [self.encode_response(t, f) for t, f in zip(texts, finished, strict=True)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens stripped (no clean-up of spaces, so it re-encodes faithfully)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def cut(self, sample: Any, stops: Sequence[str] | None = None) -> Any:
        """``sample`` ended at its first stop string (:func:`prompts.cut_at_stop`; default: this model's)."""
        return prompts.cut_at_stop(sample, self.decode, self.stops if stops is None else tuple(stops))

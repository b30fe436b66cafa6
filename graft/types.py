"""The rollout container shared by every phase.

Shape letters used throughout graft: ``P`` prompts in a step, ``G`` samples per group,
``T`` tokens of one response, ``B`` sequences in a minibatch, ``V`` vocabulary.

A :class:`RolloutGroup` is the G responses that one model (``source``) generated for one
prompt, seen from the model that trains on them (``holder``). Own data has
``source == holder``; a group handed over by GRAFT is a copy with ``holder`` set to the
receiver, re-tokenized with the receiver's tokenizer (``token_ids``), scored by the
receiver's behaviour policy (``old_logprobs``) and carrying the source's generation
tokens and log-probs (``gen_token_ids``/``gen_logprobs``) and advantages.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

import torch
from typing_extensions import NotRequired  # typing's from Python 3.11; typing_extensions is a dependency of torch

from graft.success import succeeded

VERIFY_OK = "ok"
VERIFY_TIMEOUT = "timeout"
VERIFY_NO_ANSWER = "no_answer"
VERIFY_ERROR = "error"


@dataclass
class Sample:
    """One sampled response (every rollout engine's result type)."""

    token_ids: list[int]
    """Sampled tokens, including the stop token when ``finished``."""
    logprobs: list[float]
    """log pi(token) of each sampled token under the sampling distribution (``graft.policy.lm``)."""
    text: str
    """Decoded response, special tokens stripped."""
    finished: bool
    """True when it ended with a stop (EOS) token or stop string, False when cut at ``max_new_tokens``."""
    entropies: list[float] | None = None
    """Entropy (nats) of the sampling distribution at each sampled token (full vocabulary, at the sampling
    temperature, before top-p); ``None`` from engines that do not expose their logits (``hf-cb``, ``vllm``)."""


Messages = tuple[dict[str, Any], ...]
"""A conversation in the chat format (TRL's "conversational" prompt): ``({"role": "system", "content": ...},
{"role": "user", "content": ...}, ...)``, each message a dict with at least ``role`` and ``content`` (text)."""


@dataclass
class Prompt:
    """One training or evaluation problem."""

    id: str
    problem: str
    """The problem text: the text a template renders; for a conversation, its last user message (what logs, monitors
    and the trajectory store show)."""
    answer: str
    messages: Messages | None = None
    """A conversational prompt's messages, rendered as they are by the model's chat template (``template: chat``);
    None for a text prompt (``problem`` in the model's template)."""


class GroupCounts:
    """``size`` and :meth:`successes` of a group of responses with rewards (a rollout group, a stored group)."""

    responses: list[str]
    rewards: list[float]

    @property
    def size(self) -> int:
        return len(self.responses)

    def successes(self, threshold: float) -> int:
        """k: the responses that :func:`succeeded` at ``threshold``."""
        return sum(succeeded(r, threshold) for r in self.rewards)


@dataclass
class RolloutGroup(GroupCounts):
    """G responses of ``source`` to one prompt, as trained on by ``holder``.

    Per-response lists all have length G. ``token_ids[g]``/``old_logprobs[g]`` have
    length T_g in the holder's tokenization; ``gen_token_ids[g]``/``gen_logprobs[g]``
    have length T'_g in the source's tokenization (the same lists for own data).
    """

    prompt_id: str
    problem: str
    answer: str
    source: str
    """Model that generated the responses."""
    holder: str
    """Model that trains on this group (== source for own data)."""
    prompt_text: str
    """The prompt rendered with the holder's template."""
    prompt_token_ids: list[int]
    """Holder tokenization of ``prompt_text``."""
    responses: list[str]
    """[G] response texts (special tokens stripped)."""
    token_ids: list[list[int]]
    """[G][T] holder tokenization of each response (EOS appended when the response finished)."""
    old_logprobs: list[list[float]]
    """[G][T] log-probs of ``token_ids`` under the holder's behaviour policy pi_theta_old."""
    gen_token_ids: list[list[int]]
    """[G][T'] tokens as the source sampled them."""
    gen_logprobs: list[list[float]]
    """[G][T'] the source sampler's log-probs of ``gen_token_ids`` (pi_phi for peer data)."""
    finished: list[bool]
    """[G] True when the response ended with EOS, False when cut at max_new_tokens."""
    rewards: list[float] = field(default_factory=list)
    """[G] verified rewards (re-verified by the holder for peer data); :func:`succeeded` says which are successes."""
    status: list[str] = field(default_factory=list)
    """[G] verifier status: ok / timeout / no_answer / error."""
    reward_parts: dict[str, list[float | None]] = field(default_factory=dict)
    """With ``reward.function``: each function's own value [G] (None: it gave none), by the name its metrics use
    (``rewards/NAME/mean``); ``rewards`` is their weighted sum. Empty when a domain grades."""
    advantages: list[float] = field(default_factory=list)
    """[G] advantages used in the loss (the source's, frozen, for peer data)."""
    weights: list[float] = field(default_factory=list)
    """[G] sequence weights: 1 for own data, min(s, cap) for admitted peer responses, 0 if dropped."""
    compat: list[float] = field(default_factory=list)
    """[G] compatibility score s (1.0 for own data)."""
    step: int = 0
    """Training step that produced the group."""
    index: list[int] = field(default_factory=list)
    """[G] position of each response in the source's original group (kept through gating)."""
    messages: Messages | None = None
    """The prompt's messages when it is a conversation (:attr:`Prompt.messages`): every model renders them with its
    own chat template, a receiver too; None for a text prompt."""

    def __post_init__(self) -> None:
        g = len(self.responses)
        if not self.index:
            self.index = list(range(g))
        for name in ("token_ids", "old_logprobs", "gen_token_ids", "gen_logprobs", "finished"):
            assert len(getattr(self, name)) == g, f"{name} has {len(getattr(self, name))} entries, expected G={g}"
        for t, lp in zip(self.token_ids, self.old_logprobs, strict=True):
            assert len(t) == len(lp), f"token_ids/old_logprobs length mismatch {len(t)} != {len(lp)}"
        for t, lp in zip(self.gen_token_ids, self.gen_logprobs, strict=True):
            assert len(t) == len(lp), f"gen_token_ids/gen_logprobs length mismatch {len(t)} != {len(lp)}"

    @property
    def is_peer(self) -> bool:
        return self.source != self.holder

    def rewards_tensor(self) -> torch.Tensor:
        return torch.tensor(self.rewards, dtype=torch.float32)

    def subset(self, keep: list[int]) -> "RolloutGroup":
        """The group restricted to responses ``keep`` (used to drop gated-out peer responses)."""
        pick = lambda xs: [xs[i] for i in keep] if xs else xs  # noqa: E731
        return replace(
            self,
            responses=pick(self.responses),
            token_ids=pick(self.token_ids),
            old_logprobs=pick(self.old_logprobs),
            gen_token_ids=pick(self.gen_token_ids),
            gen_logprobs=pick(self.gen_logprobs),
            finished=pick(self.finished),
            rewards=pick(self.rewards),
            status=pick(self.status),
            reward_parts={name: pick(values) for name, values in self.reward_parts.items()},
            advantages=pick(self.advantages),
            weights=pick(self.weights),
            compat=pick(self.compat),
            index=pick(self.index),
        )


class HandedRow(TypedDict):
    """One response handed from a source to a receiver as :func:`graft.exchange.handover.hand_over` records it:
    a :class:`TransferRow` before :func:`graft.exchange.common.regrade` adds the receiver's verdict."""

    prompt_id: str
    index: int
    reward_source: float
    advantage: float
    mean_logp_receiver: float
    mean_logp_source: float
    s: float
    admitted: bool
    weight: float
    receiver_tokens: int
    source_tokens: int


class TransferRow(HandedRow):
    """One response handed from a source to a receiver (a row of an audit record's ``responses``)."""

    reward_receiver: float | None
    """The receiver's own verdict (None: the response was not admitted, so not re-verified)."""


class PairingEvidence(TypedDict):
    """What one step tells about one direction S -> R (:mod:`graft.exchange.pairing`)."""

    solved: int
    """The receiver's all-fail prompts (k_R = 0) on which the source had >= 1 success."""
    s: list[float]
    """[N] s of every response the source handed to the receiver this step (before conflicts and pairing)."""


class PairingRecord(TypedDict):
    """The ``pairing`` field of an audit record S -> R (absent with ``exchange.pairing: all``)."""

    rule: str
    """``exchange.pairing``."""
    window: int
    """``exchange.pairing_window``."""
    evidence: PairingEvidence
    """This step's evidence of the direction."""
    score: float | None
    """The direction's score over the window (None: no evidence)."""
    chosen: list[str]
    """The peers the receiver draws from at this step."""


class DirectionAudit(TypedDict):
    """One exchange direction S -> R at one step: a line of ``audit.jsonl`` (schema in the README)."""

    step: int
    source: str
    receiver: str
    candidates: list[dict]
    """``{prompt_id, k_source, k_receiver}`` of every candidate prompt."""
    m: int
    """The balanced target (-1 without balancing)."""
    selected: list[str]
    responses: list[TransferRow]
    conflicts: list[dict]
    pairing: NotRequired[PairingRecord]
    """Which peers the receiver drew from and why (``exchange.pairing`` other than ``all``)."""
    rounds: NotRequired[int]
    """The sampling rounds whose exchanges the record holds, when the step took more than one
    (``rollout.dynamic_sampling``; :func:`graft.exchange.common.merge_rounds`)."""


@dataclass
class ExchangeResult:
    """What one exchange step hands to the update and to the logs."""

    train_groups: dict[str, list[RolloutGroup]]
    """Per model: its own groups, minus the prompts that were replaced, then the peer groups it received
    (``is_peer``: the admitted responses only)."""
    audit: list[DirectionAudit] = field(default_factory=list)
    """One record per direction S->R."""
    metrics: dict = field(default_factory=dict)
    """``exchange/S->R/...`` per direction."""

    @classmethod
    def unchanged(cls, groups: dict[str, list[RolloutGroup]]) -> "ExchangeResult":
        """No exchange: every model trains on its own groups."""
        return cls({n: list(gs) for n, gs in groups.items()})

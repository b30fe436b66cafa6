"""Prompt templates (``ModelConfig.template``, one :class:`Template` each in :data:`graft.registry.TEMPLATES`) and
their tokenization.

- ``chat``: the tokenizer's chat template with one user turn ``"{problem}\\n{instruction}"``
  and the generation prompt (``add_generation_prompt=True``), preceded by ``cfg.fewshot``
  worked examples as earlier user/assistant turns (none by default). Needs a tokenizer with a
  chat template (instruct models); base models use ``plain`` / ``fewshot``.
  A conversational prompt (:attr:`graft.types.Prompt.messages`, TRL's list of chat messages) is rendered as
  written: ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``, no instruction and no worked
  examples added (:func:`check_conversations` refuses a model that sets either, and the other templates).
- ``plain``: ``"Problem: {problem}\\n{instruction}\\nSolution:"``.
- ``fewshot``: ``cfg.fewshot`` worked examples in the plain format (separated by a blank line), then the
  plain prompt. The examples and the default instruction are the task domain's (``reward.domain``,
  :class:`graft.domains.Domain`: for math, fixed generic arithmetic/algebra problems answered in
  ``\\boxed{}``), so a run's prompts never depend on its training data.

An empty ``cfg.instruction`` drops the instruction line; ``None`` takes the domain's.

Peer responses are framed the way the receiver's own samples are (:func:`frame_response`):
whitespace at the two ends of a response belongs to the template, not to its content.

BOS: :func:`encode_prompt` lets the tokenizer add its special tokens (Gemma: ``<bos>``)
unless the rendered text already starts with the BOS token (a chat template that writes
it), and never yields two BOS tokens; an EOS a tokenizer appends is removed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from graft.config import ConfigError, ModelConfig
from graft.domains import Domain, load_domain
from graft.registry import TEMPLATES
from graft.types import Messages, Prompt


def _question(problem: str, instruction: str) -> str:
    problem = problem.strip()
    return f"{problem}\n{instruction.strip()}" if instruction and instruction.strip() else problem


def plain_prompt(problem: str, instruction: str) -> str:
    return f"Problem: {_question(problem, instruction)}\nSolution:"


def _shots(k: int, domain: Domain) -> tuple[tuple[str, str], ...]:
    if not 0 <= k <= len(domain.fewshot):
        raise ConfigError(f"fewshot must be in [0, {len(domain.fewshot)}] (the worked examples of domain {domain.name}), got {k}")
    return domain.fewshot[:k]


def instruction_of(cfg: ModelConfig) -> str:
    """The instruction line of ``cfg``'s prompts: its own, else its domain's."""
    return cfg.instruction if cfg.instruction is not None else load_domain(cfg.domain_name).instruction


def fewshot_prompt(problem: str, instruction: str, k: int, domain: str = "math") -> str:
    shots = [f"{plain_prompt(q, instruction)} {a}" for q, a in _shots(k, load_domain(domain))]
    return "\n\n".join(shots + [plain_prompt(problem, instruction)])


def _has_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"template 'chat' needs a tokenizer with a chat template, and {tokenizer.name_or_path!r} has "
            "none (a base model?); use template: plain or fewshot"
        )


def conversation_prompt(tokenizer: Any, messages: Messages) -> str:
    """The prompt text of a conversation: the tokenizer's chat template over ``messages`` as written, with the
    generation prompt."""
    _has_chat_template(tokenizer)
    return tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=True)


def chat_prompt(tokenizer: Any, problem: str, instruction: str, k: int = 0, domain: str = "math") -> str:
    _has_chat_template(tokenizer)
    messages = []
    for q, a in _shots(k, load_domain(domain)):
        messages += [{"role": "user", "content": _question(q, instruction)}, {"role": "assistant", "content": a}]
    messages.append({"role": "user", "content": _question(problem, instruction)})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class Template:
    """One prompt format: how a problem becomes prompt text, how a response is framed after it, and its defaults."""

    name: str
    """Its registry name (``models.I.template``), set by ``TEMPLATES.register``."""
    shots: int = 0
    """Worked examples shown when ``models.I.fewshot`` is not set."""
    shows_examples: bool = True
    """It can show worked examples (``models.I.fewshot`` > 0 is refused otherwise)."""
    stops: tuple[str, ...] = ("\nProblem:",)
    """Stop strings when ``models.I.stop`` is not set (a base model otherwise writes the next problem)."""
    takes_messages: bool = False
    """It renders conversational prompts (:attr:`graft.types.Prompt.messages`)."""

    def render(
        self, tokenizer: Any, problem: str, instruction: str, shots: int, domain: str, messages: Messages | None = None
    ) -> str:
        raise NotImplementedError

    def _text_only(self, messages: Messages | None) -> None:
        if messages is not None:  # check_conversations refuses this before any model loads
            raise ConfigError(f"template {self.name!r} cannot render a conversation (chat messages); use template: chat")

    def frame(self, text: str, finished: bool, stops: list[str]) -> tuple[str, bool]:
        """A response text as a model with this template writes its own: ``(text, append EOS)``: one space after
        ``"Solution:"``; a finished response ends with the first stop string (after a line break when that string
        starts a new line, as between the worked examples: ``"... \\boxed{5}.\n\nProblem:"``), since that is how
        such a model ends an answer; with no stop strings, with EOS."""
        body = text.strip()
        body = " " + body if body else body
        if finished and stops:
            return body + ("\n" if stops[0].startswith("\n") else "") + stops[0], False
        return body, finished


class ChatTemplate(Template):
    """``chat``: the tokenizer's chat template; a response has no surrounding whitespace and ends with EOS."""

    stops = ()
    takes_messages = True

    def render(
        self, tokenizer: Any, problem: str, instruction: str, shots: int, domain: str, messages: Messages | None = None
    ) -> str:
        if messages is not None:
            return conversation_prompt(tokenizer, messages)
        return chat_prompt(tokenizer, problem, instruction, shots, domain)

    def frame(self, text: str, finished: bool, stops: list[str]) -> tuple[str, bool]:
        return text.strip(), finished


class PlainTemplate(Template):
    """``plain``: ``Problem: ... Solution:``, no worked examples."""

    shows_examples = False

    def render(
        self, tokenizer: Any, problem: str, instruction: str, shots: int, domain: str, messages: Messages | None = None
    ) -> str:
        self._text_only(messages)
        return plain_prompt(problem, instruction)


class FewshotTemplate(Template):
    """``fewshot``: worked examples in the plain format, then the plain prompt."""

    shots = 2

    def render(
        self, tokenizer: Any, problem: str, instruction: str, shots: int, domain: str, messages: Messages | None = None
    ) -> str:
        self._text_only(messages)
        return fewshot_prompt(problem, instruction, shots, domain)


TEMPLATES.register("chat", ChatTemplate())
TEMPLATES.register("plain", PlainTemplate())
TEMPLATES.register("fewshot", FewshotTemplate())


def render_prompt(cfg: ModelConfig, tokenizer: Any, problem: str, messages: Messages | None = None) -> str:
    """The prompt text of ``problem`` in ``cfg.template``; of the conversation ``messages`` when given."""
    return TEMPLATES[cfg.template].render(tokenizer, problem, instruction_of(cfg), cfg.num_shots(), cfg.domain_name, messages)


def check_conversations(models: Sequence[ModelConfig], prompts: Sequence[Prompt], key: str) -> None:
    """A one-line :class:`ConfigError` when ``prompts`` (data set ``key``) hold a conversation that a model of
    ``models`` cannot render as written: its template is not ``chat``, or it sets worked examples or an instruction
    (which a conversation, rendered as written, would silently drop). Checked before any model loads."""
    first = next((p for p in prompts if p.messages is not None), None)
    if first is None:
        return
    for i, m in enumerate(models):
        if not TEMPLATES[m.template].takes_messages:
            why = f"its template is {m.template!r}; conversations need template: chat (models.{i}.template)"
        elif m.num_shots():
            why = f"it shows {m.num_shots()} worked examples (models.{i}.fewshot); set models.{i}.fewshot=0"
        elif m.instruction and m.instruction.strip():
            why = f"it sets models.{i}.instruction; write it into the messages instead"
        else:
            continue
        raise ConfigError(
            f"{key}: prompt {first.id!r} is a conversation (a list of chat messages, rendered as written), "
            f"which model {m.name} cannot take: {why}"
        )


def frame_response(text: str, finished: bool, template: str, stops: list[str]) -> tuple[str, bool]:
    """A response text as a model with ``template`` writes its own: ``(text, append EOS)`` (:meth:`Template.frame`)."""
    return TEMPLATES[template].frame(text, finished, stops)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered prompt, with exactly the BOS the model expects (never two)."""
    bos, bos_id, eos_id = tokenizer.bos_token, tokenizer.bos_token_id, tokenizer.eos_token_id
    has_bos_text = bool(bos) and text.startswith(bos)
    ids = list(tokenizer(text, add_special_tokens=not has_bos_text)["input_ids"])
    while bos_id is not None and len(ids) >= 2 and ids[0] == bos_id and ids[1] == bos_id:
        ids.pop(0)
    if eos_id is not None and ids and ids[-1] == eos_id and not (tokenizer.eos_token and text.endswith(tokenizer.eos_token)):
        ids.pop()
    return ids


def cut_at_stop(sample, decode, stops: list[str] | tuple[str, ...]):
    """End a sample at the first stop string (vLLM's ``stop``): tokens up to the one that
    completes it, text before it, ``finished=True``. Base models given a few-shot prompt go on
    to invent the next problem; without this its ``\boxed{}`` would be the one graded.

    The one stop-string rule of graft: every engine's samples pass through it, for rollouts,
    evaluation and probes alike. The token that completes the stop string is the first k with
    a stop string in ``decode(ids[:k])`` (found by bisection: once present, a stop string stays).
    """
    if not stops or not any(s in sample.text for s in stops):
        return sample
    ids = sample.token_ids
    has = lambda k: any(s in decode(ids[:k]) for s in stops)  # noqa: E731
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if has(mid):
            hi = mid
        else:
            lo = mid + 1
    text = decode(ids[:lo])
    cut = min(text.index(s) for s in stops if s in text)
    ents = None if sample.entropies is None else sample.entropies[:lo]
    return replace(sample, token_ids=ids[:lo], logprobs=sample.logprobs[:lo], text=text[:cut], finished=True, entropies=ents)

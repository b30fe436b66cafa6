"""The contract of a task domain, and how ``reward.domain`` names one.

A :class:`Domain` owns everything about one kind of task, in one module:

- **rows**: :meth:`Domain.reference` turns a data row (graft's field names after ``data.fields``) into the
  reference text the grader compares against (math: the answer; code: the tests as JSON). It is stored as
  ``Prompt.answer`` and travels with every rollout group, trajectory-store row and eval record, so any later
  re-grade (the exchange's receiver, ``graft eval``, ``graft grade``) needs nothing but the text.
- **prompts**: the answer-format ``instruction`` appended to every problem and the worked ``fewshot``
  examples (``(problem, solution)`` pairs) of the ``fewshot`` and ``chat`` templates.
- **grading**: ``verify_fn``, ``"module:function"`` with signature ``(response, reference, **settings) ->
  (reward, status)``, imported by the grader's worker processes (which bound its time); ``quick``, an optional
  in-process check that decides cheap items without a round trip (``None`` = send it to a worker).
- **the reward monitor**: ``flags`` names what :meth:`response_flags` looks for in one response (the shortcut
  detectors; ``status_flags`` are those the verifier's status carries, e.g. the code domain's held-out tests);
  :meth:`monitor` gives, among the rewarded responses of a batch, the share carrying each flag.
- **start-up**: ``start``, an optional check run before grading starts (the code domain: is its sandbox strong
  enough here), which returns the line a run prints and records about how it grades.

Adding a domain: a module in graft/domains/ with ``DOMAINS.register("name", Domain(...))`` (:data:`graft.registry.DOMAINS`),
or, with no edit of graft, the same call in your own code before the config loads, or ``reward.domain:
path/to/file.py:MY_DOMAIN``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from graft.config import upgrade_tree
from graft.data.datasets import RowError, answer_text
from graft.errors import UserError
from graft.registry import DOMAINS, UnknownName
from graft.reward.functions import RewardFunctionError, load_object
from graft.success import succeeded


class DomainError(UserError, ValueError):
    """``reward.domain`` names no domain, or its module cannot be loaded."""


@dataclass(frozen=True)
class Domain:
    verify_fn: str
    """``"module:function"``: ``(response, reference, **settings) -> (reward in [0, 1], status)``, run in the
    grader's workers under ``reward.timeout_s``."""
    instruction: str
    """The sentence appended to every problem (``ModelConfig.instruction`` when that is not set)."""
    fewshot: tuple[tuple[str, str], ...] = ()
    """Worked ``(problem, solution)`` examples shown by the ``fewshot``/``chat`` templates, in this order."""
    reference_fields: tuple[str, ...] = ("answer",)
    """The row fields :meth:`reference` reads (named in a missing-column message)."""
    flags: tuple[str, ...] = ()
    """The reward monitor's flags (:meth:`response_flags`)."""
    quick: Callable[[str, str], tuple[float, str] | None] | None = None
    """In-process check of ``(response, reference)``: a result, or ``None`` to send the item to a worker.
    Must run in time linear in the response (it has no timeout)."""
    make_reference: Callable[[Mapping[str, Any]], str] | None = None
    """``row -> reference`` (raises :class:`graft.data.datasets.RowError`); ``None``: the row's ``answer`` as text."""
    flag_fn: Callable[[str, str, str], dict[str, bool]] | None = None
    """``(response, problem, reference) -> {flag: bool}`` for every name of ``flags``."""
    settings_from: Callable[[Any], dict[str, Any]] | None = None
    """``RewardConfig -> keyword arguments`` of every ``verify_fn`` call (the ``reward.*`` settings it reads)."""
    rewardable: Callable[[str], bool] | None = None
    """Whether any response can score on a reference (``None``: not checked). Training data whose references fail it
    is said in one warning line: those prompts can only ever score 0 (the number domain's ``twelve``, ``nan``)."""
    keeps_lines: bool = False
    """A response's line breaks and indentation carry meaning (a program): ``graft samples`` prints it line by line
    instead of collapsing its whitespace."""
    status_flags: tuple[str, ...] = ()
    """Flags of ``flags`` read off the verifier's status (a response carries flag ``F`` when its status is ``F``),
    not from the text: a detector the grader ran (the code domain's ``holdout_fail``). Off when no status is
    known."""
    start: Callable[[Any], str] | None = None
    """``RewardConfig -> one line``, run before grading starts (:func:`graft.domains.grading.grading_note`): raises a
    one-line :class:`graft.errors.UserError` when the domain cannot grade safely here, else says how it grades
    (printed when a grader starts, recorded in a run's ``config.yaml``)."""
    name: str = ""
    """The name ``reward.domain`` uses: given by ``DOMAINS.register("name", Domain(...))``; a domain named by its
    ``"module:ATTR"`` keeps the name it was built with."""

    def reference(self, row: Mapping[str, Any]) -> str:
        """The reference text of a data row (graft's field names); raises :class:`graft.data.datasets.RowError`."""
        if self.make_reference is not None:
            return self.make_reference(row)
        if "answer" not in row:
            raise RowError("missing_field", "missing field(s) ['answer']")
        return answer_text(row["answer"])

    def verify_settings(self, reward: Any) -> dict[str, Any]:
        """The keyword arguments of ``verify_fn`` under ``reward`` (a :class:`graft.config.RewardConfig`)."""
        return self.settings_from(reward) if self.settings_from is not None else {}

    def response_flags(self, response: str, problem: str, reference: str, status: str | None = None) -> dict[str, bool]:
        """The monitor's flags of one response (all false for a domain without a monitor); ``status``, the
        verifier's, sets the ``status_flags``."""
        out = {f: False for f in self.flags} if self.flag_fn is None else self.flag_fn(response, problem, reference)
        return out | {f: status == f for f in self.status_flags}

    def monitor(
        self,
        responses: Sequence[str],
        problems: Sequence[str],
        references: Sequence[str],
        rewards: Sequence[float],
        threshold: float,
        statuses: Sequence[str] | None = None,
    ) -> dict[str, float | None]:
        """Among the rewarded responses of a batch (reward above ``threshold``, ``reward.success_threshold``:
        :func:`graft.success.succeeded`): ``{"n": count, FLAG: share, ...}``; shares are ``None`` when nothing was
        rewarded. ``statuses`` (the verifier's, one per response) set the status flags."""
        n = len(responses)
        assert len(problems) == n and len(references) == n and len(rewards) == n, (n, len(problems), len(rewards))
        assert statuses is None or len(statuses) == n, (n, len(statuses))
        known = list(statuses) if statuses is not None else [None] * n
        hits = [
            self.response_flags(r, q, a, s)
            for r, q, a, x, s in zip(responses, problems, references, rewards, known, strict=True)
            if succeeded(x, threshold)
        ]
        out: dict[str, float | None] = {"n": len(hits)}
        for f in self.flags:
            out[f] = sum(h[f] for h in hits) / len(hits) if hits else None
        return out


def load_domain(name: str) -> Domain:
    """The domain ``reward.domain`` names: a registered name (:data:`graft.registry.DOMAINS`), or
    ``"package.module:ATTR"`` / ``"path/to/file.py:ATTR"`` holding a :class:`Domain`."""
    if ":" not in name:
        try:
            return DOMAINS[name]
        except UnknownName as e:
            raise DomainError(f"reward.domain: {e} (or 'module:ATTR' / 'file.py:ATTR' of your own Domain)") from None
    try:
        obj = load_object(name, "reward.domain")
    except RewardFunctionError as e:
        raise DomainError(str(e)) from None
    if not isinstance(obj, Domain):
        raise DomainError(f"reward.domain: {name!r} is a {type(obj).__name__}, not a graft.domains.Domain")
    return obj


def run_domain(run_dir: str | Path) -> Domain:
    """The domain a run folder trained with: its ``config.yaml``'s ``reward.domain`` (:func:`config_domain`; ``math``
    when the folder holds no readable config)."""
    try:
        tree = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        tree = {}
    return config_domain(tree if isinstance(tree, dict) else {})


def config_domain(tree: Mapping[str, Any]) -> Domain:
    """The domain of a saved run config (a ``config.yaml`` as a dict, of this version or an earlier one);
    ``math`` for a config without one."""
    plain: dict[str, Any] = json.loads(json.dumps(dict(tree or {}), default=str))
    upgrade_tree(plain)
    return load_domain(str((plain.get("reward") or {}).get("domain", "math")))

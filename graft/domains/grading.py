"""The one place that turns the config into a task: the domain, the rows' references, the data and the grader.

Everything that grades (training, ``graft eval``, ``graft probe``, ``graft onestep``, ``graft experiment``,
``graft grade``) builds its grader with :func:`make_grader`, and everything that reads a task's data reads it
with :func:`load_data`, so a domain or a user's reward function reaches every command the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from graft.config import Config, RewardConfig
from graft.data.datasets import load_prompts
from graft.domains.base import Domain, load_domain
from graft.reward.functions import FunctionGrader, code_digest, function_name, row_reference
from graft.reward.grader import Grader
from graft.types import Prompt

__all__ = ["grading_note", "load_data", "make_grader", "reference_of", "reward_code", "task_domain", "unrewardable"]


def task_domain(reward: RewardConfig) -> Domain:
    """The domain ``reward.domain`` names (a one-line :class:`~graft.domains.base.DomainError` if none)."""
    return load_domain(reward.domain)


def reward_code(reward: RewardConfig) -> dict[str, str]:
    """The sha256 of the user's own code that decides the reward (:func:`graft.reward.functions.code_digest`): every
    ``reward.function`` and, for a domain of the user's, its module and its verify function's module, keyed by the
    field (``reward.function.0``, ``reward.domain``, ``reward.domain.verify_fn``); graft's own code is left out. A run
    records it in every checkpoint and refuses to resume on other code. A missing file or module is a one-line
    error here, before any model loads."""
    specs = {f"reward.function.{i} ({function_name(f)})": f for i, f in enumerate(reward.function)}
    if ":" in reward.domain:
        specs[f"reward.domain ({reward.domain})"] = reward.domain
    specs[f"reward.domain.verify_fn ({task_domain(reward).verify_fn})"] = task_domain(reward).verify_fn
    return {key: digest for key, spec in specs.items() if (digest := code_digest(spec, key.split(" ")[0])) is not None}


def unrewardable(reward: RewardConfig, prompts: list[Prompt], key: str) -> str | None:
    """A one-line warning naming the prompts (data set ``key``) whose reference no response can ever score on under
    ``reward``'s domain (:attr:`Domain.rewardable`: the number domain's ``twelve``, ``nan``, ``1e999``), or None."""
    check = None if reward.function else task_domain(reward).rewardable
    bad = [p for p in prompts if check is not None and not check(p.answer)]
    if not bad:
        return None
    shown = ", ".join(f"{p.answer[:20]!r} (id {p.id})" for p in bad[:3]) + (", ..." if len(bad) > 3 else "")
    return (
        f"warning: {key}: {len(bad)} of {len(prompts)} rows have an answer the {reward.domain} domain can never reward "
        f"({shown}); those prompts can only score 0"
    )


def reference_of(reward: RewardConfig) -> Callable[[Mapping[str, Any]], str]:
    """``row -> reference``: the row as JSON for ``reward.function`` (every column reaches the functions), else the
    domain's reference (math: the answer)."""
    return row_reference if reward.function else task_domain(reward).reference


def grading_note(reward: RewardConfig) -> str | None:
    """The domain's start-up check (:attr:`Domain.start`): the line saying how it grades here (the code domain:
    which sandbox), or a one-line :class:`graft.errors.UserError` when it cannot grade safely here. None for a
    domain without one, and for the user's reward functions."""
    if reward.function:
        return None
    domain = task_domain(reward)
    return domain.start(reward) if domain.start is not None else None


def make_grader(reward: RewardConfig, workers: int | None = None, timeout_s: float | None = None):
    """The grader of ``reward``: the user's functions (:class:`FunctionGrader`) when ``reward.function`` is set,
    else the domain's verifier in worker processes (:class:`Grader`), after its start-up check (:func:`grading_note`,
    printed on stderr). ``workers``/``timeout_s`` override the config's (``graft eval --verify-workers``)."""
    note = grading_note(reward)
    if note:
        print(f"grading: {note}", file=sys.stderr)
    workers = reward.workers if workers is None else workers
    if reward.function:
        return FunctionGrader(
            reward.function,
            reward.weights,
            reward.function_timeout_s,
            reward.on_error,
            workers=min(workers, 1),
            memory_mb=reward.function_memory_mb,
        )
    domain = task_domain(reward)
    return Grader(
        reward.timeout_s if timeout_s is None else timeout_s,
        workers,
        verify_fn=domain.verify_fn,
        quick=domain.quick,
        verify_kwargs=domain.verify_settings(reward),
    )


def load_data(
    spec: str | Any,
    cfg: Config,
    limit: int | None = None,
    on_bad_row: str | None = None,
    skip_hint: str = "set data.on_bad_row=skip to skip bad rows",
) -> tuple[list[Prompt], dict]:
    """The prompts of ``spec`` read as ``cfg``'s task reads them: ``data.fields``, the procedural tasks'
    settings and the rows' references (:func:`reference_of`)."""
    return load_prompts(
        spec,
        on_bad_row or cfg.data.on_bad_row,
        cfg.data.tasks,
        limit,
        skip_hint,
        fields=cfg.data.fields,
        reference=reference_of(cfg.reward),
    )

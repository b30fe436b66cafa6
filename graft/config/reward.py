"""``reward.*``: how a response is graded (a domain, or your own reward functions) and the grader's limits."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from graft.config.checks import check, check_choices
from graft.registry import DOMAINS, ON_ERRORS


@dataclass
class RewardConfig:
    domain: str = "math"
    """The task domain (graft/domains/): how a data row becomes a prompt, how a response is graded and what the
    reward monitor flags. ``math``: the last ``\\boxed{}`` is equivalent to the reference by ``math_verify``
    (MATH-style answers: fractions, radicals, intervals); ``number``: the box must also hold a number written out,
    so restating an arithmetic question in the box (``\\boxed{27*18}``) scores 0; ``code``: the response's last
    fenced Python block passes the row's ``tests`` in a sandbox. Also a registered name (``graft.registry.DOMAINS``)
    or ``"module:ATTR"`` / ``"path/to/file.py:ATTR"`` naming a ``graft.domains.Domain`` of your own. (Replaces
    ``answer_form``: ``any`` is ``math``, ``number`` is ``number``.)"""
    function: list[str | Callable[..., Any]] = field(default_factory=list)
    """Your own reward functions instead of the domain's grading, TRL-style: ``"package.module:callable"`` or
    ``"path/to/file.py:callable"`` (from Python, also the function itself: ``graft.train(cfg, reward_funcs=[f])``),
    called as ``f(prompts=[...], completions=[...], **columns)`` with the batch's
    problems, responses and every other column of their rows as lists (``id``, ``answer``, ``tests``, and the
    file's own extra columns); returns one float (or ``None``: not gradable) per completion. Several are summed
    with ``weights``. Runs in a worker process under ``function_timeout_s``."""
    weights: list[float] | None = None
    """Weight of each of ``function`` (``None``: 1 each); the reward is the weighted sum of the functions that
    returned a value."""
    success_threshold: float = 0.5
    """A response succeeds when its reward is strictly above this (:func:`graft.types.succeeded`). Success decides the
    all-fail groups (no response of a model's group succeeded) that GRAFT hands over, and what pass@k, the solve
    rates, the reward monitor and ``graft samples``/``analyze``/``eval`` count as solved. With 0/1 rewards any value in
    [0, 1) gives the same result; with a continuous reward it is a choice: rewards [0.3, 0.3] are an all-fail group at
    0.5 and two successes at 0.25. A domain's rewards lie in [0, 1], so without ``function`` it must be in [0, 1); with
    ``function`` any finite value (rewards on another scale)."""
    function_timeout_s: float = 120.0
    """Wall-clock limit of one call of a reward function on a batch."""
    function_memory_mb: int = 8192
    """The most resident memory the reward functions' worker process may use (checked four times a second where
    ``/proc`` can be read, i.e. on Linux); beyond it the worker is killed and the batch fails as if the function
    raised (``on_error``). 0: no limit. Raise it for a function that loads a model."""
    on_error: Annotated[str, ON_ERRORS] = "stop"
    """A reward function that raises, hangs, returns the wrong number of values or a non-finite value: ``stop``
    the run with one line naming the function (exit 2, the last checkpoint kept), or score that batch ``zero``
    (statuses ``function_error``/``function_timeout``, said on stderr; the run goes on)."""
    partial_credit: bool = False
    """``code``: reward = the share of tests passed instead of 1 only when every test passes."""
    test_timeout_s: float = 3.0
    """``code``: wall-clock limit of one test of a program (the whole program gets ``timeout_s``)."""
    sandbox_memory_mb: int = 512
    """``code``: address-space limit of the sandboxed program."""
    allow_weak_sandbox: bool = False
    """``code``: grade with a sandbox weaker than bubblewrap when bubblewrap is not usable here (``rlimits+setuid``
    as root, ``rlimits`` otherwise; docs/your-task.md says what each exposes). Off: training or grading code
    without a working bubblewrap stops with one line saying what is missing and how to install it."""
    holdout_tests: int = 0
    """``code``: this many tests of every row (chosen by a seed drawn from the row's tests; at most all but one)
    leave the reward and only feed the detector: a rewarded program that fails one has status and monitor flag
    ``holdout_fail``. The built-in ``code_task`` holds out tests on fresh inputs of each family already."""
    timeout_s: float = 5.0
    """Hard wall-clock limit per verification (for ``code``: per program, all its tests); a timeout scores 0 and
    is counted."""
    workers: int = 2
    """Grader worker processes (0 grades in-process, without the hard timeout)."""
    max_timeout_frac: float = 0.5
    """Stop the run with an error when more than this fraction of a step's verifications time out
    (a hanging grader), instead of training on a batch of zeros."""
    accept_code_change: bool = False
    """On resume: go on although a reward function's or a user domain's code differs from what the checkpoint
    recorded (its module file's sha256); the change is written to ``changes.jsonl``. ``false`` refuses, naming it."""

    def __post_init__(self) -> None:
        check_choices(self)
        check(
            self.domain in DOMAINS or ":" in self.domain,
            "domain",
            f"unknown domain {self.domain!r}; valid: {DOMAINS.choices()} (or 'module:ATTR' / 'file.py:ATTR')",
        )
        if isinstance(self.function, str):
            self.function = [self.function]
        for i, f in enumerate(self.function):
            check(
                callable(f) or (":" in f and bool(f.rpartition(":")[2])),
                f"function.{i}",
                f"{f!r} must look like 'package.module:callable' or 'path/to/file.py:callable'",
            )
        check(
            self.weights is None or len(self.weights) == len(self.function),
            "weights",
            f"gives {len(self.weights or [])} weights for {len(self.function)} reward function(s)",
        )
        check(self.weights is None or all(math.isfinite(w) for w in self.weights), "weights", "must be finite")
        check(math.isfinite(self.success_threshold), "success_threshold", f"must be finite, got {self.success_threshold}")
        check(
            bool(self.function) or not math.isfinite(self.success_threshold) or 0 <= self.success_threshold < 1,
            "success_threshold",
            f"must be in [0, 1) when the domain grades (its rewards lie in [0, 1], so {self.success_threshold} makes "
            f"every response a {'success' if self.success_threshold < 0 else 'failure'}); any finite value only with "
            "reward.function",
        )
        check(self.function_timeout_s > 0, "function_timeout_s", f"must be > 0, got {self.function_timeout_s}")
        check(self.function_memory_mb >= 0, "function_memory_mb", f"must be >= 0 (0: no limit), got {self.function_memory_mb}")
        check(self.test_timeout_s > 0, "test_timeout_s", f"must be > 0, got {self.test_timeout_s}")
        check(self.sandbox_memory_mb >= 64, "sandbox_memory_mb", f"must be >= 64, got {self.sandbox_memory_mb}")
        check(self.holdout_tests >= 0, "holdout_tests", f"must be >= 0, got {self.holdout_tests}")
        check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        check(self.workers >= 0, "workers", f"must be >= 0 (0 grades in-process), got {self.workers}")
        check(0 < self.max_timeout_frac <= 1, "max_timeout_frac", f"must be in (0, 1], got {self.max_timeout_frac}")


def success_threshold_of(tree: Mapping[str, Any] | None) -> float:
    """``reward.success_threshold`` of a saved run config (a ``config.yaml`` read as a dict), for the readers of a
    finished run; the default where the config has none (a run of an earlier graft, no config at all)."""
    reward = tree.get("reward") if isinstance(tree, Mapping) else None
    value = reward.get("success_threshold") if isinstance(reward, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return RewardConfig.success_threshold

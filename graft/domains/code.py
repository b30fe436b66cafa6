"""The ``code`` domain: write a Python function; the row's unit tests decide, run in a sandbox.

A row is ``{id, problem, tests[, entry_point]}``: ``tests`` a list of ``assert CALL == VALUE`` strings (the
procedural task's form, MBPP's ``test_list``) or one string of test code (HumanEval's ``test`` with its
``def check(candidate)``, called on ``entry_point``). The response's last fenced code block is the program
(:func:`graft.reward.code_monitor.extract_program`); it scores 1 when every test passes (``reward.partial_credit``:
the share passed). Grading runs in the grader's workers through :func:`graft.reward.code.verify_code`, each
program in :mod:`graft.reward.sandbox` under ``reward.timeout_s`` (all tests), ``reward.test_timeout_s`` (one
test) and ``reward.sandbox_memory_mb``.

The monitor (:mod:`graft.reward.code_monitor`) flags rewarded programs that special-case the tests' inputs,
exit early, touch the interpreter or the harness, are trivial, or are missing; ``holdout_fail``, read off the
grader's status, flags rewarded programs that fail a held-out test (the built-in task's tests on fresh inputs of
the row's family; ``reward.holdout_tests`` of a user's rows). Grading refuses to start without bubblewrap unless
``reward.allow_weak_sandbox`` (:func:`graft.reward.code.describe_isolation`, the domain's ``start``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from graft.data.datasets import RowError
from graft.domains.base import Domain
from graft.registry import DOMAINS
from graft.reward import code_monitor, verifier
from graft.reward.code import HOLDOUT_FAIL, code_reference, describe_isolation

INSTRUCTION = "Write the complete function in Python, in one ```python code block."

FEWSHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    (
        "Write a Python function `square(n)` that returns n multiplied by itself. For example, square(3) returns 9.",
        "```python\ndef square(n):\n    return n * n\n```",
    ),
    (
        "Write a Python function `first_word(s)` that returns the first word of the string s (words are separated by "
        "spaces). For example, first_word('good morning') returns 'good'.",
        "```python\ndef first_word(s):\n    return s.split(' ')[0]\n```",
    ),
    (
        "Write a Python function `count_negative(xs)` that returns how many numbers in the list xs are below zero. "
        "For example, count_negative([3, -1, -4]) returns 2.",
        "```python\ndef count_negative(xs):\n    count = 0\n    for x in xs:\n        if x < 0:\n            count += 1\n"
        "    return count\n```",
    ),
)
"""(problem, worked solution) pairs of the ``fewshot`` template; none is a problem of the procedural code task."""


def _reference(row: Mapping[str, Any]) -> str:
    if "tests" not in row:
        raise RowError("missing_field", "missing field(s) ['tests'] (the code domain grades with unit tests)")
    try:
        return code_reference(row)
    except ValueError as e:
        raise RowError("bad_tests", str(e)) from None


def _tests(reference: str) -> list[str]:
    tests = json.loads(reference)["tests"]
    return [tests] if isinstance(tests, str) else list(tests)


def _flags(response: str, problem: str, reference: str) -> dict[str, bool]:
    return code_monitor.program_flags(code_monitor.extract_program(response), _tests(reference))


def _quick(response: str, reference: str) -> tuple[float, str] | None:
    """No code block: 0 without a round trip to a worker (the extraction is linear in the response)."""
    program = code_monitor.extract_program(response)
    return (0.0, verifier.NO_ANSWER) if not program or not program.strip() else None


def _settings(reward: Any) -> dict[str, Any]:
    return {
        "partial_credit": reward.partial_credit,
        "timeout_s": reward.timeout_s,
        "test_timeout_s": reward.test_timeout_s,
        "memory_mb": reward.sandbox_memory_mb,
        "holdout_tests": reward.holdout_tests,
        "allow_weak_sandbox": reward.allow_weak_sandbox,
        "success_threshold": reward.success_threshold,
    }


CODE = DOMAINS.register(
    "code",
    Domain(
        verify_fn="graft.reward.code:verify_code",
        instruction=INSTRUCTION,
        fewshot=FEWSHOT_EXAMPLES,
        reference_fields=("tests", "entry_point"),
        flags=(*code_monitor.CODE_FLAGS, HOLDOUT_FAIL),
        status_flags=(HOLDOUT_FAIL,),
        flag_fn=_flags,
        quick=_quick,
        make_reference=_reference,
        settings_from=_settings,
        keeps_lines=True,
        start=describe_isolation,
    ),
)
